//! The push side of the trace reader: the file arrives in pieces of any size
//! (slices of a browser `Blob`, reads of a file, output of the gzip decoder)
//! and is reduced to typed events as it arrives, so neither the file nor its
//! decompressed text is ever held whole.
//!
//! - [`Gunzip`] inflates gzip members piece by piece, refusing output past a
//!   limit.
//! - [`JsonStream`] walks the top level of the trace object by hand and hands
//!   each complete entry of `traceEvents` (and each header value) to serde,
//!   borrowing it from the piece it arrived in. An entry cut by the end of a
//!   piece is kept (only that entry) and completed from the next piece.
//! - [`TraceReader`] puts the two together behind one `push`/`finish` pair.
//!
//! A piece boundary may fall anywhere, even inside a number or a UTF-8
//! character: a value is only taken as complete when a byte follows it in the
//! same buffer (or the input has ended), and a parse error close to the end of
//! the buffer is only believed once more bytes do not cure it.
//!
//! Long file: the push reader is one state machine (gzip, the top level of
//! the document, events cut across pieces, the two-half split) whose states
//! share private helpers; about a third of the file is its tests.

use std::io::Write as _;

use serde::de::{Deserialize, IgnoredAny};

use super::build::Builder;
use super::loose::{CountSeq, LooseDistributed, LooseInt, LooseStr};
use super::raw::Entry;
use super::{Trace, TraceError};
use crate::diag::Warned;

/// The two magic bytes that open every gzip member.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The UTF-8 byte-order mark some editors write in front of JSON.
const BOM: &[u8] = b"\xef\xbb\xbf";

/// Bytes appended at least each time a cut entry is retried.
const MIN_BRIDGE: usize = 4 << 10;

/// A parse error this close to the end of the buffer may be the cut itself
/// (half a number, half a UTF-8 character): wait for more bytes.
const CUT_MARGIN: usize = 8;

/// Compressed bytes handed to the inflater at a time, which bounds what one
/// call can expand to (deflate expands at most ~1,032 times).
const INFLATE_PIECE: usize = 8 << 10;

/// Decompressed bytes gathered before they are passed on.
const INFLATE_BATCH: usize = 1 << 20;

/// Whether a file starts like gzip (its first two bytes).
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&GZIP_MAGIC)
}

/// Whether plain JSON text that starts with `head` is a bare list of events
/// (Chrome's array format) rather than a trace object: its first byte after
/// a byte-order mark and whitespace is `[`. `None` when `head` has no such
/// byte yet.
pub fn is_bare_list(head: &[u8]) -> Option<bool> {
    let text = head.strip_prefix(BOM).unwrap_or(head);
    let first = text.iter().find(|b| !b.is_ascii_whitespace())?;
    Some(*first == b'[')
}

// ---------------------------------------------------------------------------
// gzip

/// Where the decoder writes: a batch of output and the running total.
struct Inflated {
    batch: Vec<u8>,
    total: u64,
    limit: u64,
    over_limit: bool,
}

impl std::io::Write for Inflated {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let total = self.total.saturating_add(buf.len() as u64);
        if total > self.limit {
            self.over_limit = true;
            return Err(std::io::Error::other("decompressed size limit"));
        }
        self.total = total;
        self.batch.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A push-based decoder of (possibly multi-member) gzip data.
///
/// Output comes out in batches of about 1 MiB through the callback of
/// [`Gunzip::push`] and [`Gunzip::finish`]; more than `limit` bytes of output
/// is refused as [`TraceError::GzipTooLarge`] (a "gzip bomb" of a few MB can
/// expand to many GB).
pub struct Gunzip {
    decoder: flate2::write::MultiGzDecoder<Inflated>,
}

impl Gunzip {
    /// A decoder that refuses to produce more than `limit` bytes.
    pub fn new(limit: u64) -> Gunzip {
        Gunzip {
            decoder: flate2::write::MultiGzDecoder::new(Inflated {
                batch: Vec::with_capacity(INFLATE_BATCH + (64 << 10)),
                total: 0,
                limit,
                over_limit: false,
            }),
        }
    }

    /// Decompresses the next piece of the file.
    pub fn push(
        &mut self,
        compressed: &[u8],
        out: &mut dyn FnMut(&[u8]) -> Result<(), TraceError>,
    ) -> Result<(), TraceError> {
        for piece in compressed.chunks(INFLATE_PIECE) {
            if let Err(err) = self.decoder.write_all(piece) {
                return Err(self.error(&err));
            }
            if self.decoder.get_ref().batch.len() >= INFLATE_BATCH {
                self.flush(out)?;
            }
        }
        Ok(())
    }

    /// Ends the input: checks that the last member is complete and passes on
    /// what is left of the output.
    pub fn finish(
        mut self,
        out: &mut dyn FnMut(&[u8]) -> Result<(), TraceError>,
    ) -> Result<(), TraceError> {
        if let Err(err) = self.decoder.try_finish() {
            return Err(if self.decoder.get_ref().over_limit {
                self.error(&err)
            } else {
                // The data ended before the member's end and checksum.
                TraceError::TruncatedGzip
            });
        }
        self.flush(out)
    }

