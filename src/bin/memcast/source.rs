//! Reading a trace file for the core, piece by piece: a reader thread reads
//! the file and, when it is gzip, inflates it ([`memcast::trace::Gunzip`]),
//! while the main thread parses what it sends. The file is never held whole,
//! and on two cores decompression overlaps parsing.
//!
//! A large plain JSON file is instead split in two at a boundary between two
//! events and both halves are parsed at once, one per thread
//! ([`TraceReader::continuing`]); if the guessed boundary is not one, the
//! file is read the ordinary way.

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use anyhow::Context as _;
use memcast::trace::{
    self, Gunzip, Trace, TraceError, TracePart, TraceReader, TraceSource, MAX_DECOMPRESSED_BYTES,
};
use memcast::Warned;

/// Plain JSON files from this size on are parsed in two halves at once.
const SPLIT_FROM_BYTES: u64 = 32 << 20;

/// Bytes around the middle searched for a boundary between two events.
const SPLIT_WINDOW: usize = 1 << 20;

/// Bytes read from the file at a time.
const READ_BYTES: usize = 4 << 20;

/// Pieces in flight between the threads (each ≤ 4 MiB, or about 1 MiB of
/// inflated text).
const IN_FLIGHT: usize = 4;

type Piece = Result<Vec<u8>, TraceError>;

/// A trace file, read by a background thread once the core asks for pieces.
pub struct FileSource {
    path: PathBuf,
    file: Option<File>,
    pieces: Option<Receiver<Piece>>,
    current: Vec<u8>,
    reader: Option<JoinHandle<()>>,
}

impl FileSource {
    /// Opens `path`.
    pub fn open(path: &Path) -> anyhow::Result<FileSource> {
        let file = File::open(path).with_context(|| format!("failed to read trace {path:?}"))?;
        Ok(FileSource {
            path: path.to_owned(),
            file: Some(file),
            pieces: None,
            current: Vec::new(),
            reader: None,
        })
    }

    /// Starts the reader thread (once).
    fn start(&mut self) -> Result<&Receiver<Piece>, TraceError> {
        if self.pieces.is_none() {
            let mut file = self
                .file
                .take()
                .ok_or_else(|| TraceError::Read("the file was already read".into()))?;
            file.seek(SeekFrom::Start(0))
                .map_err(|err| TraceError::Read(err.to_string()))?;
            let (send, pieces) = mpsc::sync_channel(IN_FLIGHT);
            let reader = std::thread::Builder::new()
                .name("trace-reader".into())
                .spawn(move || read_file(file, &send))
                .map_err(|err| TraceError::Read(format!("cannot start a thread: {err}")))?;
            self.pieces = Some(pieces);
            self.reader = Some(reader);
        }
        self.pieces
            .as_ref()
            .ok_or_else(|| TraceError::Read("no reader".into()))
    }
}

impl TraceSource for FileSource {
    fn size_hint(&self) -> Option<u64> {
        // The pieces are inflated text, not the file's bytes: no total.
        None
    }

    fn parsed(&mut self) -> Option<Result<Warned<Trace>, TraceError>> {
        let file = self.file.as_mut()?;
        read_split(file, &self.path)
    }

    fn next_chunk(&mut self) -> Result<Option<&[u8]>, TraceError> {
        let next = self.start()?.recv();
        match next {
            Ok(Ok(piece)) => {
                self.current = piece;
                Ok(Some(&self.current))
            }
            Ok(Err(err)) => Err(err),
            Err(_) => {
                // The reader finished and hung up.
                if let Some(reader) = self.reader.take() {
                    if reader.join().is_err() {
                        return Err(TraceError::Read("the reader thread stopped".into()));
                    }
                }
                Ok(None)
            }
        }
    }
}

