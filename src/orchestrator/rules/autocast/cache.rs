//! Rule `autocast_cast_cache`: autocast's cache of parameter casts.
//!
//! `cached_cast` (autocast_mode.cpp) keeps the lower-precision copy of an
//! fp32 leaf that requires grad (a parameter) and is not a view, keyed by the
//! parameter, until `torch.autocast.__exit__` clears the cache when the
//! outermost region exits; under `inference_mode` nothing is cached from
//! PyTorch 2.10 on (PR #165068).
//!
//! The decision is made at each cast: `can_try_cache` in `cached_cast`
//! reads `c10::InferenceMode::is_enabled()` (`c10/core/InferenceMode.cpp`: a
//! thread-local flag the `torch.inference_mode()` guard sets while it lives,
//! so the mode in force when the op casts), not a state saved when the
//! region was entered. So a
//! region entered outside `torch.inference_mode()` casts its weights afresh
//! while the forward runs inside it, and a region entered inside casts them
//! afresh too; `torch.no_grad()` is no part of the condition (a parameter
//! still `requires_grad()` under it), so casts under `no_grad`, inside or
//! outside the region, are cached. Each cast asks
//! [`crate::analyzer::inference_at`] for the mode at its op's start.
//!
//! The same code serves both devices, but
//! only an op in the device's list casts its arguments: CUDA lists `einsum`,
//! so it caches the weight `einsum` receives; CPU autocast does not, so the
//! `bmm` inside casts a view of the weight on every call and frees the copy
//! when it returns (under `no_grad`). A parameter a CPU-listed op receives
//! (`linear`, `conv2d`, `addmm`) is cached on both, and the trace shows it.

use super::{ParamKey, Walk};
use crate::analyzer::{inference_at, GradMode};
use crate::orchestrator::rules::autocast::AddedBlock;
use crate::orchestrator::rules::RuleId;
use crate::units::Bytes;

/// The cast of `parameter` by op `index` (`size` bytes); `twin` is the CPU's
/// copy of the same bytes in the op, if it made one.
pub(super) fn cast_parameter(
    walk: &mut Walk,
    index: usize,
    parameter: ParamKey,
    size: Bytes,
    twin: Option<usize>,
) {
    let analysis = walk.analysis;
    let Some(op) = analysis.ops.get(index) else {
        return;
    };
    // `!c10::InferenceMode::is_enabled()` of `can_try_cache`, at this cast.
    let inference = walk.region.grad == GradMode::InferenceMode
        || inference_at(&analysis.inference_mode, op.tid, op.start);
    let cacheable = !inference || walk.version.caches_in_inference_mode;
    if !cacheable {
        // Cast on every use, like any input.
        if twin.is_none() {
            walk.plan.added.push(AddedBlock {
                size,
                alloc: op.start,
                free: Some(op.end),
                op: index,
                rule: RuleId::AutocastInputCasts,
                on: crate::kernels::ArchSet::ALL,
                per_gpu: None,
            });
        }
        return;
    }
    if !walk.cached.insert(parameter) {
        // A cache hit: CUDA makes no copy; the CPU cast a view again.
        if let Some(b) = twin {
            walk.plan.dropped.insert(b, RuleId::AutocastCastCache);
        }
        return;
    }
    let end = walk.region.end;
    match twin.and_then(|b| analysis.blocks.get(b)) {
        // Kept until the region exits, or longer when autograd keeps it.
        Some(block) => {
            if block.free_ts.is_some_and(|f| f < end) {
                walk.plan
                    .freed
                    .insert(block.id, (end, RuleId::AutocastCastCache));
            }
        }
        None => walk.plan.added.push(AddedBlock {
            size,
            alloc: op.start,
            free: Some(end),
            op: index,
            rule: RuleId::AutocastCastCache,
            on: crate::kernels::ArchSet::ALL,
            per_gpu: None,
        }),
    }
}