    fn flush(
        &mut self,
        out: &mut dyn FnMut(&[u8]) -> Result<(), TraceError>,
    ) -> Result<(), TraceError> {
        let sink = self.decoder.get_mut();
        if !sink.batch.is_empty() {
            let result = out(&sink.batch);
            sink.batch.clear();
            result?;
        }
        Ok(())
    }

    fn error(&self, err: &std::io::Error) -> TraceError {
        let sink = self.decoder.get_ref();
        if sink.over_limit {
            TraceError::GzipTooLarge { limit: sink.limit }
        } else if err.kind() == std::io::ErrorKind::UnexpectedEof {
            TraceError::TruncatedGzip
        } else {
            TraceError::CorruptGzip(err.to_string())
        }
    }
}

// ---------------------------------------------------------------------------
// JSON

/// What a file that is not JSON starts with, for its error: printable text
/// quoted, else "binary data" with its first bytes in hex and, for a few
/// common formats, their name (never the raw bytes, which show as garbage).
fn describe_start(bytes: &[u8]) -> String {
    let head = bytes.get(..24).unwrap_or(bytes);
    if let Ok(text) = std::str::from_utf8(head) {
        if text
            .chars()
            .all(|c| !c.is_control() || c == '\n' || c == '\t' || c == '\r')
        {
            return format!("a file starting {:?}", text.trim_end());
        }
    }
    let known = [
        (&b"\x89PNG"[..], "a PNG image"),
        (
            b"PK\x03\x04",
            "a ZIP archive (a torch.save checkpoint is one)",
        ),
        (b"%PDF", "a PDF document"),
        (b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
        (b"BZh", "bzip2-compressed data"),
        (b"\xfd7zXZ", "xz-compressed data"),
        (
            b"\x80\x02",
            "a Python pickle, such as a CUDA memory snapshot (not a profiler trace)",
        ),
        (
            b"\x80\x04",
            "a Python pickle, such as a CUDA memory snapshot (not a profiler trace)",
        ),
        (
            b"\x80\x05",
            "a Python pickle, such as a CUDA memory snapshot (not a profiler trace)",
        ),
    ];
    let kind = known
        .iter()
        .find(|(magic, _)| bytes.starts_with(magic))
        .map_or("binary data", |(_, name)| name);
    let hex: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{kind} (its first bytes: {} …)", hex.join(" "))
}

/// A top-level key of the trace object the reader acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopKey {
    TraceEvents,
    SchemaVersion,
    WithStack,
    ProfileMemory,
    RecordShapes,
    BaseTime,
    TraceName,
    DeviceProperties,
    DistributedInfo,
    Capture,
    Other,
}

fn classify_top_key(key: &str) -> TopKey {
    match key {
        "traceEvents" => TopKey::TraceEvents,
        "schemaVersion" => TopKey::SchemaVersion,
        "with_stack" => TopKey::WithStack,
        "profile_memory" => TopKey::ProfileMemory,
        "record_shapes" => TopKey::RecordShapes,
        "baseTimeNanoseconds" => TopKey::BaseTime,
        "traceName" => TopKey::TraceName,
        "deviceProperties" => TopKey::DeviceProperties,
        "distributedInfo" => TopKey::DistributedInfo,
        "memcast" => TopKey::Capture,
        _ => TopKey::Other,
    }
}

/// Where the reader is in the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the first byte that is not whitespace or a byte-order mark.
    Start,
    /// In the top-level object, before a key; `first` until one was read.
    Key { first: bool },
    /// After a key and its colon, before the value.
    Value(TopKey),
    /// After a top-level value, before `,` or `}`.
    AfterValue,
    /// In the event list, before an entry; `first` until one was read.
    /// `bare`: the list is the whole document (Chrome's array format).
    Entry { first: bool, bare: bool },
    /// After an entry, before `,` or `]`.
    AfterEntry { bare: bool },
    /// After the document: only whitespace may follow.
    End,
}

/// The outcome of one step on a buffer.
enum Step {
    /// This many bytes were used; go on.
    Used(usize),
    /// The buffer ends before the next item does.
    NeedMore,
}

/// One value read from the front of a buffer.
enum Parsed<T> {
    Done(T, usize),
    NeedMore,
}

/// A push parser of trace JSON.
pub(super) struct JsonStream {
    builder: Builder,
    state: State,
    /// Bytes received but not used yet: the front of a cut item.
    pending: Vec<u8>,
    /// Do not retry `pending` before it holds this many bytes (doubling
    /// keeps a large cut value linear in its size).
    retry_len: usize,
    /// Bytes used so far, and the line (1-based) and column (0-based) at
    /// which the next unused byte sits, for error positions.
    used: u64,
    line: usize,
    column: usize,
    /// Entries the fast path ([`super::plain`]) read, for the tests.
    #[cfg(test)]
    n_plain: usize,
}

