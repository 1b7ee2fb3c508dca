//! Iterations and their phases.
//!
//! With a profiler schedule every iteration is a `ProfilerStep#N` annotation.
//! Without one there are no step markers, so iterations are cut from the
//! repeated pattern: each `Optimizer.step` (or, without optimizer annotations,
//! each `backward` call) closes an iteration, and the next one opens at the
//! first DataLoader fetch, `zero_grad` or top-level module call after it.

use std::collections::BTreeMap;

use super::spans::{Annotation, SpanIndex};
use super::{Iteration, Names, Phase, PhaseSpan, ZeroGradPlacement};
use crate::diag::Warning;
use crate::units::Nanos;

const STEP_PREFIX: &str = "ProfilerStep#";
const DATA_PREFIX: &str = "enumerate(DataLoader)";
pub(crate) const ZERO_GRAD_PREFIX: &str = "Optimizer.zero_grad#";
pub(crate) const OPT_STEP_PREFIX: &str = "Optimizer.step#";
const BACKWARD_NODE_PREFIX: &str = "autograd::engine::evaluate_function";

/// A closed interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: Nanos,
    end: Nanos,
}

fn annotations_with<'a>(
    index: &'a SpanIndex,
    names: &'a Names,
    prefix: &'a str,
) -> impl Iterator<Item = &'a Annotation> + 'a {
    index
        .annotations
        .iter()
        .filter(move |a| names.get(a.name).starts_with(prefix))
}

/// Outermost `backward` Python calls (`torch/_tensor.py(..): backward`,
/// `torch/autograd/__init__.py(..): backward`), in time order.
fn backward_frames(index: &SpanIndex, names: &Names) -> Vec<Span> {
    let is_backward = |name: &str| {
        name.ends_with("): backward")
            && (name.starts_with("torch/_tensor.py(") || name.starts_with("torch/autograd/"))
    };
    let frames = &index.frames;
    let mut out: Vec<Span> = frames
        .spans
        .iter()
        .enumerate()
        .filter(|(idx, f)| {
            is_backward(names.get(f.name))
                && !frames
                    .chain(*idx)
                    .skip(1)
                    .filter_map(|p| frames.spans.get(p))
                    .any(|p| is_backward(names.get(p.name)))
        })
        .map(|(_, f)| Span {
            start: f.start,
            end: f.end,
        })
        .collect();
    out.sort_by_key(|s| (s.start, s.end));
    out
}

/// Backward passes found from top-level autograd-engine ops alone, for traces
/// without Python frames: runs of consecutive top-level backward nodes.
fn backward_op_runs(index: &SpanIndex, names: &Names) -> Vec<Span> {
    let mut tops: Vec<(Nanos, Nanos, bool)> = index
        .ops
        .spans
        .iter()
        .filter(|o| o.parent.is_none())
        .map(|o| {
            let node = names.get(o.name).starts_with(BACKWARD_NODE_PREFIX);
            (o.start, o.end, node)
        })
        .collect();
    tops.sort();
    let mut runs: Vec<Span> = Vec::new();
    let mut current: Option<Span> = None;
    for (start, end, node) in tops {
        match (node, current.as_mut()) {
            (true, Some(run)) => run.end = run.end.max(end),
            (true, None) => current = Some(Span { start, end }),
            // `aten::ones_like` seeds backward; other forward-side ops end a run.
            (false, Some(_)) => runs.extend(current.take()),
            (false, None) => {}
        }
    }
    runs.extend(current);
    runs
}

/// The calls of the top-level module called most often (ties: the first
/// called), in time order.
fn repeated_top_module_calls(index: &SpanIndex, names: &Names) -> Vec<Span> {
    let mut by_name: BTreeMap<&str, Vec<Span>> = BTreeMap::new();
    for frame in index.frames.spans.iter().filter(|f| f.top_module) {
        by_name
            .entry(names.get(frame.name))
            .or_default()
            .push(Span {
                start: frame.start,
                end: frame.end,
            });
    }
    let mut best: Option<Vec<Span>> = None;
    for calls in by_name.into_values() {
        let better = best.as_ref().is_none_or(|b| {
            (
                calls.len(),
                std::cmp::Reverse(calls.first().map(|c| c.start)),
            ) > (b.len(), std::cmp::Reverse(b.first().map(|c| c.start)))
        });
        if better {
            best = Some(calls);
        }
    }
    let mut calls = best.unwrap_or_default();
    calls.sort_by_key(|s| (s.start, s.end));
    calls
}

