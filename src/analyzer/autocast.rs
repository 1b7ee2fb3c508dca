//! Autocast regions: where the trace ran under `torch.autocast`, found from
//! the Python frames `with_stack=True` records, with the grad mode inside.
//!
//! `torch.autocast.__enter__` (`torch/amp/autocast_mode.py`; the deprecated
//! `torch.cuda.amp`/`torch.cpu.amp` classes call it too) opens a region. The
//! outermost `__exit__` calls `torch.clear_autocast_cache()`, which empties
//! the cast cache: the region ends there (at the end of the `__exit__` when
//! that call was not recorded). Inside, autograd records when the forward
//! ops' `Sequence number`s advance: the profiler records the counter's
//! current value for every op that passes the autograd dispatch key (under
//! `no_grad` too), and the creation of an autograd node increments it. The
//! casts (`aten::to`, `aten::_to_copy`) are left out: under `no_grad` the
//! traces show each autocast cast of a parameter advancing the counter
//! (torch 2.15, seen, not explained from the source). Otherwise the region runs under no grad: under
//! `torch.inference_mode()` when the `grad_mode.py` context entered last
//! before the region entered the C++ inference-mode guard (its `__enter__`
//! calls a `<built-in method __enter__ ...>`), under `torch.no_grad()` else.
//!
//! The inference-mode contexts are kept too, region or not
//! ([`InferenceSpan`]): CUDA decides whether to cache a cast at each cast,
//! from the inference mode in force then, so an autocast region entered
//! outside `torch.inference_mode()` still casts its weights under it.

use serde::{Deserialize, Serialize};

use super::spans::{Frame, SpanIndex};
use super::{Names, OpSpan};
use crate::trace::{Dtype, TensorInput};
use crate::units::Nanos;

/// How autograd runs inside a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GradMode {
    Enabled,
    NoGrad,
    InferenceMode,
}

/// One outermost `torch.autocast` region of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutocastRegion {
    pub tid: i64,
    pub start: Nanos,
    /// When the cast cache was cleared (the outermost `__exit__`).
    pub end: Nanos,
    pub grad: GradMode,
    /// The lower-precision type ops inside ran in (bf16 or fp16); `None`
    /// when none did (autocast disabled, or asked for another device).
    pub lower: Option<Dtype>,
}

/// A `torch.inference_mode()` context: from its `__enter__` (which entered
/// the C++ guard) to the end of its `__exit__`; a context the trace never
/// exits lasts to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InferenceSpan {
    pub tid: i64,
    pub start: Nanos,
    pub end: Nanos,
}

/// Whether thread `tid` ran under `torch.inference_mode()` at `t`.
pub(crate) fn inference_at(spans: &[InferenceSpan], tid: i64, t: Nanos) -> bool {
    spans
        .iter()
        .any(|s| s.tid == tid && s.start <= t && t <= s.end)
}

const AUTOCAST_FILE: &str = "torch/amp/autocast_mode.py(";
const GRAD_MODE_FILE: &str = "torch/autograd/grad_mode.py(";
const CLEAR_CACHE: &str = "<built-in function clear_autocast_cache>";
const CONTEXT_GUARD: &str = "<built-in method __enter__";

fn is_frame(name: &str, file: &str, function: &str) -> bool {
    name.starts_with(file) && name.ends_with(function)
}