impl JsonStream {
    pub(super) fn new() -> JsonStream {
        JsonStream {
            builder: Builder::default(),
            state: State::Start,
            pending: Vec::new(),
            retry_len: 0,
            used: 0,
            line: 1,
            column: 0,
            #[cfg(test)]
            n_plain: 0,
        }
    }

    /// Reads the next piece of JSON text.
    pub(super) fn push(&mut self, chunk: &[u8]) -> Result<(), TraceError> {
        if self.pending.is_empty() {
            let used = self.process(chunk, false)?;
            self.keep(chunk.get(used..).unwrap_or_default());
            return Ok(());
        }
        // Complete the cut item from the front of `chunk`, then read the
        // rest of `chunk` where it lies.
        let mut taken = 0;
        while taken < chunk.len() {
            let want = self
                .retry_len
                .saturating_sub(self.pending.len())
                .max(MIN_BRIDGE);
            let end = taken.saturating_add(want).min(chunk.len());
            let before = self.pending.len() - taken;
            self.pending
                .extend_from_slice(chunk.get(taken..end).unwrap_or_default());
            taken = end;
            if self.pending.len() < self.retry_len {
                // Too little new since the last try: wait for more.
                return Ok(());
            }
            let pending = std::mem::take(&mut self.pending);
            let used = self.process(&pending, false)?;
            if used >= before {
                // Past the old front: the rest is `chunk` from here.
                let resume = used - before;
                let rest = chunk.get(resume..).unwrap_or_default();
                let used = self.process(rest, false)?;
                self.keep(rest.get(used..).unwrap_or_default());
                return Ok(());
            }
            self.pending = pending;
            self.pending.drain(..used);
            self.retry_len = self.pending.len().saturating_mul(2);
        }
        Ok(())
    }

    /// Ends the input and returns the trace.
    pub(super) fn finish(self) -> Result<Warned<Trace>, TraceError> {
        self.end()?.finish()
    }

    /// Ends the input: checks that the document is whole and returns what
    /// was read, not yet finished into a trace.
    fn end(mut self) -> Result<Builder, TraceError> {
        let pending = std::mem::take(&mut self.pending);
        let used = self.process(&pending, true)?;
        let rest = pending.get(used..).unwrap_or_default();
        if self.state == State::Start {
            return Err(TraceError::Empty);
        }
        if self.state != State::End || rest.iter().any(|b| !b.is_ascii_whitespace()) {
            self.advance(rest);
            return Err(TraceError::Truncated {
                line: self.line,
                column: self.column + 1,
            });
        }
        Ok(self.builder)
    }

    /// A parser for a part of a plain JSON trace that starts with an entry of
    /// the event list (just after a `,` between two entries); `bare` when
    /// the list is the whole document.
    fn continuing(bare: bool) -> JsonStream {
        let mut json = JsonStream::new();
        json.builder.saw_trace_events = true;
        json.state = State::Entry { first: false, bare };
        // Not the file's start: no byte-order mark to look for.
        json.used = 1;
        json
    }

    /// Ends a part that stops just after a `,` between two entries: what it
    /// read, or `None` when the part does not end there.
    fn finish_head(mut self) -> Option<Builder> {
        let pending = std::mem::take(&mut self.pending);
        let used = self.process(&pending, false).ok()?;
        let rest = pending.get(used..).unwrap_or_default();
        let at_boundary = matches!(self.state, State::Entry { first: false, .. })
            && rest.iter().all(u8::is_ascii_whitespace);
        at_boundary.then_some(self.builder)
    }

    /// Keeps the unused tail of a buffer for the next piece.
    fn keep(&mut self, tail: &[u8]) {
        self.pending.clear();
        self.pending.extend_from_slice(tail);
        self.retry_len = tail.len().saturating_mul(2);
    }

    /// Counts the bytes used, keeping the line and column.
    fn advance(&mut self, used: &[u8]) {
        self.used += used.len() as u64;
        let newlines = count_newlines(used);
        if newlines == 0 {
            self.column += used.len();
        } else {
            self.line += newlines;
            let last = memchr::memrchr(b'\n', used).unwrap_or(0);
            self.column = used.len() - last - 1;
        }
    }

    /// Reads as many whole items from `buf` as it holds; returns the bytes used.
    fn process(&mut self, buf: &[u8], at_end: bool) -> Result<usize, TraceError> {
        let mut pos = 0;
        loop {
            let step = self.step(buf, pos, at_end).map_err(|err| match err {
                StepError::Trace(err) => err,
                StepError::Json { at, err } => self.json_error(&err, buf, pos + at),
                StepError::Syntax { at, message } => {
                    let (line, column) = self.position(buf, pos + at);
                    TraceError::InvalidJson {
                        line,
                        column: column + 1,
                        message: message.to_owned(),
                    }
                }
            })?;
            match step {
                Step::Used(n) if n > 0 => pos += n,
                Step::Used(_) | Step::NeedMore => break,
            }
        }
        self.advance(buf.get(..pos).unwrap_or_default());
        Ok(pos)
    }

