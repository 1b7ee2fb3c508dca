//! Stage 3 — **simulator**: a two-level model of PyTorch's CUDA caching
//! allocator (xMem §3.4; rules in `shared/docs/allocator.md`).
//!
//! Input: a schedule of allocations and frees plus an allocator configuration
//! (parsed from a `PYTORCH_CUDA_ALLOC_CONF`-style string) and a device (capacity,
//! non-allocator overhead). Output: statistics after every event (allocated,
//! reserved, active, segments, largest free block), their peaks, and an OOM
//! record if the device ran out after releasing cached segments and retrying.
//!
//! Invariants:
//! - Deterministic and clock-free: time is the schedule's order.
//! - allocated ≤ reserved ≤ capacity; live blocks never overlap; with the
//!   default configuration every segment is a multiple of 2 MiB.
//! - Best-fit lookup is logarithmic (ordered sets per pool and stream).