/// The autocast regions of every thread, in time order, and the
/// inference-mode contexts, by thread and start.
/// `args`: the trace's tensor arguments, which the ops' ranges index.
pub(crate) fn find_regions(
    index: &SpanIndex,
    names: &Names,
    args: &[TensorInput],
) -> (Vec<AutocastRegion>, Vec<InferenceSpan>) {
    let frames = &index.frames.spans;
    let name = |f: &Frame| names.get(f.name);
    let child_named = |parent: usize, wanted: &dyn Fn(&str) -> bool| {
        // Children follow their parent in the forest (sorted by start).
        frames
            .iter()
            .skip(parent + 1)
            .take_while(|f| frames.get(parent).is_some_and(|p| f.start <= p.end))
            .find(|f| f.parent == Some(parent) && wanted(name(f)))
            .map(|f| f.start)
    };
    let mut regions = Vec::new();
    // (tid, depth, start of the open region)
    let mut open: Option<(i64, u32, Nanos)> = None;
    // The grad-mode contexts entered and not yet exited: (tid, inference,
    // start).
    let mut grad_stack: Vec<(i64, bool, Nanos)> = Vec::new();
    let mut inference = Vec::new();
    let mut grad_at_open: Option<bool> = None;
    for (i, frame) in frames.iter().enumerate() {
        let text = name(frame);
        let tid = index.frames.tid_of(i);
        if is_frame(text, GRAD_MODE_FILE, "): __enter__") {
            let guard = child_named(i, &|n| n.starts_with(CONTEXT_GUARD)).is_some();
            grad_stack.push((tid, guard, frame.start));
        } else if is_frame(text, GRAD_MODE_FILE, "): __exit__") {
            if let Some(k) = grad_stack.iter().rposition(|&(t, _, _)| t == tid) {
                let (_, guard, start) = grad_stack.remove(k);
                if guard {
                    inference.push(InferenceSpan {
                        tid,
                        start,
                        end: frame.end,
                    });
                }
            }
        } else if is_frame(text, AUTOCAST_FILE, "): __enter__") {
            match &mut open {
                Some((t, depth, _)) if *t == tid => *depth += 1,
                Some(_) => {}
                None => {
                    open = Some((tid, 1, frame.start));
                    grad_at_open = grad_stack
                        .iter()
                        .rev()
                        .find(|&&(t, _, _)| t == tid)
                        .map(|&(_, guard, _)| guard);
                }
            }
        } else if is_frame(text, AUTOCAST_FILE, "): __exit__") {
            let Some((t, depth, start)) = open else {
                continue;
            };
            if t != tid {
                continue;
            }
            if depth > 1 {
                open = Some((t, depth - 1, start));
                continue;
            }
            open = None;
            // Entered during backward: activation checkpointing re-running a
            // forward under the autocast state it saved (`enabled=False`
            // when the forward ran without autocast). Not a region of the
            // forward; a recompute under enabled autocast is left as traced
            // too (a limitation).
            let in_backward = index
                .ops
                .innermost(tid, start)
                .and_then(|o| index.ops.spans.get(o))
                .is_some_and(|o| o.backward);
            if in_backward {
                continue;
            }
            let end = child_named(i, &|n| n == CLEAR_CACHE).unwrap_or(frame.end);
            let grad = if grad_at_open == Some(true) {
                GradMode::InferenceMode
            } else {
                GradMode::NoGrad
            };
            regions.push(AutocastRegion {
                tid,
                start,
                end,
                grad,
                lower: None,
            });
        }
    }
    for region in &mut regions {
        let is_cast = |op: &OpSpan| {
            let name = names.get(op.name);
            name == "aten::to" || name == "aten::_to_copy"
        };
        let (recording, lower) =
            evidence_in(index.ops.of_thread(region.tid), region, args, &is_cast);
        if recording {
            region.grad = GradMode::Enabled;
        }
        region.lower = lower;
    }
    inference.extend(
        grad_stack
            .iter()
            .filter(|&&(_, guard, _)| guard)
            .map(|&(tid, _, start)| InferenceSpan {
                tid,
                start,
                end: Nanos(i64::MAX),
            }),
    );
    inference.sort_by_key(|s| (s.tid, s.start));
    (regions, inference)
}

/// Whether forward ops inside the region (`ops`: its thread's, sorted by
/// start) record autograd (their sequence numbers advance, casts aside), and the
/// lower-precision type of their tensors, if any.
fn evidence_in(
    ops: &[OpSpan],
    region: &AutocastRegion,
    args: &[TensorInput],
    is_cast: &dyn Fn(&OpSpan) -> bool,
) -> (bool, Option<Dtype>) {
    let mut recording = false;
    let mut first_seq = None;
    let mut lower = None;
    let first = ops.partition_point(|o| o.start < region.start);
    let inside = ops
        .iter()
        .skip(first)
        .take_while(|o| o.start <= region.end)
        .filter(|o| !o.backward && o.end <= region.end);
    for op in inside {
        if let Some(seq) = op.sequence_number.filter(|_| !is_cast(op)) {
            recording |= *first_seq.get_or_insert(seq) != seq;
        }
        if lower.is_none() {
            let range = op.inputs.start as usize..op.inputs.end as usize;
            lower = args
                .get(range)
                .unwrap_or(&[])
                .iter()
                .filter_map(|a| a.dtype)
                .find(|d| d.is_lower());
        }
        if recording && lower.is_some() {
            break;
        }
    }
    (recording, lower)
}