    /// Takes one item (or whitespace) from `buf[pos..]`.
    fn step(&mut self, buf: &[u8], pos: usize, at_end: bool) -> Result<Step, StepError> {
        let rest = buf.get(pos..).unwrap_or_default();
        if self.state == State::Start && self.used == 0 && pos == 0 {
            if rest.starts_with(BOM) {
                return Ok(Step::Used(BOM.len()));
            }
            if !at_end && BOM.starts_with(rest) && !rest.is_empty() {
                return Ok(Step::NeedMore);
            }
        }
        let ws = rest
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(rest.len());
        let Some(&next) = rest.get(ws) else {
            return Ok(if ws > 0 {
                Step::Used(ws)
            } else {
                Step::NeedMore
            });
        };
        let item = rest.get(ws..).unwrap_or_default();
        let used = match self.state {
            State::Start => match next {
                b'{' => {
                    self.state = State::Key { first: true };
                    1
                }
                b'[' => {
                    self.builder.saw_trace_events = true;
                    self.state = State::Entry {
                        first: true,
                        bare: true,
                    };
                    1
                }
                _ => {
                    return Err(StepError::Trace(TraceError::NotJson(describe_start(rest))));
                }
            },
            State::Key { first } => {
                if first && next == b'}' {
                    self.state = State::End;
                    1
                } else if next != b'"' {
                    return Err(StepError::Syntax {
                        at: ws,
                        message: "expected a key (a string) in the trace object",
                    });
                } else {
                    let Parsed::Done(key, n) =
                        parse_value::<LooseStr>(item, at_end).map_err(json_at(ws))?
                    else {
                        return Ok(Step::NeedMore);
                    };
                    let after = item.get(n..).unwrap_or_default();
                    let colon = after
                        .iter()
                        .position(|b| !b.is_ascii_whitespace())
                        .unwrap_or(after.len());
                    match after.get(colon) {
                        Some(b':') => {}
                        Some(_) => {
                            return Err(StepError::Syntax {
                                at: ws + n + colon,
                                message: "expected `:` after an object key",
                            })
                        }
                        None => return Ok(Step::NeedMore),
                    }
                    let key = key.0.unwrap_or_default();
                    let top = classify_top_key(&key);
                    if top == TopKey::Other && self.builder.top_keys.len() < 8 {
                        self.builder.top_keys.push(key.into_owned());
                    }
                    self.state = State::Value(top);
                    n + colon + 1
                }
            }
            State::Value(TopKey::TraceEvents) => {
                if next != b'[' {
                    return Err(StepError::Trace(TraceError::NotAProfilerTrace(format!(
                        "\"traceEvents\" starting with {:?} instead of a list of trace events",
                        char::from(next)
                    ))));
                }
                self.builder.saw_trace_events = true;
                self.state = State::Entry {
                    first: true,
                    bare: false,
                };
                1
            }
            State::Value(key) => {
                let Some(n) = self.header_value(key, item, at_end).map_err(json_at(ws))? else {
                    return Ok(Step::NeedMore);
                };
                self.state = State::AfterValue;
                n
            }
            State::AfterValue => match next {
                b',' => {
                    self.state = State::Key { first: false };
                    1
                }
                b'}' => {
                    self.state = State::End;
                    1
                }
                _ => {
                    return Err(StepError::Syntax {
                        at: ws,
                        message: "expected `,` or `}` after a value of the trace object",
                    })
                }
            },
            State::Entry { first, bare } => {
                if first && next == b']' {
                    self.state = if bare { State::End } else { State::AfterValue };
                    1
                } else {
                    // The fast path for plain entries; serde for the rest
                    // (and for an entry that may continue in the next piece).
                    let plain =
                        super::plain::entry(item).filter(|(_, n)| *n < item.len() || at_end);
                    let (entry, n) = match plain {
                        Some(read) => {
                            #[cfg(test)]
                            {
                                self.n_plain += 1;
                            }
                            read
                        }
                        None => match parse_value::<Entry>(item, at_end).map_err(json_at(ws))? {
                            Parsed::Done(entry, n) => (entry, n),
                            Parsed::NeedMore => return Ok(Step::NeedMore),
                        },
                    };
                    match entry {
                        Entry::Event(ev) => self.builder.add_event(ev),
                        Entry::Malformed => self.builder.add_malformed(),
                    }
                    self.state = State::AfterEntry { bare };
                    n
                }
            }
            State::AfterEntry { bare } => match next {
                b',' => {
                    self.state = State::Entry { first: false, bare };
                    1
                }
                b']' => {
                    self.state = if bare { State::End } else { State::AfterValue };
                    1
                }
                _ => {
                    return Err(StepError::Syntax {
                        at: ws,
                        message: "expected `,` or `]` after a trace event",
                    })
                }
            },
            State::End => {
                return Err(StepError::Syntax {
                    at: ws,
                    message: "trailing characters after the trace object",
                })
            }
        };
        Ok(Step::Used(ws + used))
    }