/// Finds the iterations and their phases, in time order.
pub(crate) fn find_iterations(
    index: &SpanIndex,
    trace_end: Nanos,
    names: &Names,
    warnings: &mut Vec<Warning>,
) -> Vec<Iteration> {
    let backward = {
        let frames = backward_frames(index, names);
        if frames.is_empty() {
            backward_op_runs(index, names)
        } else {
            frames
        }
    };
    let top_modules: Vec<Span> = {
        let mut v: Vec<Span> = index
            .frames
            .spans
            .iter()
            .filter(|f| f.top_module)
            .map(|f| Span {
                start: f.start,
                end: f.end,
            })
            .collect();
        v.sort_by_key(|s| (s.start, s.end));
        v
    };

    // Iteration bounds and labels.
    let steps: Vec<&Annotation> = {
        let mut by_start: BTreeMap<(Nanos, Nanos), &Annotation> = BTreeMap::new();
        for a in annotations_with(index, names, STEP_PREFIX) {
            by_start.entry((a.start, a.end)).or_insert(a);
        }
        by_start.into_values().collect()
    };
    let bounds: Vec<(Span, Option<String>)> = if steps.is_empty() {
        let opt_steps: Vec<Span> = annotations_with(index, names, OPT_STEP_PREFIX)
            .map(|a| Span {
                start: a.start,
                end: a.end,
            })
            .collect();
        // Without optimizer steps, each backward closes an iteration; without
        // backward either (an inference loop), each call of the most frequent
        // top-level module does.
        let anchors = if !opt_steps.is_empty() {
            opt_steps
        } else if !backward.is_empty() {
            backward.clone()
        } else {
            repeated_top_module_calls(index, names)
        };
        if anchors.is_empty() {
            warnings.push(Warning::new(
                "no_iterations_found",
                "no ProfilerStep#N, Optimizer.step, backward or nn.Module call was found, so the whole trace is taken as one iteration; profile with a torch.profiler schedule and with_stack=True",
            ));
            vec![(
                Span {
                    start: Nanos::ZERO,
                    end: trace_end,
                },
                None,
            )]
        } else {
            warnings.push(Warning::new(
                "iterations_inferred",
                format!("the trace has no ProfilerStep#N markers (no profiler schedule); {} iterations were inferred from the optimizer-step/backward/module-call pattern", anchors.len()),
            ));
            let openers: Vec<Nanos> = annotations_with(index, names, DATA_PREFIX)
                .chain(annotations_with(index, names, ZERO_GRAD_PREFIX))
                .map(|a| a.start)
                .chain(top_modules.iter().map(|m| m.start))
                .collect();
            let mut starts = vec![Nanos::ZERO];
            for pair in anchors.windows(2) {
                let [prev, next] = pair else { continue };
                let opener = openers
                    .iter()
                    .copied()
                    .filter(|&t| t >= prev.end && t <= next.start)
                    .min()
                    .unwrap_or(prev.end);
                starts.push(opener);
            }
            // Closed intervals: each ends just before the next one opens.
            let ends = starts
                .iter()
                .skip(1)
                .map(|s| s.saturating_sub(Nanos(1)))
                .chain([trace_end]);
            starts
                .iter()
                .zip(ends)
                .map(|(&start, end)| (Span { start, end }, None))
                .collect()
        }
    } else {
        steps
            .iter()
            .map(|a| {
                (
                    Span {
                        start: a.start,
                        end: a.end,
                    },
                    Some(names.get(a.name).to_owned()),
                )
            })
            .collect()
    };

    let inside = |s: Span, it: Span| s.start >= it.start && s.start <= it.end;
    let mut iterations = Vec::with_capacity(bounds.len());
    for (index_in_trace, (it, label)) in bounds.into_iter().enumerate() {
        let mut phases: Vec<PhaseSpan> = Vec::new();
        let mut push_annotations = |prefix: &str, phase: Phase| {
            let mut first = None;
            for a in annotations_with(index, names, prefix) {
                let span = Span {
                    start: a.start,
                    end: a.end,
                };
                if inside(span, it) {
                    first.get_or_insert(span);
                    phases.push(PhaseSpan {
                        phase,
                        start: a.start,
                        end: a.end,
                    });
                }
            }
            first
        };
        push_annotations(DATA_PREFIX, Phase::DataLoading);
        let zero_grad = push_annotations(ZERO_GRAD_PREFIX, Phase::ZeroGrad);
        push_annotations(OPT_STEP_PREFIX, Phase::OptimizerStep);
        let bwd = backward.iter().copied().find(|b| inside(*b, it));
        if let Some(b) = bwd {
            phases.push(PhaseSpan {
                phase: Phase::Backward,
                start: b.start,
                end: b.end,
            });
        }
        let before_backward = |s: &Span| bwd.is_none_or(|b| s.end <= b.start);
        let fwd_modules: Vec<Span> = top_modules
            .iter()
            .copied()
            .filter(|m| inside(*m, it) && before_backward(m))
            .collect();
        let forward = match (fwd_modules.first(), fwd_modules.last()) {
            (Some(first), Some(last)) => Some(Span {
                start: first.start,
                end: last.end.max(first.end),
            }),
            _ => None,
        };
        if let Some(f) = forward {
            phases.push(PhaseSpan {
                phase: Phase::Forward,
                start: f.start,
                end: f.end,
            });
        }
        phases.sort_by_key(|p| (p.start, std::cmp::Reverse(p.end), p.phase));

        let placement = zero_grad.map(|z| match (forward, bwd) {
            (Some(f), _) if z.start < f.start => ZeroGradPlacement::BeforeForward,
            (Some(_), Some(b)) if z.start < b.start => ZeroGradPlacement::BeforeBackward,
            (Some(_), None) => ZeroGradPlacement::BeforeBackward,
            _ => ZeroGradPlacement::Elsewhere,
        });

        iterations.push(Iteration {
            index: index_in_trace,
            label,
            start: it.start,
            end: it.end,
            phases,
            zero_grad: placement,
            allocated_by_phase: BTreeMap::new(),
            n_allocs: 0,
            n_frees: 0,
            peak: crate::units::Bytes::ZERO,
        });
    }
    iterations
}

