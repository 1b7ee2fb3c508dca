//! The one integration-test binary. Each module covers one area; see its doc.

mod common;

// Allocator behaviour: the spec's worked vectors and property tests.
mod simulator;
// Source-text checks of the architecture invariants.
mod tidy;