    /// Reads one header value into the trace; `None` when it is cut.
    fn header_value(
        &mut self,
        key: TopKey,
        item: &[u8],
        at_end: bool,
    ) -> Result<Option<usize>, serde_json::Error> {
        let header = &mut self.builder.trace.header;
        let flag = |v: Option<i64>| v.map(|v| v != 0);
        let n = match key {
            TopKey::SchemaVersion => {
                parse_value::<LooseInt>(item, at_end)?.map(|v| header.schema_version = v.0)
            }
            TopKey::WithStack => {
                parse_value::<LooseInt>(item, at_end)?.map(|v| header.with_stack = flag(v.0))
            }
            TopKey::ProfileMemory => {
                parse_value::<LooseInt>(item, at_end)?.map(|v| header.profile_memory = flag(v.0))
            }
            TopKey::RecordShapes => {
                parse_value::<LooseInt>(item, at_end)?.map(|v| header.record_shapes = flag(v.0))
            }
            TopKey::BaseTime => {
                parse_value::<LooseInt>(item, at_end)?.map(|v| header.base_time_ns = v.0)
            }
            TopKey::TraceName => parse_value::<LooseStr>(item, at_end)?
                .map(|v| header.trace_name = v.0.map(std::borrow::Cow::into_owned)),
            TopKey::DeviceProperties => {
                parse_value::<CountSeq>(item, at_end)?.map(|v| header.n_gpu_devices = v.0)
            }
            TopKey::DistributedInfo => {
                parse_value::<LooseDistributed>(item, at_end)?.map(|v| header.distributed = v.0)
            }
            TopKey::Capture => parse_value::<super::capture::LooseCapture>(item, at_end)?
                .map(|v| header.capture = v.0.map(Box::new)),
            TopKey::TraceEvents | TopKey::Other => {
                parse_value::<IgnoredAny>(item, at_end)?.map(|_| ())
            }
        };
        Ok(match n {
            Parsed::Done((), n) => Some(n),
            Parsed::NeedMore => None,
        })
    }

    /// The line (1-based) and column (0-based) of `buf[at]` in the whole input.
    fn position(&self, buf: &[u8], at: usize) -> (usize, usize) {
        let before = buf.get(..at).unwrap_or(buf);
        let newlines = count_newlines(before);
        if newlines == 0 {
            (self.line, self.column + before.len())
        } else {
            let last = memchr::memrchr(b'\n', before).unwrap_or(0);
            (self.line + newlines, before.len() - last - 1)
        }
    }

    /// A serde error in a value that starts at `buf[at]`, placed in the whole input.
    fn json_error(&self, err: &serde_json::Error, buf: &[u8], at: usize) -> TraceError {
        let (line, column) = self.position(buf, at);
        let (line, column) = if err.line() <= 1 {
            (line, column + err.column())
        } else {
            (line + err.line() - 1, err.column())
        };
        match err.classify() {
            serde_json::error::Category::Eof => TraceError::Truncated { line, column },
            serde_json::error::Category::Data => TraceError::NotAProfilerTrace(err.to_string()),
            serde_json::error::Category::Syntax | serde_json::error::Category::Io => {
                TraceError::InvalidJson {
                    line,
                    column,
                    message: strip_position(&err.to_string()),
                }
            }
        }
    }
}

impl<T> Parsed<T> {
    fn map(self, f: impl FnOnce(T)) -> Parsed<()> {
        match self {
            Parsed::Done(value, n) => {
                f(value);
                Parsed::Done((), n)
            }
            Parsed::NeedMore => Parsed::NeedMore,
        }
    }
}

/// Wraps a serde error in a value starting `at` bytes into the step.
fn json_at(at: usize) -> impl FnOnce(serde_json::Error) -> StepError {
    move |err| StepError::Json { at, err }
}

/// Why a step failed, with offsets from the start of the step's bytes: a
/// trace error as is, a serde error in the value at `at`, or bad syntax at
/// `at` found by the reader itself.
enum StepError {
    Trace(TraceError),
    Json { at: usize, err: serde_json::Error },
    Syntax { at: usize, message: &'static str },
}

/// serde's message without its own " at line L column C" (the reader puts
/// the position in the whole file in the error instead).
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message.get(..at).unwrap_or(message).to_owned(),
        None => message.to_owned(),
    }
}

/// The newlines in `bytes`. Every byte the reader uses passes here (for
/// error positions), so it must cost little: memchr counts with SIMD on the
/// native targets, but on wasm32 (no SIMD without `simd128`) it finds the
/// newlines one by one, which took a tenth of the page's parse; there, eight
/// bytes are counted at a time in a `u64`.
fn count_newlines(bytes: &[u8]) -> usize {
    #[cfg(target_arch = "wasm32")]
    {
        count_newlines_swar(bytes)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        memchr::memchr_iter(b'\n', bytes).count()
    }
}

