//! memcast estimates the GPU memory of a PyTorch training job from a
//! `torch.profiler` trace captured on the CPU, with the xMem pipeline.
//!
//! Steps, each a pure stage with one entry function:
//! 1. [`trace`] — read the Chrome trace (`.json` or `.json.gz`) into typed events;
//! 2. [`analyzer`] — rebuild memory-block lifecycles and attribute them to ops,
//!    layers and training phases;
//! 3. [`orchestrator`] — turn CPU lifetimes into the sequence a CUDA run would have;
//! 4. [`simulator`] — replay it through a model of PyTorch's CUDA caching allocator;
//! 5. [`report`] — peak, timeline, breakdown and per-GPU verdicts as plain data.
//!
//! [`replay`] is the validation mode: it replays real GPU-side allocator data
//! (memory snapshots, profiler memory events) through the simulator.
//!
//! Architecture invariant: everything outside `web` (and the binaries in
//! `src/bin`) is core — it does no I/O, reads no clock or environment, never
//! prints and never panics on user data.

pub mod analyzer;
pub mod diag;
pub mod orchestrator;
pub mod protocol;
pub mod replay;
pub mod report;
pub mod simulator;
pub mod trace;
pub mod units;

#[cfg(feature = "web")]
pub mod web;

pub use diag::{Warned, Warning};
pub use units::{Bytes, Nanos};
