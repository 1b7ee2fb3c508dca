//! What-if 2 — **zero_grad**: where `optimizer.zero_grad()` runs decides how
//! long the previous iteration's gradients live (xMem Figure 1). At the start
//! of the iteration ("pos1") they are freed before forward; right before
//! `backward()` ("pos0") they live through the whole forward pass. With
//! `set_to_none=False` they are never freed: backward accumulates into them in
//! place, and each later gradient is a transient freed at accumulation.
//!
//! Transformations of the orchestrated sequence:
//! - *move*: every gradient free goes to the other placement of the iteration
//!   that frees it (before that iteration's first forward allocation, or
//!   before its first backward allocation);
//! - *keep* (`set_to_none=False`): the first gradients are never freed and
//!   every later gradient is freed right after its allocation.
//!
//! - *free* (`set_to_none=True` from a trace captured with `False`): the kept
//!   gradients are freed at the next `zero_grad`, and each later backward
//!   transient matched to a gradient (an activation of the same layer and
//!   size, in allocation order) becomes a gradient. The matching is a
//!   heuristic; on the resnet18 fixtures captured both ways it rebuilds the
//!   real `set_to_none=True` sequence block for block.

use serde::{Deserialize, Serialize};

use super::alloc_settings::signed_delta;
use super::distributed::{landmarks, At, Edit};
use super::{estimate_schedule, retime, Anchor, PeakFigures, WhatIfError};
use crate::orchestrator::{Category, EventKind, Phase, Schedule, ScheduledBlock};
use crate::pipeline::{Config, Prepared};
use crate::units::Nanos;

/// The version tag of [`ZeroGradComparison`].
pub const SCHEMA: &str = "memcast.whatif.zero_grad/1";

/// Where `zero_grad` runs in an iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Placement {
    /// At the start of the iteration, before forward ("pos1").
    #[serde(rename = "pos1")]
    StartOfIteration,
    /// After forward, right before `backward()` ("pos0").
    #[serde(rename = "pos0")]
    BeforeBackward,
}

/// One variant of the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZeroGradRow {
    /// `None` with `set_to_none=False`: the placement changes nothing then.
    pub placement: Option<Placement>,
    pub set_to_none: bool,
    /// Whether this is the captured job (unchanged schedule).
    pub captured: bool,
    pub peak: PeakFigures,
    /// Peak total minus the captured job's.
    pub delta_total_bytes: i64,
    /// Gradient frees moved, added or removed by the transformation.
    pub changed_frees: u32,
}

/// The zero_grad comparison.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZeroGradComparison {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// The captured placement, when gradients are freed.
    pub captured_placement: Option<Placement>,
    pub captured_set_to_none: bool,
    /// The captured job first, then the variants.
    pub rows: Vec<ZeroGradRow>,
    pub notes: Vec<String>,
}

/// Facts of a schedule's gradients.
struct Gradients {
    /// Alloc event index of every block (usize::MAX if none).
    alloc_event: Vec<usize>,
    /// `(free event index, iteration index in schedule.iterations)` of every
    /// gradient free.
    frees: Vec<(usize, usize)>,
    /// Per schedule iteration: the first forward and first backward
    /// allocation times.
    forward_start: Vec<Option<Nanos>>,
    backward_start: Vec<Option<Nanos>>,
    n_blocks: usize,
}

