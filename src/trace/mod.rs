//! Stage 0 — **trace**: bytes of a `torch.profiler` Chrome trace → typed events.
//!
//! Input: the raw bytes of a `.json` or `.json.gz` file (gzip is detected by its
//! magic bytes and decoded in pure Rust, so this also runs in WebAssembly).
//! Output: a `Trace` holding only what later stages need — `[memory]` events,
//! `cpu_op`, `python_function` and `user_annotation` spans, `fwdbwd` flows and
//! the header flags — plus [`crate::Warning`]s for fields that were missing.
//!
//! Invariants:
//! - This is the only module that knows the profiler's JSON field names.
//! - It reads the input in one pass and never builds a `serde_json::Value` tree
//!   of the whole file.
//! - It never panics on user data: anything that is not a usable trace is a
//!   `TraceError` whose message names the capture setting to fix.
