//! The `zero_grad` facts: a `zero_grad` with no marker inferred from how the
//! gradients are freed, then the calls, their placement and `set_to_none`,
//! once every `zero_grad` span is known.

use std::collections::BTreeMap;

use super::evidence::{in_sorted_spans, Evidence};
use super::lifecycle::Life;
use super::spans::SpanIndex;
use super::{BlockRole, Iteration, Names, Phase, ZeroGradFacts, ZeroGradPlacement};
use crate::diag::Warning;
use crate::units::Nanos;

/// The zero_grad facts, once every zero_grad span is known.
pub(crate) fn finish(
    mut found: Evidence,
    life: &mut Life,
    index: &SpanIndex,
    iterations: &[Iteration],
    names: &Names,
) -> Evidence {
    found.zero_grad = zero_grad_facts(life, index, iterations, names);
    found
}

/// A `zero_grad` with no marker: in an iteration with no `zero_grad` span,
/// gradients that are freed outside any op and outside backward were freed
/// by Python dropping them, i.e. by `zero_grad(set_to_none=True)` or
/// `p.grad = None` (the Hugging Face Trainer's `model.zero_grad()` in a trace
/// without Python frames). Their frees become that iteration's `zero_grad`
/// span, so the gradients die there instead of living on.
pub(crate) fn infer_zero_grad(
    life: &mut Life,
    iterations: &mut [Iteration],
    warnings: &mut Vec<Warning>,
) {
    let marked: Vec<bool> = iterations
        .iter()
        .map(|it| it.phases.iter().any(|p| p.phase == Phase::ZeroGrad))
        .collect();
    // (first, last) free of such gradients per unmarked iteration.
    let mut frees: BTreeMap<usize, (Nanos, Nanos)> = BTreeMap::new();
    for block in &life.blocks {
        let (Some(it), Some(ts)) = (block.free_iteration, block.free_ts) else {
            continue;
        };
        let dropped_by_python = matches!(block.role, BlockRole::Gradient { .. })
            && block.free_op.is_none()
            && block.free_phase.is_some_and(|p| p != Phase::Backward);
        if dropped_by_python && !marked.get(it).copied().unwrap_or(true) {
            let slot = frees.entry(it).or_insert((ts, ts));
            slot.0 = slot.0.min(ts);
            slot.1 = slot.1.max(ts);
        }
    }
    let n_inferred = frees.len();
    for (&index, &(start, end)) in &frees {
        let Some(it) = iterations.get_mut(index) else {
            continue;
        };
        it.phases.push(super::PhaseSpan {
            phase: Phase::ZeroGrad,
            start,
            end,
        });
        it.phases
            .sort_by_key(|p| (p.start, std::cmp::Reverse(p.end), p.phase));
        let first_forward = it.phases.iter().find(|p| p.phase == Phase::Forward);
        let first_backward = it.phases.iter().find(|p| p.phase == Phase::Backward);
        it.zero_grad = Some(match (first_forward, first_backward) {
            (Some(f), _) if start < f.start => ZeroGradPlacement::BeforeForward,
            (Some(_), Some(b)) if start < b.start => ZeroGradPlacement::BeforeBackward,
            _ => ZeroGradPlacement::Elsewhere,
        });
        // Events in the new span that no other phase claims are zero_grad's.
        let lo = life.events.partition_point(|e| e.ts < start);
        let hi = life.events.partition_point(|e| e.ts <= end);
        for k in lo..hi {
            let Some(event) = life.events.get_mut(k) else {
                continue;
            };
            if event.phase != Phase::Other || event.iteration != Some(index) {
                continue;
            }
            event.phase = Phase::ZeroGrad;
            let block = event.block;
            let Some(block) = block.and_then(|b| life.blocks.get_mut(b)) else {
                continue;
            };
            if block.free_event == Some(k) {
                block.free_phase = Some(Phase::ZeroGrad);
            } else if block.alloc_event == k {
                block.alloc_phase = Phase::ZeroGrad;
            }
        }
    }
    if n_inferred > 0 {
        warnings.push(Warning::new(
            "zero_grad_inferred",
            format!("{n_inferred} iterations have no zero_grad marker (no Optimizer.zero_grad annotation or zero_grad frame), but their gradients are freed outside any operator, as model.zero_grad() or p.grad = None do; those frees were taken as the iterations' zero_grad"),
        ));
    }
}

fn zero_grad_facts(
    life: &Life,
    index: &SpanIndex,
    iterations: &[Iteration],
    names: &Names,
) -> ZeroGradFacts {
    // Every zero_grad span: annotations, `zero_grad` frames and inferred ones.
    let spans: Vec<(Nanos, Nanos)> = iterations
        .iter()
        .flat_map(|it| it.phases.iter())
        .filter(|p| p.phase == Phase::ZeroGrad)
        .map(|p| (p.start, p.end))
        .collect();
    let n_frees = spans
        .iter()
        .map(|&(s, e)| {
            let lo = life.events.partition_point(|ev| ev.ts < s);
            let hi = life.events.partition_point(|ev| ev.ts <= e);
            life.events
                .get(lo..hi)
                .map_or(0, |evs| evs.iter().filter(|ev| ev.delta < 0).count())
        })
        .sum::<usize>();
    let runs_zero = index
        .ops
        .spans
        .iter()
        .any(|o| names.get(o.name) == "aten::zero_" && in_sorted_spans(&spans, o.start));
    let set_to_none = if n_frees > 0 {
        Some(true)
    } else if runs_zero {
        Some(false)
    } else {
        None
    };
    let mut counts: BTreeMap<ZeroGradPlacement, usize> = BTreeMap::new();
    for placement in iterations.iter().filter_map(|it| it.zero_grad) {
        *counts.entry(placement).or_default() += 1;
    }
    let placement = counts
        .iter()
        .max_by_key(|&(p, n)| (*n, std::cmp::Reverse(*p)))
        .map(|(p, _)| *p);
    ZeroGradFacts {
        n_calls: spans.len(),
        placement,
        set_to_none,
    }
}
