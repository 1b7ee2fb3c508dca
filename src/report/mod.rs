//! Stage 4 — **report**: the simulation and analysis → the plain-data `Report`
//! that the CLI prints, the worker posts and the snapshot tests compare.
//!
//! Input: the analysis, the orchestrated schedule and one simulation per GPU
//! preset. Output: peak reserved, allocated and total (with device overheads),
//! when and where the peak happens, a downsampled timeline that keeps every
//! local maximum, the breakdown at the peak by category and layer, the verdict
//! per preset, and the warnings.
//!
//! Invariants: plain serde data with deterministic field and element order; the
//! breakdown categories sum exactly to the peak total.
