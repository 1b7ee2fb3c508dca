//! The one integration-test binary. Each module covers one area; see its doc.

mod common;

// Allocator behaviour: the spec's worked vectors and property tests.
mod simulator;

// End-to-end estimates of the real fixtures: invariants and JSON snapshots.
mod pipeline;