fn gradients(schedule: &Schedule) -> Gradients {
    let n_iter = schedule.iterations.len();
    let mut alloc_event = vec![usize::MAX; schedule.blocks.len()];
    let mut forward_start: Vec<Option<Nanos>> = vec![None; n_iter];
    let mut backward_start: Vec<Option<Nanos>> = vec![None; n_iter];
    let mut frees = Vec::new();
    let iteration_at = |time: Nanos| {
        schedule
            .iterations
            .iter()
            .rposition(|span| span.start <= time)
            .unwrap_or(0)
    };
    for (index, event) in schedule.events.iter().enumerate() {
        let Some(block) = schedule.block(event.block) else {
            continue;
        };
        match event.kind {
            EventKind::Alloc => {
                if let Some(slot) = alloc_event.get_mut(event.block.index()) {
                    *slot = index;
                }
                let slots = match block.phase {
                    Phase::Forward => &mut forward_start,
                    Phase::Backward => &mut backward_start,
                    _ => continue,
                };
                let position = block
                    .iteration
                    .and_then(|i| schedule.iterations.iter().position(|span| span.index == i));
                if let Some(slot) = position.and_then(|p| slots.get_mut(p)) {
                    slot.get_or_insert(event.time);
                }
            }
            EventKind::Free if block.category == Category::Gradient => {
                frees.push((index, iteration_at(event.time)));
            }
            EventKind::Free => {}
        }
    }
    let n_blocks = schedule
        .blocks
        .iter()
        .filter(|b| b.category == Category::Gradient)
        .count();
    Gradients {
        alloc_event,
        frees,
        forward_start,
        backward_start,
        n_blocks,
    }
}

impl Gradients {
    fn point(&self, iteration: usize, placement: Placement) -> Option<Nanos> {
        let starts = match placement {
            Placement::StartOfIteration => &self.forward_start,
            Placement::BeforeBackward => &self.backward_start,
        };
        starts.get(iteration).copied().flatten()
    }

    /// The placement most gradient frees follow.
    fn placement(&self, schedule: &Schedule) -> Option<Placement> {
        let mut before_forward = 0usize;
        let mut before_backward = 0usize;
        for &(index, iteration) in &self.frees {
            let Some(time) = schedule.events.get(index).map(|e| e.time) else {
                continue;
            };
            match self.point(iteration, Placement::StartOfIteration) {
                Some(start) if time <= start => before_forward += 1,
                _ => before_backward += 1,
            }
        }
        if self.frees.is_empty() {
            None
        } else if before_forward >= before_backward {
            Some(Placement::StartOfIteration)
        } else {
            Some(Placement::BeforeBackward)
        }
    }
}

/// Moves every gradient free to `placement` in the iteration that frees it.
/// Returns the schedule and how many frees moved.
pub fn move_frees(
    schedule: &Schedule,
    placement: Placement,
) -> Result<(Schedule, u32), WhatIfError> {
    let facts = gradients(schedule);
    let mut moved = Vec::new();
    for &(index, iteration) in &facts.frees {
        let Some(point) = facts.point(iteration, placement) else {
            continue;
        };
        let Some(event) = schedule.events.get(index) else {
            continue;
        };
        // Never before the gradient's own allocation.
        let alloc_time = facts
            .alloc_event
            .get(event.block.index())
            .and_then(|&i| schedule.events.get(i))
            .map_or(point, |e| e.time);
        if point != event.time && point > alloc_time {
            moved.push((index, Anchor::Before(point)));
        }
    }
    let count = u32::try_from(moved.len()).unwrap_or(u32::MAX);
    Ok((retime(schedule, &moved, &[])?, count))
}

/// The last event from `alloc` on that the op making `block` still makes:
/// the run of events right after it whose blocks the same layer makes in
/// the same phase of the same iteration (the rest of a convolution's
/// backward: its other gradients and workspaces; the gradient itself comes
/// from a factory call inside it, so ops are not compared).
fn end_of_op(schedule: &Schedule, alloc: usize, block: &ScheduledBlock) -> usize {
    let same_op = |b: &ScheduledBlock| {
        block.layer.is_some()
            && b.layer == block.layer
            && b.phase == block.phase
            && b.iteration == block.iteration
    };
    let run = schedule
        .events
        .iter()
        .skip(alloc + 1)
        .take_while(|e| schedule.block(e.block).is_some_and(same_op))
        .count();
    alloc + run
}

