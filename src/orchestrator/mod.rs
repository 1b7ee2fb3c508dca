//! Stage 2 — **orchestrator**: CPU lifetimes → the allocation sequence a CUDA run
//! of the same script would produce (xMem §3.3, VeritasEst §III-C).
//!
//! Input: an `Analysis` and an orchestration config. Output: a schedule of
//! allocations and frees for the simulator, each tagged with its category
//! (parameter, gradient, optimizer state, activation, batch, temporary) and layer.
//!
//! Every adjustment is a named, documented rule: parameters (absent from the
//! trace, inferred and allocated first), batch hand-over, CPU-only kernel scratch
//! dropped, gradients live until the `zero_grad` that frees them, optimizer state
//! persistent from the first step (or added by calculation when built before
//! profiling), the CUDA `foreach` optimizer path, several iterations.
//!
//! Invariants: pure and deterministic; every block of the schedule is freed at
//! most once and never before it is allocated.

mod schedule;

pub use schedule::{
    BlockId, Category, EventKind, IterationSpan, Phase, Schedule, ScheduleEvent, ScheduledBlock,
};
