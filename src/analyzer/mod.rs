//! Stage 1 — **analyzer**: typed trace events → memory-block lifecycles with
//! attribution (xMem §3.2, VeritasEst §III-A/B).
//!
//! Input: a parsed `Trace`. Output: an `Analysis` with every memory block
//! (allocation paired with its free by address in time order, or persistent),
//! the iterations and their phases (data loading, forward, zero_grad, backward,
//! optimizer step), the innermost op and model layer of every block, and the
//! evidence the orchestrator needs (parameters from `AccumulateGrad` shapes,
//! gradient, optimizer-state and batch blocks).
//!
//! Invariants:
//! - Pure: no I/O, no clock, no environment; the same trace gives the same
//!   analysis, in the same order.
//! - Attribution uses an interval index over the span tree, not a scan per block.
//! - The running sum of block sizes reproduces the trace's `Total Allocated` at
//!   every event.