/// `zero_grad(set_to_none=False)`: the gradients of the first iteration that
/// makes them stay allocated; every later gradient is freed when the op that
/// made it returns (backward accumulates it in place into the existing one
/// and frees it): after the events the same op makes after it.
pub fn keep_gradients(schedule: &Schedule) -> Result<(Schedule, u32), WhatIfError> {
    let facts = gradients(schedule);
    let first = schedule
        .blocks
        .iter()
        .filter(|b| b.category == Category::Gradient)
        .filter_map(|b| b.iteration)
        .min();
    let mut drop = vec![false; schedule.events.len()];
    let mut moved = Vec::new();
    let mut changed = 0u32;
    for (index, event) in schedule.events.iter().enumerate() {
        let Some(block) = schedule.block(event.block) else {
            continue;
        };
        if block.category != Category::Gradient {
            continue;
        }
        let persistent = block.iteration == first;
        match event.kind {
            EventKind::Free if persistent => {
                if let Some(slot) = drop.get_mut(index) {
                    *slot = true;
                    changed += 1;
                }
            }
            EventKind::Free => {
                if let Some(&alloc) = facts.alloc_event.get(event.block.index()) {
                    moved.push((index, Anchor::After(end_of_op(schedule, alloc, block))));
                    changed += 1;
                }
            }
            EventKind::Alloc => {}
        }
    }
    // Later gradients never freed in the capture (the last iteration's) are
    // transients too: add their free.
    let mut schedule = retime(schedule, &moved, &drop)?;
    let mut freed = vec![false; schedule.blocks.len()];
    for event in &schedule.events {
        if event.kind == EventKind::Free {
            if let Some(slot) = freed.get_mut(event.block.index()) {
                *slot = true;
            }
        }
    }
    let mut extra: Vec<(usize, crate::orchestrator::ScheduleEvent)> = Vec::new();
    for (index, event) in schedule.events.iter().enumerate() {
        let id = event.block.index();
        let Some(block) = schedule.blocks.get(id) else {
            continue;
        };
        if event.kind == EventKind::Alloc
            && block.category == Category::Gradient
            && block.iteration != first
            && !freed.get(id).copied().unwrap_or(true)
        {
            extra.push((
                index,
                crate::orchestrator::ScheduleEvent {
                    time: event.time,
                    kind: EventKind::Free,
                    block: event.block,
                },
            ));
        }
    }
    for (offset, (index, free)) in extra.iter().enumerate() {
        schedule.events.insert(index + 1 + offset, *free);
        changed += 1;
    }
    schedule.check().map_err(WhatIfError::Inconsistent)?;
    Ok((schedule, changed))
}

/// `zero_grad(set_to_none=True)` for a sequence captured with
/// `set_to_none=False`: the kept gradients are freed at `placement` of the
/// next iteration, and in each later iteration the transient that backward
/// made for each gradient (matched by layer and size, in allocation order)
/// becomes that iteration's gradient, freed at `placement` of the iteration
/// after (never, in the last one). Returns the schedule and the frees added
/// or moved.
pub fn free_gradients(
    schedule: &Schedule,
    placement: Placement,
) -> Result<(Schedule, u32), WhatIfError> {
    let marks = landmarks(schedule);
    let mut edit = Edit::new(schedule);
    let point = |iteration: u32| -> Option<At> {
        let starts = match placement {
            Placement::StartOfIteration => &marks.forward_first,
            Placement::BeforeBackward => &marks.backward_first,
        };
        starts.get(&iteration).map(|&index| At::Before(index))
    };
    let kept: Vec<usize> = schedule
        .blocks
        .iter()
        .enumerate()
        .filter(|(id, b)| {
            b.category == Category::Gradient
                && marks.free_event.get(*id).copied().flatten().is_none()
        })
        .map(|(id, _)| id)
        .collect();
    let Some(first) = kept
        .iter()
        .filter_map(|&id| schedule.blocks.get(id).and_then(|b| b.iteration))
        .min()
    else {
        return Err(WhatIfError::NoGradients(0));
    };
    let mut changed = 0u32;
    for &id in &kept {
        if let Some(at) = point(first + 1) {
            edit.new_frees.push((id, at));
            changed += 1;
        }
    }
    let last = schedule
        .iterations
        .iter()
        .map(|i| i.index)
        .max()
        .unwrap_or(first);
    for iteration in first + 1..=last {
        // Transients of this iteration's backward, in allocation order.
        let mut candidates: Vec<usize> = schedule
            .blocks
            .iter()
            .enumerate()
            .filter(|(id, b)| {
                b.iteration == Some(iteration)
                    && b.phase == Phase::Backward
                    // It outlives the op that made it (until AccumulateGrad):
                    // an activation, never an op temporary.
                    && b.category == Category::Activation
                    && marks.free_event.get(*id).copied().flatten().is_some()
            })
            .map(|(id, _)| id)
            .collect();
        candidates.sort_by_key(|&id| marks.alloc_event.get(id).copied().unwrap_or(usize::MAX));
        let mut taken = vec![false; candidates.len()];
        for &gradient in &kept {
            let Some(g) = schedule.blocks.get(gradient) else {
                continue;
            };
            let found = candidates.iter().enumerate().position(|(slot, &id)| {
                !taken.get(slot).copied().unwrap_or(true)
                    && schedule
                        .blocks
                        .get(id)
                        .is_some_and(|b| b.size == g.size && b.layer == g.layer)
            });
            let Some(slot) = found else {
                continue;
            };
            if let Some(flag) = taken.get_mut(slot) {
                *flag = true;
            }
            let Some(&id) = candidates.get(slot) else {
                continue;
            };
            let Some(free) = marks.free_event.get(id).copied().flatten() else {
                continue;
            };
            edit.recategorize(id, Category::Gradient);
            match point(iteration + 1) {
                Some(at) => {
                    edit.moved_frees.insert(free, at);
                }
                None => {
                    edit.dropped.insert(free);
                }
            }
            changed += 1;
        }
    }
    Ok((edit.build()?, changed))
}