/// The iteration and phase at time `t`. Phases that overlap resolve to the
/// one that started last (the more specific one).
pub(crate) fn locate(iterations: &[Iteration], t: Nanos) -> (Option<usize>, Phase) {
    let n_started = iterations.partition_point(|it| it.start <= t);
    let Some(it) = n_started
        .checked_sub(1)
        .and_then(|i| iterations.get(i))
        .filter(|it| t <= it.end)
    else {
        return (None, Phase::Other);
    };
    let phase = it
        .phases
        .iter()
        .filter(|p| p.start <= t && t <= p.end)
        .max_by_key(|p| p.start)
        .map_or(Phase::Other, |p| p.phase);
    (Some(it.index), phase)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::Bytes;

    fn iteration(index: usize, start: i64, end: i64, phases: &[(Phase, i64, i64)]) -> Iteration {
        Iteration {
            index,
            label: None,
            start: Nanos(start),
            end: Nanos(end),
            phases: phases
                .iter()
                .map(|&(phase, s, e)| PhaseSpan {
                    phase,
                    start: Nanos(s),
                    end: Nanos(e),
                })
                .collect(),
            zero_grad: None,
            allocated_by_phase: BTreeMap::new(),
            n_allocs: 0,
            n_frees: 0,
            peak: Bytes::ZERO,
        }
    }

    #[test]
    fn locate_finds_iteration_and_most_specific_phase() {
        let its = [
            iteration(
                0,
                0,
                100,
                &[(Phase::Forward, 10, 50), (Phase::ZeroGrad, 40, 45)],
            ),
            iteration(1, 200, 300, &[(Phase::Backward, 210, 290)]),
        ];
        assert_eq!(locate(&its, Nanos(-1)), (None, Phase::Other));
        assert_eq!(locate(&its, Nanos(5)), (Some(0), Phase::Other));
        assert_eq!(locate(&its, Nanos(10)), (Some(0), Phase::Forward));
        assert_eq!(locate(&its, Nanos(42)), (Some(0), Phase::ZeroGrad));
        assert_eq!(locate(&its, Nanos(100)), (Some(0), Phase::Other));
        assert_eq!(locate(&its, Nanos(150)), (None, Phase::Other));
        assert_eq!(locate(&its, Nanos(290)), (Some(1), Phase::Backward));
        assert_eq!(locate(&its, Nanos(301)), (None, Phase::Other));
        assert_eq!(locate(&[], Nanos(0)), (None, Phase::Other));
    }
}
