//! The verdict for one GPU: whether the job fits at its capacity, with the
//! headroom or shortfall, the device overheads, and the kernels assumed on
//! its architecture.

use serde::{Deserialize, Serialize};

use super::{GpuRuns, Margin, SimulatedRun};
use crate::kernels::KernelNote;
use crate::presets::GpuTarget;
use crate::units::Bytes;

/// The verdict for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuVerdict {
    /// The preset slug, or the capacity as given.
    pub preset: String,
    pub capacity_bytes: Bytes,
    /// Whether the run completes at this capacity (the simulated allocator
    /// releases its cache and retries before it gives up).
    pub fits: bool,
    /// Peak reserved plus context in the capacity-limited simulation (up to the
    /// failure when it does not fit).
    pub peak_total_bytes: Bytes,
    /// Capacity left at the peak, when it fits.
    pub headroom_bytes: Option<Bytes>,
    /// How much more the run needs (unlimited peak total minus capacity), when
    /// it does not fit.
    pub shortfall_bytes: Option<Bytes>,
    pub context_bytes: Bytes,
    pub cublas_workspace_bytes: Bytes,
    /// The kernels assumed on this GPU where the choice depends on its
    /// architecture ("attention: cuDNN attention").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<String>,
    /// Fits, fits with a thin margin (headroom within the error measured
    /// for this kind of job, [`Report::error_band`]), or does not fit.
    #[serde(default)]
    pub margin: Margin,
}

/// What a GPU's run at its capacity says: whether the job fits, and its
/// peak (what a verdict reads of it, and all a search over sizes needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AtCapacity {
    /// Whether the run completes at this capacity (the simulated allocator
    /// releases its cache and retries before it gives up).
    pub fits: bool,
    /// Peak reserved plus context (up to the failure when it does not fit).
    pub peak_total_bytes: Bytes,
}

impl AtCapacity {
    /// The run at capacity `run` of `target`.
    pub fn of(run: &SimulatedRun, target: &GpuTarget) -> AtCapacity {
        let peak_total = run.max_reserved + target.overheads.context_bytes;
        AtCapacity {
            fits: run.oom_at.is_none() && peak_total <= target.capacity,
            peak_total_bytes: peak_total,
        }
    }
}

impl GpuVerdict {
    /// What its run at capacity said (the figures [`AtCapacity::of`] gives).
    pub fn at_capacity(&self) -> AtCapacity {
        AtCapacity {
            fits: self.fits,
            peak_total_bytes: self.peak_total_bytes,
        }
    }
}

pub(super) fn verdict(runs: &GpuRuns<'_>, kernels: &[KernelNote]) -> GpuVerdict {
    let overheads = runs.target.overheads;
    let capacity = runs.target.capacity;
    let AtCapacity {
        fits,
        peak_total_bytes: peak_total,
    } = AtCapacity::of(runs.at_capacity, runs.target);
    let needed = runs.unlimited.max_reserved + overheads.context_bytes;
    GpuVerdict {
        preset: runs.target.name.clone(),
        capacity_bytes: capacity,
        fits,
        peak_total_bytes: peak_total,
        headroom_bytes: fits.then(|| capacity.saturating_sub(peak_total)),
        shortfall_bytes: (!fits).then(|| needed.saturating_sub(capacity)),
        context_bytes: overheads.context_bytes,
        cublas_workspace_bytes: overheads.cublas_workspace_bytes,
        kernels: kernels_on(kernels, runs.target),
        margin: if fits {
            Margin::Fits
        } else {
            Margin::DoesNotFit
        },
    }
}

/// The kernels the schedule assumes on `target`'s architecture, as the
/// report names them.
pub fn kernels_on(kernels: &[KernelNote], target: &GpuTarget) -> Vec<String> {
    let sm = target.kernel_sm();
    kernels
        .iter()
        .filter(|k| k.on.contains(sm))
        .map(|k| format!("{}: {}", k.family, k.choice))
        .collect()
}
