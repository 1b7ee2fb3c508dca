//! The one integration-test binary. Each module covers one area; see its doc.

mod common;
// Source-text checks of the architecture invariants.
mod tidy;
