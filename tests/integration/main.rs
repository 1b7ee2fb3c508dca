//! The one integration-test binary. Each module covers one area; see its doc.

// Test code may panic on a broken expectation: that is how it fails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod common;

// Analyzer: fixture goldens against .meta.json and one hand-written trace per rule.
mod analyzer;
// The `memcast analyze` command: JSON schema, exit codes, error messages.
mod cli_analyze;
// Trace reader: fixtures, tolerant parsing, bad-input errors.
mod trace;
// Real GPU traces from ../shared/ground-truth: read, recognised, counted.
mod trace_gpu;

// Allocator behaviour: the spec's worked vectors and property tests.
mod simulator;
// Source-text checks of the architecture invariants.
mod tidy;

// End-to-end estimates of the real fixtures: invariants and JSON snapshots.
mod pipeline;

// The memcast binary: estimate and presets output, JSON contract, error exits.
mod cli;

// Replay of real GPU data (ground-truth snapshots and profiler traces) and the `memcast replay` CLI.
mod replay;

// What-ifs (allocator settings, zero_grad, batch size, planned allocation) and their CLI.
mod whatif;
