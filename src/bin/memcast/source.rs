//! Reading a trace file for the core, piece by piece: a reader thread reads
//! the file and, when it is gzip, inflates it ([`memcast::trace::Gunzip`]),
//! while the main thread parses what it sends. The file is never held whole,
//! and on two cores decompression overlaps parsing.

use std::fs::File;
use std::io::Read as _;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use anyhow::Context as _;
use memcast::trace::{self, Gunzip, TraceError, TraceSource, MAX_DECOMPRESSED_BYTES};

/// Bytes read from the file at a time.
const READ_BYTES: usize = 4 << 20;

/// Pieces in flight between the threads (each ≤ 4 MiB, or about 1 MiB of
/// inflated text).
const IN_FLIGHT: usize = 4;

type Piece = Result<Vec<u8>, TraceError>;

/// A trace file being read by a background thread.
pub struct FileSource {
    pieces: Receiver<Piece>,
    current: Vec<u8>,
    reader: Option<JoinHandle<()>>,
}

impl FileSource {
    /// Opens `path` and starts reading it.
    pub fn open(path: &Path) -> anyhow::Result<FileSource> {
        let file = File::open(path).with_context(|| format!("failed to read trace {path:?}"))?;
        let (send, pieces) = mpsc::sync_channel(IN_FLIGHT);
        let reader = std::thread::Builder::new()
            .name("trace-reader".into())
            .spawn(move || read_file(file, &send))
            .context("cannot start the thread that reads the trace")?;
        Ok(FileSource {
            pieces,
            current: Vec::new(),
            reader: Some(reader),
        })
    }
}

impl TraceSource for FileSource {
    fn size_hint(&self) -> Option<u64> {
        // The pieces are inflated text, not the file's bytes: no total.
        None
    }

    fn next_chunk(&mut self) -> Result<Option<&[u8]>, TraceError> {
        match self.pieces.recv() {
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