/// Reads a large plain JSON file in two halves at once; `None` when the file
/// is small, gzip, on one core, or has no usable boundary near its middle.
fn read_split(file: &mut File, path: &Path) -> Option<Result<Warned<Trace>, TraceError>> {
    let size = file.metadata().ok()?.len();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if size < SPLIT_FROM_BYTES || cores < 2 {
        return None;
    }
    let mut head = vec![0_u8; 64];
    let n = fill(file, &mut head).ok()?;
    let head = head.get(..n)?;
    if trace::is_gzip(head) {
        return None;
    }
    let bare = trace::is_bare_list(head)?;
    let middle = size / 2;
    file.seek(SeekFrom::Start(middle)).ok()?;
    let mut window = vec![0_u8; SPLIT_WINDOW];
    let n = fill(file, &mut window).ok()?;
    let split = trace::split_candidate(window.get(..n)?, middle)?;
    let (head, tail) = std::thread::scope(|scope| {
        let head = scope.spawn(|| {
            let mut reader = TraceReader::new(MAX_DECOMPRESSED_BYTES);
            read_range(path, 0, split, &mut reader).ok()?;
            reader.finish_head()
        });
        let mut reader = TraceReader::continuing(bare);
        let tail = read_range(path, split, size, &mut reader).and_then(|()| reader.finish_tail());
        (head.join().ok().flatten(), tail)
    });
    // Anything but two good halves: read the file the ordinary way, which
    // also places any error in the whole file.
    Some(TracePart::join(head?, tail.ok()?))
}

/// Pushes bytes `[from, to)` of the file at `path` into `reader`.
fn read_range(path: &Path, from: u64, to: u64, reader: &mut TraceReader) -> Result<(), TraceError> {
    let read_error = |err: std::io::Error| TraceError::Read(err.to_string());
    let mut file = File::open(path).map_err(read_error)?;
    file.seek(SeekFrom::Start(from)).map_err(read_error)?;
    let mut left = to.saturating_sub(from);
    let mut buf = vec![0_u8; READ_BYTES];
    while left > 0 {
        let want = usize::try_from(left).map_or(READ_BYTES, |l| l.min(READ_BYTES));
        let piece = buf.get_mut(..want).unwrap_or_default();
        let n = fill(&mut file, piece).map_err(read_error)?;
        if n == 0 {
            break;
        }
        reader.push(piece.get(..n).unwrap_or_default())?;
        left -= n as u64;
    }
    Ok(())
}

/// The reader thread: sends the file's text in pieces, inflating gzip.
/// It stops quietly when the receiving side is gone.
fn read_file(mut file: File, send: &SyncSender<Piece>) {
    let mut gunzip: Option<Gunzip> = None;
    let mut first = true;
    loop {
        let mut buf = vec![0_u8; READ_BYTES];
        let n = match fill(&mut file, &mut buf) {
            Ok(n) => n,
            Err(err) => {
                let _ = send.send(Err(TraceError::Read(err.to_string())));
                return;
            }
        };
        if n == 0 {
            break;
        }
        buf.truncate(n);
        if first {
            first = false;
            if trace::is_gzip(&buf) {
                gunzip = Some(Gunzip::new(MAX_DECOMPRESSED_BYTES));
            }
        }
        let sent = match &mut gunzip {
            Some(gunzip) => gunzip.push(&buf, &mut |text| forward(send, text)),
            None => send
                .send(Ok(buf))
                .map_err(|_| TraceError::Read("stopped".into())),
        };
        if let Err(err) = sent {
            let _ = send.send(Err(err));
            return;
        }
    }
    if let Some(gunzip) = gunzip {
        if let Err(err) = gunzip.finish(&mut |text| forward(send, text)) {
            let _ = send.send(Err(err));
        }
    }
}

