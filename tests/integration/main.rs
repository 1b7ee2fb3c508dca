//! The one integration-test binary. Each module covers one area; see its doc.

// Test code may panic on a broken expectation: that is how it fails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod common;

// Allocator behaviour: the spec's worked vectors and property tests.
mod simulator;
// Source-text checks of the architecture invariants.
mod tidy;
