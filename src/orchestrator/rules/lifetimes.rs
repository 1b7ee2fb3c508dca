//! Rules `gradients` and `batch_handover`: captured frees that a CUDA run
//! makes at another moment.

use super::order::Key;
use super::{windows_of, Item};
use crate::orchestrator::schedule::{Category, Phase, PhaseWindow};
use crate::units::Nanos;

/// Rule `gradients`: a gradient lives until the `zero_grad` that frees it. A
/// captured free that is not inside a `zero_grad` window is moved to the start
/// of the next `zero_grad` after the allocation (never freed when there is
/// none). Returns how many frees moved.
pub(super) fn rule_gradients(items: &mut [Item], windows: &[PhaseWindow]) -> u32 {
    let zero_grads: Vec<&PhaseWindow> = windows_of(windows, Phase::ZeroGrad).collect();
    let mut moved = 0;
    for item in items
        .iter_mut()
        .filter(|i| i.category == Category::Gradient)
    {
        let Some(free) = item.free else {
            continue;
        };
        let inside = zero_grads
            .iter()
            .any(|w| w.start <= free.time && free.time <= w.end);
        if inside {
            continue;
        }
        let next = zero_grads
            .iter()
            .map(|w| w.start)
            .find(|&start| start > item.alloc.time);
        item.free = next.map(|time| Key::before_trace(time, item.alloc.rank));
        moved += 1;
    }
    moved
}

/// When the batch of the iteration before must be freed at the latest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Handover {
    /// The iteration whose data loading hands over.
    pub iteration: u32,
    /// The start of its first phase after data loading.
    pub deadline: Nanos,
}

/// The hand-over of each simulated iteration that loads data: its first
/// data loading window and the start of the next phase after it.
pub(super) fn handovers(windows: &[PhaseWindow]) -> Vec<Handover> {
    let mut out: Vec<Handover> = Vec::new();
    for loading in windows_of(windows, Phase::DataLoading) {
        if out.iter().any(|h| h.iteration == loading.iteration) {
            continue;
        }
        // The deadline: the start of the iteration's next phase.
        let deadline = windows
            .iter()
            .filter(|w| {
                w.iteration == loading.iteration
                    && w.phase != Phase::DataLoading
                    && w.start >= loading.end
            })
            .map(|w| w.start)
            .min()
            .unwrap_or(loading.end);
        out.push(Handover {
            iteration: loading.iteration,
            deadline,
        });
    }
    out
}

/// Rule `batch_handover`: a batch is freed just after the next batch is
/// loaded (the loop rebinds its variables), so both are alive at the
/// hand-over, and it never outlives that point: a free after the next
/// iteration's hand-over deadline (or a missing free) is moved there.
/// Returns how many moved.
pub(super) fn rule_batch_handover(items: &mut [Item], handovers: &[Handover]) -> u32 {
    let mut moved = 0;
    for item in items.iter_mut().filter(|i| i.category == Category::Batch) {
        let Some(iteration) = item.iteration else {
            continue;
        };
        let Some(next) = handovers.iter().find(|h| h.iteration == iteration + 1) else {
            continue;
        };
        if item.free.is_none_or(|free| free.time > next.deadline) {
            item.free = Some(Key::after_trace(next.deadline, item.alloc.rank));
            moved += 1;
        }
    }
    moved
}
