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
    outermost_frames(index, names, &is_backward)
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

/// Every backward pass, in time order: the outermost `backward` Python calls,
/// or without Python frames the runs of top-level autograd-engine ops. Each
/// runs `AccumulateGrad` once per parameter that gets a gradient.
pub(crate) fn backward_passes(index: &SpanIndex, names: &Names) -> Vec<(Nanos, Nanos)> {
    let frames = backward_frames(index, names);
    let spans = if frames.is_empty() {
        backward_op_runs(index, names)
    } else {
        frames
    };
    spans.into_iter().map(|s| (s.start, s.end)).collect()
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
    let zero_grad_spans = zero_grad_spans(index, names);
    let clip_frames = clip_frames(index, names);
    let top_ops = top_level_ops(index, names);
    let no_frames = index.frames.spans.is_empty();
    let mut iterations = Vec::with_capacity(bounds.len());
    for (index_in_trace, (it, label)) in bounds.into_iter().enumerate() {
        let mut phases: Vec<PhaseSpan> = Vec::new();
        let mut push_spans = |spans: &mut dyn Iterator<Item = Span>, phase: Phase| {
            let mut first = None;
            for span in spans.filter(|&s| inside(s, it)) {
                first.get_or_insert(span);
                phases.push(PhaseSpan {
                    phase,
                    start: span.start,
                    end: span.end,
                });
            }
            first
        };
        let span_of = |a: &Annotation| Span {
            start: a.start,
            end: a.end,
        };
        let loads: Vec<Span> = annotations_with(index, names, DATA_PREFIX)
            .map(span_of)
            .filter(|&s| inside(s, it))
            .collect();
        push_spans(&mut loads.iter().copied(), Phase::DataLoading);
        let zero_grad = push_spans(&mut zero_grad_spans.iter().copied(), Phase::ZeroGrad);
        let opt_steps: Vec<Span> = annotations_with(index, names, OPT_STEP_PREFIX)
            .map(span_of)
            .filter(|&s| inside(s, it))
            .collect();
        push_spans(&mut opt_steps.iter().copied(), Phase::OptimizerStep);

        // Micro-batches: every backward pass in the iteration, each with the
        // forward that ran since the previous one (gradient accumulation runs
        // several forward/backward passes per optimizer step).
        let passes: Vec<Span> = backward
            .iter()
            .copied()
            .filter(|b| inside(*b, it))
            .collect();
        let mut forwards: Vec<Span> = Vec::new();
        let mut window_start = it.start;
        let windows: Vec<(Nanos, Nanos)> = if passes.is_empty() {
            vec![(it.start, it.end)]
        } else {
            passes
                .iter()
                .map(|b| {
                    let w = (window_start, b.start);
                    window_start = b.end;
                    w
                })
                .collect()
        };
        // Spans that are not the model's forward even when ops run in them.
        let mut not_forward: Vec<Span> = loads.clone();
        not_forward.extend(zero_grad_spans.iter().copied().filter(|&s| inside(s, it)));
        not_forward.extend(opt_steps.iter().copied());
        for &(from, to) in &windows {
            // The forward starts after the micro-batch's data loading (ops
            // before it are the loader's sampler and collate).
            let from = loads
                .iter()
                .filter(|l| l.start >= from && l.end <= to)
                .map(|l| l.end)
                .max()
                .unwrap_or(from);
            let forward = if no_frames {
                forward_from_ops(&top_ops, from, to, &not_forward)
            } else {
                let modules: Vec<&Span> = top_modules
                    .iter()
                    .filter(|m| {
                        m.start >= from && m.start <= to && (passes.is_empty() || m.end <= to)
                    })
                    .collect();
                match (modules.first(), modules.last()) {
                    (Some(first), Some(last)) => Some(Span {
                        start: first.start,
                        end: last.end.max(first.end),
                    }),
                    _ => None,
                }
            };
            forwards.extend(forward);
        }
        push_spans(&mut forwards.iter().copied(), Phase::Forward);
        push_spans(&mut passes.iter().copied(), Phase::Backward);
        let bwd = passes.first().copied();
        let forward = forwards.first().copied();

        // Gradient clipping: a clip call's frame, or without frames the norm
        // ops between the last backward and the optimizer step.
        let last_backward_end = passes.last().map(|b| b.end);
        let clip: Vec<Span> = if no_frames {
            clip_from_ops(&top_ops, last_backward_end, opt_steps.first().copied(), it)
                .into_iter()
                .collect()
        } else {
            // Lightning calls its clip hook on every step; a call that ran
            // no op clipped nothing.
            clip_frames
                .iter()
                .copied()
                .filter(|&s| inside(s, it))
                .filter(|s| {
                    let lo = top_ops.partition_point(|o| o.span.start < s.start);
                    top_ops.get(lo).is_some_and(|o| o.span.start <= s.end)
                })
                .collect()
        };
        push_spans(&mut clip.iter().copied(), Phase::ClipGrad);
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
            micro_batches: u32::try_from(passes.len()).unwrap_or(u32::MAX),
            zero_grad: placement,
            allocated_by_phase: BTreeMap::new(),
            n_allocs: 0,
            n_frees: 0,
            peak: crate::units::Bytes::ZERO,
        });
    }
    iterations
}

