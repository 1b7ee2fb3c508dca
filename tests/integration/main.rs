//! The one integration-test binary. Each module covers one area; see its doc.

mod common;

// Analyzer: fixture goldens against .meta.json and one hand-written trace per rule.
mod analyzer;
// The `memcast analyze` command: JSON schema, exit codes, error messages.
mod cli_analyze;
// Trace reader: fixtures, tolerant parsing, bad-input errors.
mod trace;
// Real GPU traces from ../shared/ground-truth: read, recognised, counted.
mod trace_gpu;
