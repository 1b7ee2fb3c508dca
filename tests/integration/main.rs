//! The one integration-test binary. Each module covers one area; see its doc.

mod common;

// Allocator behaviour: the spec's worked vectors and property tests.
mod simulator;

// Replay of real GPU data (ground-truth snapshots and profiler traces) and the `memcast replay` CLI.
mod replay;