/// `zero_grad` calls: the optimizer's `Optimizer.zero_grad#…` annotation, and
/// the outermost `…: zero_grad` Python frame, which is how `model.zero_grad()`
/// (`nn.Module.zero_grad`, the Hugging Face Trainer's call after each step)
/// shows: it records no annotation, only its frame.
fn zero_grad_spans(index: &SpanIndex, names: &Names) -> Vec<Span> {
    let mut out: Vec<Span> = annotations_with(index, names, ZERO_GRAD_PREFIX)
        .map(|a| Span {
            start: a.start,
            end: a.end,
        })
        .collect();
    out.extend(outermost_frames(index, names, &|name| {
        name.ends_with("): zero_grad")
    }));
    out.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
    out.dedup_by(|later, earlier| later.start <= earlier.end && later.end <= earlier.end);
    out
}

/// The Python function names of gradient-clipping calls: `torch.nn.utils`'s
/// `clip_grad_norm_` / `clip_grad_value_` (and the `_`-less deprecated
/// aliases), Accelerate's `clip_grad_norm_`, Lightning's `clip_gradients`.
const CLIP_FUNCTIONS: &[&str] = &[
    "): clip_grad_norm_",
    "): clip_grad_value_",
    "): clip_grad_norm",
    "): clip_grad_value",
    "): clip_gradients",
];

/// The outermost gradient-clipping calls.
fn clip_frames(index: &SpanIndex, names: &Names) -> Vec<Span> {
    outermost_frames(index, names, &|name| {
        CLIP_FUNCTIONS.iter().any(|f| name.ends_with(f))
    })
}

/// Outermost Python frames whose name matches, in time order.
fn outermost_frames(index: &SpanIndex, names: &Names, matches: &dyn Fn(&str) -> bool) -> Vec<Span> {
    let frames = &index.frames;
    let mut out: Vec<Span> = frames
        .spans
        .iter()
        .enumerate()
        .filter(|(idx, f)| {
            matches(names.get(f.name))
                && !frames
                    .chain(*idx)
                    .skip(1)
                    .filter_map(|p| frames.spans.get(p))
                    .any(|p| matches(names.get(p.name)))
        })
        .map(|(_, f)| Span {
            start: f.start,
            end: f.end,
        })
        .collect();
    out.sort_by_key(|s| (s.start, s.end));
    out
}

/// A top-level op (no enclosing op on its thread): its span and whether it
/// computes a gradient norm (the first op of a clipping call).
#[derive(Debug, Clone, Copy)]
struct TopOp {
    span: Span,
    backward_node: bool,
    norm: bool,
}

/// Ops that compute the norms `clip_grad_norm_` starts with.
const NORM_OPS: &[&str] = &[
    "aten::_foreach_norm",
    "aten::linalg_vector_norm",
    "aten::norm",
];

fn top_level_ops(index: &SpanIndex, names: &Names) -> Vec<TopOp> {
    let mut out: Vec<TopOp> = index
        .ops
        .spans
        .iter()
        .filter(|o| o.parent.is_none())
        .map(|o| {
            let name = names.get(o.name);
            TopOp {
                span: Span {
                    start: o.start,
                    end: o.end,
                },
                backward_node: name.starts_with(BACKWARD_NODE_PREFIX),
                norm: NORM_OPS.contains(&name),
            }
        })
        .collect();
    out.sort_by_key(|o| (o.span.start, o.span.end));
    out
}