/// [`count_newlines`] eight bytes at a time: a byte of `word ^ NEWLINES` is
/// zero where `word` holds a newline, and `!(((x & 0x7f..) + 0x7f..) | x |
/// 0x7f..)` sets the top bit of exactly the zero bytes of `x` (no carry
/// crosses a byte: each sum is at most 0xfe).
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
fn count_newlines_swar(bytes: &[u8]) -> usize {
    const NEWLINES: u64 = 0x0a0a_0a0a_0a0a_0a0a;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let mut words = bytes.chunks_exact(8);
    let mut count = 0usize;
    for word in &mut words {
        let mut le = [0u8; 8];
        le.copy_from_slice(word);
        let x = u64::from_le_bytes(le) ^ NEWLINES;
        let zero_tops = !(((x & LOW7).wrapping_add(LOW7)) | x | LOW7);
        count += zero_tops.count_ones() as usize;
    }
    count + words.remainder().iter().filter(|&&b| b == b'\n').count()
}

/// Reads one JSON value from the front of `item`.
///
/// Unless the input has ended, a value that reaches the end of `item` may
/// continue in the next piece (`12` of `123`), and an error in the last
/// few bytes may be the cut: both are [`Parsed::NeedMore`].
fn parse_value<'a, T: Deserialize<'a>>(
    item: &'a [u8],
    at_end: bool,
) -> Result<Parsed<T>, serde_json::Error> {
    let mut stream = serde_json::Deserializer::from_slice(item).into_iter::<T>();
    match stream.next() {
        None => Ok(Parsed::NeedMore),
        Some(Ok(value)) => {
            let n = stream.byte_offset();
            if n >= item.len() && !at_end {
                Ok(Parsed::NeedMore)
            } else {
                Ok(Parsed::Done(value, n))
            }
        }
        Some(Err(err)) => {
            if at_end {
                return Err(err);
            }
            if err.is_eof() || error_offset(&err, item) + CUT_MARGIN >= item.len() {
                Ok(Parsed::NeedMore)
            } else {
                Err(err)
            }
        }
    }
}

/// The byte offset in `item` of serde's error position (line and column).
fn error_offset(err: &serde_json::Error, item: &[u8]) -> usize {
    let mut offset = 0;
    for _ in 1..err.line() {
        match memchr::memchr(b'\n', item.get(offset..).unwrap_or_default()) {
            Some(at) => offset += at + 1,
            None => return item.len(),
        }
    }
    offset + err.column()
}

// ---------------------------------------------------------------------------
// Both

enum Mode {
    /// Fewer than two bytes seen: gzip or not is not known yet.
    Unknown(Vec<u8>),
    Plain,
    Gzip(Box<Gunzip>),
}

/// A push-based reader of a `.json` or `.json.gz` trace: feed it the file
/// piece by piece with [`TraceReader::push`], then call
/// [`TraceReader::finish`]. Gzip is recognised by its magic bytes.
pub struct TraceReader {
    mode: Mode,
    json: JsonStream,
    limit: u64,
}

impl TraceReader {
    /// A reader refusing gzip input that expands past `max_decompressed_bytes`.
    pub fn new(max_decompressed_bytes: u64) -> TraceReader {
        TraceReader {
            mode: Mode::Unknown(Vec::new()),
            json: JsonStream::new(),
            limit: max_decompressed_bytes,
        }
    }

    /// Reads the next piece of the file.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), TraceError> {
        if let Mode::Unknown(head) = &mut self.mode {
            head.extend_from_slice(bytes);
            if head.len() < GZIP_MAGIC.len() {
                return Ok(());
            }
            let head = std::mem::take(head);
            self.decide(&head);
            return self.feed(&head);
        }
        self.feed(bytes)
    }

    /// Ends the input and returns the trace.
    pub fn finish(mut self) -> Result<Warned<Trace>, TraceError> {
        if let Mode::Unknown(head) = &mut self.mode {
            let head = std::mem::take(head);
            self.decide(&head);
            self.feed(&head)?;
        }
        let mut json = self.json;
        if let Mode::Gzip(gunzip) = self.mode {
            gunzip.finish(&mut |text| json.push(text))?;
        }
        json.finish()
    }

    /// A reader for the second part of a plain (not gzip) JSON trace split in
    /// two at a `,` between two entries of its event list, so that the parts
    /// can be read at once on two threads: push the bytes after the comma,
    /// then call [`TraceReader::finish_tail`]. `bare`: the document is a bare
    /// list of events (it starts with `[`), not a trace object.
    pub fn continuing(bare: bool) -> TraceReader {
        TraceReader {
            mode: Mode::Plain,
            json: JsonStream::continuing(bare),
            limit: 0,
        }
    }

    /// Ends the first part of a split trace (see [`TraceReader::continuing`]):
    /// `None` when its bytes do not end just after a `,` between two entries
    /// of the event list, and the split must not be used.
    pub fn finish_head(self) -> Option<TracePart> {
        match self.mode {
            Mode::Plain => self.json.finish_head().map(|builder| TracePart { builder }),
            Mode::Unknown(_) | Mode::Gzip(_) => None,
        }
    }

    /// Ends the second part of a split trace: an error if the document does
    /// not end well (the error's position counts from the split).
    pub fn finish_tail(self) -> Result<TracePart, TraceError> {
        self.json.end().map(|builder| TracePart { builder })
    }

    fn decide(&mut self, head: &[u8]) {
        self.mode = if is_gzip(head) {
            Mode::Gzip(Box::new(Gunzip::new(self.limit)))
        } else {
            Mode::Plain
        };
    }

    fn feed(&mut self, bytes: &[u8]) -> Result<(), TraceError> {
        let json = &mut self.json;
        match &mut self.mode {
            Mode::Gzip(gunzip) => gunzip.push(bytes, &mut |text| json.push(text)),
            Mode::Plain | Mode::Unknown(_) => json.push(bytes),
        }
    }
}