/// Simulates the captured job, the gradient frees at the other placement, and
/// `set_to_none=False`.
pub fn compare(prepared: &Prepared, config: &Config) -> Result<ZeroGradComparison, WhatIfError> {
    let schedule = &prepared.orchestrated.schedule;
    let config = super::peak_only(config);
    let facts = gradients(schedule);
    if facts.n_blocks == 0 {
        return Err(WhatIfError::NoGradients(0));
    }
    let captured_placement = facts.placement(schedule);
    let captured_set_to_none = captured_placement.is_some();
    let captured = PeakFigures::of(&estimate_schedule(prepared, schedule.clone(), &config)?);
    let mut rows = vec![ZeroGradRow {
        placement: captured_placement,
        set_to_none: captured_set_to_none,
        captured: true,
        peak: captured,
        delta_total_bytes: 0,
        changed_frees: 0,
    }];
    let mut notes = vec![
        "set_to_none=False keeps the first gradients allocated and frees each later gradient right after backward makes it (accumulated in place)".to_owned(),
    ];
    if let Some(current) = captured_placement {
        let other = match current {
            Placement::StartOfIteration => Placement::BeforeBackward,
            Placement::BeforeBackward => Placement::StartOfIteration,
        };
        let (moved, changed) = move_frees(schedule, other)?;
        let peak = PeakFigures::of(&estimate_schedule(prepared, moved, &config)?);
        rows.push(ZeroGradRow {
            placement: Some(other),
            set_to_none: true,
            captured: false,
            peak,
            delta_total_bytes: signed_delta(peak.total_bytes, captured.total_bytes),
            changed_frees: changed,
        });
        let (kept, changed) = keep_gradients(schedule)?;
        let peak = PeakFigures::of(&estimate_schedule(prepared, kept, &config)?);
        rows.push(ZeroGradRow {
            placement: None,
            set_to_none: false,
            captured: false,
            peak,
            delta_total_bytes: signed_delta(peak.total_bytes, captured.total_bytes),
            changed_frees: changed,
        });
    } else {
        for placement in [Placement::StartOfIteration, Placement::BeforeBackward] {
            let (freed, changed) = free_gradients(schedule, placement)?;
            let peak = PeakFigures::of(&estimate_schedule(prepared, freed, &config)?);
            rows.push(ZeroGradRow {
                placement: Some(placement),
                set_to_none: true,
                captured: false,
                peak,
                delta_total_bytes: signed_delta(peak.total_bytes, captured.total_bytes),
                changed_frees: changed,
            });
        }
        notes.push("the trace was captured with set_to_none=False: for set_to_none=True the kept gradients are freed at the next zero_grad and each later backward transient matched to a gradient by layer and size becomes that iteration's gradient".to_owned());
    }
    Ok(ZeroGradComparison {
        schema: SCHEMA.to_owned(),
        captured_placement,
        captured_set_to_none,
        rows,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::{BlockId, IterationSpan, ScheduleEvent, ScheduledBlock};
    use crate::units::Bytes;

    fn block(category: Category, iteration: u32, phase: Phase, size: u64) -> ScheduledBlock {
        ScheduledBlock {
            size: Bytes(size),
            category,
            iteration: Some(iteration),
            phase,
            op: None,
            layer: None,
            on: crate::kernels::ArchSet::ALL,
            per_gpu: None,
        }
    }

    /// Two iterations of [forward act 0..10, backward grad 10..20]; iteration
    /// 0's gradient is freed at the start of iteration 1 (pos1).
    fn two_iterations() -> Schedule {
        let blocks = vec![
            block(Category::Activation, 0, Phase::Forward, 100),
            block(Category::Gradient, 0, Phase::Backward, 10),
            block(Category::Activation, 1, Phase::Forward, 100),
            block(Category::Gradient, 1, Phase::Backward, 10),
        ];
        let ev = |t: i64, kind, b: u32| ScheduleEvent {
            time: Nanos(t),
            kind,
            block: BlockId(b),
        };
        let events = vec![
            ev(1, EventKind::Alloc, 0),
            ev(11, EventKind::Alloc, 1),
            ev(15, EventKind::Free, 0),
            ev(20, EventKind::Free, 1),
            ev(21, EventKind::Alloc, 2),
            ev(31, EventKind::Alloc, 3),
            ev(35, EventKind::Free, 2),
        ];
        let iterations = vec![
            IterationSpan {
                index: 0,
                source: 0,
                start: Nanos(0),
                end: Nanos(20),
            },
            IterationSpan {
                index: 1,
                source: 1,
                start: Nanos(20),
                end: Nanos(40),
            },
        ];
        Schedule {
            blocks,
            events,
            iterations,
            phases: Vec::new(),
            kernels: Vec::new(),
        }
    }

    #[test]
    fn frees_move_to_before_backward_and_back() {
        let s = two_iterations();
        s.check().unwrap();
        let facts = gradients(&s);
        assert_eq!(facts.placement(&s), Some(Placement::StartOfIteration));
        let (moved, n) = move_frees(&s, Placement::BeforeBackward).unwrap();
        assert_eq!(n, 1);
        // Gradient 1 is now freed right before iteration 1's gradient 3 is made.
        let order: Vec<(u32, EventKind)> =
            moved.events.iter().map(|e| (e.block.0, e.kind)).collect();
        assert_eq!(
            order[3..],
            [
                (2, EventKind::Alloc),
                (1, EventKind::Free),
                (3, EventKind::Alloc),
                (2, EventKind::Free)
            ]
        );
        assert_eq!(
            gradients(&moved).placement(&moved),
            Some(Placement::BeforeBackward)
        );
        let (back, _) = move_frees(&moved, Placement::StartOfIteration).unwrap();
        let order: Vec<(u32, EventKind)> =
            back.events.iter().map(|e| (e.block.0, e.kind)).collect();
        assert_eq!(order[3..5], [(1, EventKind::Free), (2, EventKind::Alloc)]);
    }

    #[test]
    fn set_to_none_false_keeps_the_first_gradients_and_frees_later_ones_at_once() {
        let (kept, changed) = keep_gradients(&two_iterations()).unwrap();
        assert_eq!(changed, 2);
        let order: Vec<(u32, EventKind)> =
            kept.events.iter().map(|e| (e.block.0, e.kind)).collect();
        assert!(!order.contains(&(1, EventKind::Free)));
        let made = order
            .iter()
            .position(|&e| e == (3, EventKind::Alloc))
            .unwrap();
        assert_eq!(order[made + 1], (3, EventKind::Free));
    }
}