fn forward(send: &SyncSender<Piece>, text: &[u8]) -> Result<(), TraceError> {
    send.send(Ok(text.to_vec()))
        .map_err(|_| TraceError::Read("stopped".into()))
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn fill(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(buf.get_mut(filled..).unwrap_or_default()) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(filled)
}

/// Runs simulations on up to as many threads as the machine has cores.
pub struct Threads;

impl memcast::Parallel for Threads {
    fn run_all<'a>(
        &self,
        jobs: Vec<memcast::SimulationJob<'a>>,
        simulated: &mut dyn FnMut(u64),
    ) -> Vec<memcast::report::SimulatedRun> {
        let cores = cores();
        if cores < 2 || jobs.len() < 2 {
            return memcast::InTurn.run_all(jobs, simulated);
        }
        // This thread and `cores - 1` helpers take the jobs in order as
        // they free up (a job may wait for one before it: that one has
        // started); collect in order.
        let n = jobs.len();
        let queue = std::sync::Mutex::new(jobs.into_iter().enumerate());
        let next = || queue.lock().ok().and_then(|mut q| q.next());
        // The jobs count the events they simulated here; this thread
        // passes the sum on while it waits.
        let events = std::sync::atomic::AtomicU64::new(0);
        // Takes jobs until none is left, adding each one's events to the
        // count and telling `count` the sum.
        let take_jobs = |count: &mut dyn FnMut(u64)| {
            let mut finished = Vec::new();
            while let Some((index, job)) = next() {
                let mut tick = |k: u64| {
                    count(events.fetch_add(k, std::sync::atomic::Ordering::Relaxed) + k);
                };
                finished.push((index, job(&mut tick)));
            }
            finished
        };
        let mut done: Vec<(usize, memcast::report::SimulatedRun)> = std::thread::scope(|scope| {
            let events = &events;
            let take_jobs = &take_jobs;
            // Each helper says when it has run out of jobs, so the last one
            // is heard at once rather than at the next poll.
            let (ended, ends) = std::sync::mpsc::channel::<()>();
            let helpers = cores.min(n) - 1;
            let handles: Vec<_> = (0..helpers)
                .map(|_| {
                    let ended = ended.clone();
                    scope.spawn(move || {
                        let finished = take_jobs(&mut |_| {});
                        let _ = ended.send(());
                        finished
                    })
                })
                .collect();
            drop(ended);
            // This thread takes jobs too (the first: a job's memory is
            // then this thread's, as when it ran alone), passing the count
            // on as it goes; then it waits for the helpers.
            let mut finished = take_jobs(simulated);
            let mut running = helpers;
            while running > 0 {
                match ends.recv_timeout(std::time::Duration::from_millis(20)) {
                    Ok(()) => running -= 1,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    // A helper that panicked never says so.
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                }
                simulated(events.load(std::sync::atomic::Ordering::Relaxed));
            }
            finished.extend(
                handles
                    .into_iter()
                    .flat_map(|handle| handle.join().unwrap_or_default()),
            );
            finished
        });
        done.sort_by_key(|(index, _)| *index);
        debug_assert_eq!(done.len(), n);
        simulated(events.load(std::sync::atomic::Ordering::Relaxed));
        done.into_iter().map(|(_, run)| run).collect()
    }

    /// Each free thread, this one included, takes the next task in order,
    /// so tasks of unequal size keep every core busy; `done` is told on
    /// this thread as it finishes each of its own.
    fn run_tasks<'a>(&self, tasks: Vec<memcast::Task<'a>>, done: &mut dyn FnMut(usize)) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cores = cores();
        if cores < 2 || tasks.len() < 2 {
            memcast::InTurn.run_tasks(tasks, done);
            return;
        }
        let helpers = cores.min(tasks.len()) - 1;
        let queue = std::sync::Mutex::new(tasks.into_iter());
        let finished = AtomicUsize::new(0);
        let next = || queue.lock().ok().and_then(|mut q| q.next());
        std::thread::scope(|scope| {
            for _ in 0..helpers {
                scope.spawn(|| {
                    while let Some(task) = next() {
                        task();
                        finished.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            while let Some(task) = next() {
                task();
                done(finished.fetch_add(1, Ordering::Relaxed) + 1);
            }
        });
        done(finished.load(Ordering::Relaxed));
    }
}

/// The machine's cores (1 where it cannot tell).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Estimates one trace, or several of one job at different sequence lengths
/// (read in turn, then rebuilt at the configured length).
pub fn estimate_files(
    paths: &[std::path::PathBuf],
    config: &memcast::Config,
) -> anyhow::Result<memcast::report::Report> {
    let what = || {
        paths
            .iter()
            .map(|p| format!("{p:?}"))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    if let [path] = paths {
        let mut source = FileSource::open(path)?;
        return Ok(
            memcast::run_from(&mut source, config, &mut |_| {}, &Threads)
                .with_context(|| format!("failed to estimate {}", what()))?
                .value,
        );
    }
    let mut sources = paths
        .iter()
        .map(|p| FileSource::open(p))
        .collect::<anyhow::Result<Vec<FileSource>>>()?;
    let mut dyns: Vec<&mut dyn TraceSource> = sources
        .iter_mut()
        .map(|s| s as &mut dyn TraceSource)
        .collect();
    let prepared = memcast::pipeline::prepare_many_with(&mut dyns, config, &mut |_| {}, &Threads)
        .with_context(|| format!("failed to estimate {}", what()))?;
    Ok(
        memcast::estimate_with(&prepared, config, &mut |_| {}, &Threads)
            .with_context(|| format!("failed to estimate {}", what()))?
            .value,
    )
}
