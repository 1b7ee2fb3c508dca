//! The one integration-test binary. Each module covers one area; see its doc.

// Test code may panic on a broken expectation: that is how it fails (clippy.toml
// only allows it inside `#[test]` functions, not in shared helpers).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod common;
// The CLI's words for the settings core messages ask for (its own source file).
#[path = "../../src/bin/memcast/terms.rs"]
#[allow(dead_code)]
mod cli_terms;

// CPU-autocast traces estimated as CUDA autocast runs them (issue 16).
mod autocast;
// The work budget of a rebuilt job: predicted events, early refusals (issue 33).
mod budget;
// Analyzer: fixture goldens against .meta.json and one hand-written trace per rule.
mod analyzer;
// Traces made by the capture helper: the full job's figures they carry.
mod capture;
// The memcast binary: estimate and presets output, JSON contract, error exits.
mod cli;
// Recipes combined (checkpointing of either kind, autocast, accumulation,
// clipping, foreach or per-parameter steps) rebuilt in depth and length.
mod combined;
// Hostile input (empty, random, truncated, bombs, nesting, odd events, wrong
// traces) through the library and the CLI, and fuzzer crash reproducers.
mod hostile;
// Real GPU pairs made on an H200: held errors, checkpointed jobs rebuilt.
mod gpu_pairs;
// The `memcast analyze` command: JSON schema, exit codes, error messages.
mod cli_analyze;
// End-to-end estimates of the real fixtures: invariants and JSON snapshots.
mod pipeline;
// Training recipes (accumulation, schedule, checkpointing, clipping, compile, DDP,
// Trainer/Lightning loops) and traces recorded with fewer profiler options.
mod recipes;
// Replay of real GPU data (ground-truth snapshots and profiler traces) and the `memcast replay` CLI.
mod replay;
// Recordings cut short: the start-state rebuild and its teacher-forced repair.
mod replay_cut;
// Allocator behaviour: the spec's worked vectors and property tests.
mod simulator;
// LLM jobs: generation and its KV cache (issue 26).
mod llm;
// The model's resident state: parameters with and without gradients, buffers,
// run kind, state made before the trace, DDP buckets, traces without shapes.
mod state;
// The README's accuracy table against the measured errors it is made from.
mod readme;
// Trace small, run big: --layers and --seq-len against traces made that way.
mod scale;
// A generation streamed as a program against the job built whole.
mod stream;
// Source-text checks of the architecture invariants.
mod tidy;
// Trace reader: fixtures, tolerant parsing, bad-input errors.
mod trace;
// Real GPU traces from ../shared/ground-truth: read, recognised, counted.
mod trace_gpu;
// What-ifs (allocator settings, zero_grad, batch size, planned allocation, distributed, precision) and their CLI.
mod whatif;
