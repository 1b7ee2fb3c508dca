//! memcast estimates the GPU memory of a PyTorch job (training, fine-tuning, inference) from a
//! `torch.profiler` trace captured on the CPU, with the xMem pipeline.
//!
//! Steps, each a pure stage with one entry function:
//! 1. [`trace`] — read the Chrome trace (`.json` or `.json.gz`) into typed events
//!    ([`trace::read`]);
//!    [`scale`] — for a job larger than the traced one (more blocks, a longer
//!    sequence), the trace that job would give ([`scale::scale`]);
//! 2. [`analyzer`] — rebuild memory-block lifecycles and attribute them to ops,
//!    layers and training phases ([`analyzer::analyze`]);
//! 3. [`orchestrator`] — turn CPU lifetimes into the sequence a CUDA run would
//!    have ([`orchestrator::orchestrate`]);
//! 4. [`simulator`] — replay it through a model of PyTorch's CUDA caching
//!    allocator ([`simulator::simulate`]);
//! 5. [`report`] — peak, timeline, breakdown and per-GPU verdicts as plain data
//!    ([`report::build`]).
//!
//! [`pipeline`] runs them in order: [`prepare_from`] (steps 1–3, giving a
//! [`Prepared`]) and [`estimate_with`] (steps 4–5 on the target GPU and every
//! compared GPU), with the settings of a [`Config`]. The shells (the CLI in
//! `src/bin`, the page and its worker in [`web`]) call the pipeline.
//!
//! Beside the pipeline: [`whatif`] (named transformations of a [`Prepared`],
//! re-simulated), [`replay`] (the validation mode: real GPU-side allocator
//! data through the simulator), [`presets`] (GPUs and their overheads),
//! [`permalink`] (shared estimates), [`protocol`] (page ↔ worker messages) and
//! [`present`] (the words and numbers both shells show, made once).
//!
//! Architecture invariant: everything outside `web` (and the binaries in
//! `src/bin`) is core — it does no I/O, reads no clock or environment, never
//! prints and never panics on user data.

pub mod analyzer;
pub mod autocast;
pub mod diag;
pub mod kernels;
pub mod orchestrator;
pub mod permalink;
pub mod pipeline;
pub mod present;
pub mod presets;
pub mod program;
pub mod protocol;
pub mod replay;
pub mod report;
pub mod scale;
pub mod simulator;
pub mod trace;
pub mod units;
pub mod whatif;

#[cfg(feature = "web")]
pub mod web;

pub use diag::{Warned, Warning};
pub use pipeline::{
    estimate, estimate_with, prepare, prepare_from, prepare_parsed, run, run_from, Config, Error,
    InTurn, Parallel, Prepared, Progress, Settings, SimulationJob, Stage, Task,
};
pub use units::{Bytes, Nanos};