/// What one part of a split trace read (see [`TraceReader::continuing`]).
pub struct TracePart {
    builder: Builder,
}

impl TracePart {
    /// The trace of the whole file from its two parts, as one reader would
    /// have read it.
    pub fn join(head: TracePart, tail: TracePart) -> Result<Warned<Trace>, TraceError> {
        let mut builder = head.builder;
        builder.append(tail.builder);
        builder.finish()
    }
}

/// Where a plain JSON trace can be split for two readers: the offset just
/// after the first `,` in `window` (bytes of the file from `offset`) that is
/// followed, after whitespace, by `{`. Only a guess: the first reader checks
/// it with [`TraceReader::finish_head`].
pub fn split_candidate(window: &[u8], offset: u64) -> Option<u64> {
    let mut from = 0;
    while let Some(at) = memchr::memchr(b',', window.get(from..)?) {
        let comma = from + at;
        let after = window.get(comma + 1..)?;
        let ws = after.iter().position(|b| !b.is_ascii_whitespace())?;
        if after.get(ws) == Some(&b'{') {
            return Some(offset + comma as u64 + 1);
        }
        from = comma + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::MAX_DECOMPRESSED_BYTES;

    const EVENT: &str = r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 1.5, "tid": 3, "args": {"Addr": 12345, "Bytes": 512, "Total Allocated": 512, "Device Type": 0}}"#;

    fn document(n: usize) -> String {
        format!(
            "\u{feff}{{\"schemaVersion\": 1, \"deviceProperties\": [], \"traceName\": \"t\u{e9}st\",\n \"traceEvents\": [\n{}\n], \"baseTimeNanoseconds\": 1700000000000000000}}\n",
            vec![EVENT; n].join(",\n")
        )
    }

    fn read_in_pieces(bytes: &[u8], piece: usize) -> Result<Warned<Trace>, TraceError> {
        let mut reader = TraceReader::new(MAX_DECOMPRESSED_BYTES);
        for chunk in bytes.chunks(piece.max(1)) {
            reader.push(chunk)?;
        }
        reader.finish()
    }

    proptest::proptest! {
        /// The word-at-a-time count (the one the page uses) is memchr's,
        /// whatever the bytes (newlines, their neighbours 0x09 and 0x0b,
        /// bytes with the top bit set) and wherever the slice ends.
        #[test]
        fn newlines_counted_eight_at_a_time_as_memchr_counts(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(b'\n'),
                    proptest::strategy::Just(0x0bu8),
                    proptest::strategy::Just(0x09u8),
                    proptest::strategy::Just(0x8au8),
                    proptest::num::u8::ANY,
                ],
                0..200,
            )
        ) {
            proptest::prop_assert_eq!(
                count_newlines_swar(&bytes),
                memchr::memchr_iter(b'\n', &bytes).count()
            );
        }
    }

    /// Plain entries take the fast path; the integration tests check that
    /// it reads real traces as serde alone does.
    #[test]
    fn plain_entries_take_the_fast_path() {
        let text = document(40);
        let mut json = JsonStream::new();
        json.push(text.as_bytes()).unwrap();
        assert_eq!(json.n_plain, 40);
        assert_eq!(json.finish().unwrap().value.memory.len(), 40);
    }

    #[test]
    fn every_piece_size_reads_the_same_trace() {
        let text = document(40);
        let whole = read_in_pieces(text.as_bytes(), text.len()).unwrap();
        assert_eq!(whole.value.memory.len(), 40);
        assert_eq!(
            whole.value.header.base_time_ns,
            Some(1_700_000_000_000_000_000)
        );
        assert_eq!(whole.value.header.trace_name.as_deref(), Some("t\u{e9}st"));
        for piece in [1, 2, 3, 7, 64, 181, 1000] {
            assert_eq!(
                read_in_pieces(text.as_bytes(), piece).unwrap(),
                whole,
                "{piece}"
            );
        }
    }

    #[test]
    fn gzip_pieces_read_the_same_trace() {
        let text = document(300);
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(text.as_bytes()).unwrap();
        let gz = encoder.finish().unwrap();
        let whole = read_in_pieces(text.as_bytes(), text.len()).unwrap();
        for piece in [1, 5, 333, gz.len()] {
            assert_eq!(read_in_pieces(&gz, piece).unwrap(), whole, "{piece}");
        }
    }

    #[test]
    fn a_value_cut_inside_a_number_waits_for_its_digits() {
        let text = r#"{"traceEvents": [], "schemaVersion": 12345}"#;
        for cut in 1..text.len() {
            let mut json = JsonStream::new();
            json.push(text.as_bytes().get(..cut).unwrap()).unwrap();
            json.push(text.as_bytes().get(cut..).unwrap()).unwrap();
            let err = json.finish().unwrap_err();
            // No memory events, but the header was read whole.
            assert_eq!(err, TraceError::NoMemoryEvents, "{cut}");
        }
    }

    #[test]
    fn errors_carry_their_position_in_the_whole_file() {
        let text = format!(
            "{}\n{{\"traceEvents\": [\n{EVENT},\n{{\"ph\": \"X\",, }}]}}",
            " ".repeat(70_000)
        );
        for piece in [5, 100, 4096, text.len()] {
            let err = read_in_pieces(text.as_bytes(), piece).unwrap_err();
            assert!(
                matches!(
                    err,
                    TraceError::InvalidJson {
                        line: 4,
                        column: 12,
                        ..
                    }
                ),
                "{piece}: {err:?}"
            );
        }
        let cut = format!("{{\"traceEvents\": [\n{EVENT},\n{EVENT}");
        let err = read_in_pieces(cut.as_bytes(), 10).unwrap_err();
        assert!(
            matches!(err, TraceError::Truncated { line: 3, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn a_large_unknown_value_is_read_in_linear_time() {
        // One 4 MB top-level value fed in 1 KiB pieces: without doubling the
        // retry size this would re-parse the value ~4,000 times.
        let big = format!("[{}0]", "0,".repeat(2 << 20));
        let text = format!("{{\"other\": {big}, \"traceEvents\": [{EVENT}]}}");
        let trace = read_in_pieces(text.as_bytes(), 1024).unwrap();
        assert_eq!(trace.value.memory.len(), 1);
    }

    #[test]
    fn a_trace_split_at_an_entry_reads_the_same_in_two_parts() {
        let text = document(50);
        let whole = read_in_pieces(text.as_bytes(), text.len()).unwrap();
        let bytes = text.as_bytes();
        let mut checked = 0;
        for guess in (0..bytes.len()).step_by(97) {
            let Some(split) = split_candidate(&bytes[guess..], guess as u64) else {
                continue;
            };
            let split = split as usize;
            let mut head = TraceReader::new(MAX_DECOMPRESSED_BYTES);
            head.push(&bytes[..split]).unwrap();
            let Some(head) = head.finish_head() else {
                continue;
            };
            let mut tail = TraceReader::continuing(false);
            for piece in bytes[split..].chunks(333) {
                tail.push(piece).unwrap();
            }
            let joined = TracePart::join(head, tail.finish_tail().unwrap()).unwrap();
            assert_eq!(joined, whole, "{split}");
            checked += 1;
        }
        assert!(checked > 10, "{checked}");
        // A comma inside a string is no boundary: the head says so.
        let tricky =
            format!("{{\"traceEvents\": [{{\"name\": \"a, {{b\", \"ph\": \"X\"}}, {EVENT}]}}");
        let split = split_candidate(tricky.as_bytes(), 0).unwrap() as usize;
        let mut head = TraceReader::new(MAX_DECOMPRESSED_BYTES);
        head.push(&tricky.as_bytes()[..split]).unwrap();
        assert!(head.finish_head().is_none());
    }

    #[test]
    fn gzip_past_the_limit_is_refused_while_decompressing() {
        // 8 MiB of zeros compress to a few KiB; with a 4 MiB limit the
        // decoder stops at the first write past it.
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(&vec![0_u8; 8 << 20]).unwrap();
        let bomb = encoder.finish().unwrap();
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        let mut gunzip = Gunzip::new(4 << 20);
        let mut seen = 0;
        let err = gunzip
            .push(&bomb, &mut |out| {
                seen += out.len();
                Ok(())
            })
            .unwrap_err();
        assert_eq!(err, TraceError::GzipTooLarge { limit: 4 << 20 });
        assert!(err.to_string().contains("4194304 bytes"), "{err}");
        assert!(seen <= 4 << 20);
        // At exactly its size the same stream is read.
        let mut gunzip = Gunzip::new(8 << 20);
        let mut seen = 0;
        let mut count = |out: &[u8]| {
            seen += out.len();
            Ok(())
        };
        gunzip.push(&bomb, &mut count).unwrap();
        gunzip.finish(&mut count).unwrap();
        assert_eq!(seen, 8 << 20);
    }
}