/// The forward pass of a trace without Python frames: from the first
/// top-level op in `[from, to]` outside data loading, `zero_grad` and the
/// optimizer step, to the end of the last top-level op before `to`.
fn forward_from_ops(ops: &[TopOp], from: Nanos, to: Nanos, not_forward: &[Span]) -> Option<Span> {
    let outside = |t: Nanos| !not_forward.iter().any(|s| s.start <= t && t <= s.end);
    let lo = ops.partition_point(|o| o.span.start < from);
    let candidates = ops.get(lo..).unwrap_or_default();
    let first = candidates
        .iter()
        .take_while(|o| o.span.start < to)
        .find(|o| !o.backward_node && outside(o.span.start))?;
    let end = candidates
        .iter()
        .take_while(|o| o.span.start < to)
        .filter(|o| !o.backward_node && outside(o.span.start))
        .map(|o| o.span.end.min(to))
        .max()?;
    Some(Span {
        start: first.span.start,
        end: end.max(first.span.start),
    })
}

/// Gradient clipping in a trace without Python frames: the first norm op
/// after the last backward pass and before the optimizer step, to the end
/// of the last top-level op before that step.
fn clip_from_ops(
    ops: &[TopOp],
    after: Option<Nanos>,
    step: Option<Span>,
    it: Span,
) -> Option<Span> {
    let (after, step) = (after?, step?);
    let lo = ops.partition_point(|o| o.span.start < after);
    let between = ops
        .get(lo..)
        .unwrap_or_default()
        .iter()
        .take_while(|o| o.span.start < step.start && o.span.start <= it.end);
    let mut start = None;
    let mut end = None;
    for op in between {
        if op.norm && start.is_none() {
            start = Some(op.span.start);
        }
        if start.is_some() {
            end = Some(op.span.end.min(step.start));
        }
    }
    let (start, end) = (start?, end?);
    Some(Span {
        start,
        end: end.max(start),
    })
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
            micro_batches: 0,
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

    fn top(start: i64, end: i64, backward_node: bool, norm: bool) -> TopOp {
        TopOp {
            span: Span {
                start: Nanos(start),
                end: Nanos(end),
            },
            backward_node,
            norm,
        }
    }

    #[test]
    fn forward_without_frames_runs_from_the_first_model_op_to_backward() {
        // loader op [0,10] inside data loading, model ops [20,30] [40,60],
        // an op inside zero_grad [62,64], backward node [70,90].
        let ops = [
            top(0, 10, false, false),
            top(20, 30, false, false),
            top(40, 60, false, false),
            top(62, 64, false, false),
            top(70, 90, true, false),
        ];
        let not_forward = [
            Span {
                start: Nanos(0),
                end: Nanos(12),
            },
            Span {
                start: Nanos(61),
                end: Nanos(65),
            },
        ];
        let f = forward_from_ops(&ops, Nanos(0), Nanos(70), &not_forward).unwrap();
        assert_eq!((f.start, f.end), (Nanos(20), Nanos(60)));
        // Nothing but markers and backward: no forward.
        assert_eq!(forward_from_ops(&ops[4..], Nanos(0), Nanos(95), &[]), None);
    }

    #[test]
    fn clipping_without_frames_runs_from_the_first_norm_to_the_step() {
        let ops = [
            top(0, 50, true, false),
            top(55, 58, false, false),
            top(60, 70, false, true),
            top(72, 80, false, false),
            top(90, 99, false, false),
        ];
        let step = Span {
            start: Nanos(85),
            end: Nanos(99),
        };
        let it = Span {
            start: Nanos(0),
            end: Nanos(100),
        };
        let clip = clip_from_ops(&ops, Some(Nanos(50)), Some(step), it).unwrap();
        assert_eq!((clip.start, clip.end), (Nanos(60), Nanos(80)));
        // No norm op between backward and step: no clipping.
        assert_eq!(
            clip_from_ops(&ops[..2], Some(Nanos(50)), Some(step), it),
            None
        );
        assert_eq!(clip_from_ops(&ops, None, Some(step), it), None);
    }
}
