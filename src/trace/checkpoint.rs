//! Reentrant activation checkpointing as a trace records it.
//!
//! `torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=True)` runs
//! `CheckpointFunction`, a Python autograd Function. Its backward
//! (`torch/utils/checkpoint.py`, `CheckpointFunction.backward`) detaches the
//! inputs it saved (`detach_variable`: `x = inp.detach();
//! x.requires_grad = inp.requires_grad`), recomputes `fn` from them under
//! `enable_grad`, and runs a nested `torch.autograd.backward` whose graph ends
//! in one `AccumulateGrad` per detached input that requires grad, besides the
//! parameters' of `fn`. The detached inputs are activations (a block's input,
//! `[batch, seq, hidden]`): their `AccumulateGrad` calls are no parameters',
//! and their gradient (the incoming one, stolen without an allocation) is
//! returned by `backward` and dropped at once.
//!
//! In the trace the backward is the op `CheckpointFunctionBackward` (inside
//! `autograd::engine::evaluate_function: CheckpointFunctionBackward`); its
//! first op children are the `aten::detach` of `detach_variable`, before the
//! recomputation's ops; the nested backward runs on the same thread, inside it.

use std::collections::{BTreeMap, BTreeSet};

use super::{Trace, ACCUMULATE_GRAD};

/// A tensor's dims and dtype name, as an op's argument records them.
type Shape = (Vec<i64>, Option<String>);

/// The autograd node of `CheckpointFunction` (reentrant checkpointing).
pub const CHECKPOINT_BACKWARD: &str = "CheckpointFunctionBackward";
/// The op `Tensor.detach()` records.
const DETACH: &str = "aten::detach";

/// The `AccumulateGrad` calls (indices into [`Trace::ops`]) that accumulate
/// into a reentrant checkpoint's detached inputs, not into parameters: inside
/// each `CheckpointFunctionBackward` call (the innermost one around the
/// call), each tensor its leading `aten::detach` children detached claims, by
/// shape and dtype, at most one `AccumulateGrad` call in time order. Without
/// recorded shapes nothing can be matched and the set is empty.
pub fn reentrant_checkpoint_inputs(trace: &Trace) -> BTreeSet<usize> {
    // Per thread: ops sorted by start, longer first; parents by containment.
    let mut order: Vec<usize> = (0..trace.ops.len()).collect();
    order.sort_by_key(|&i| {
        let key = trace
            .ops
            .get(i)
            .map(|o| (o.tid, o.start, std::cmp::Reverse(o.dur)));
        (key, i)
    });
    let end = |i: usize| {
        trace
            .ops
            .get(i)
            .map_or(0, |o| o.start.get().saturating_add(o.dur.get()))
    };
    let mut parent: Vec<Option<usize>> = vec![None; trace.ops.len()];
    let mut stack: Vec<usize> = Vec::new();
    let mut tid = None;
    for &i in &order {
        let Some(o) = trace.ops.get(i) else { continue };
        if tid != Some(o.tid) {
            stack.clear();
            tid = Some(o.tid);
        }
        while stack.last().is_some_and(|&top| end(top) < o.start.get()) {
            stack.pop();
        }
        if let Some(slot) = parent.get_mut(i) {
            *slot = stack.last().copied();
        }
        stack.push(i);
    }
    let is = |i: usize, name: &str| trace.ops.get(i).is_some_and(|o| trace.name(o.name) == name);
    let shape_of = |i: usize| -> Option<Shape> {
        let o = trace.ops.get(i)?;
        let a = trace
            .tensor_args(o)
            .iter()
            .find(|a| a.position == 0 && a.list_index.is_none())?;
        Some((
            trace.numbers(a.dims).to_vec(),
            a.dtype.map(|t| trace.name(t).to_owned()),
        ))
    };
    // The tensors each checkpoint call detached, in the order it ran.
    let mut detached: BTreeMap<usize, Vec<Shape>> = BTreeMap::new();
    let mut children_seen: BTreeMap<usize, bool> = BTreeMap::new();
    for &i in &order {
        let Some(p) = parent.get(i).copied().flatten() else {
            continue;
        };
        if !is(p, CHECKPOINT_BACKWARD) {
            continue;
        }
        // Only the leading run of detach children: the recomputation may
        // detach tensors of its own.
        let leading = children_seen.entry(p).or_insert(true);
        if !*leading {
            continue;
        }
        if is(i, DETACH) {
            if let Some(shape) = shape_of(i) {
                detached.entry(p).or_default().push(shape);
            }
        } else {
            *leading = false;
        }
    }
    let mut found = BTreeSet::new();
    for &i in &order {
        if !is(i, ACCUMULATE_GRAD) {
            continue;
        }
        let mut up = parent.get(i).copied().flatten();
        let mut steps = 0;
        while let Some(p) = up {
            steps += 1;
            if is(p, CHECKPOINT_BACKWARD) || steps > 4096 {
                break;
            }
            up = parent.get(p).copied().flatten();
        }
        let (Some(ckpt), Some(shape)) = (up.filter(|&p| is(p, CHECKPOINT_BACKWARD)), shape_of(i))
        else {
            continue;
        };
        if let Some(inputs) = detached.get_mut(&ckpt) {
            if let Some(k) = inputs.iter().position(|s| *s == shape) {
                inputs.swap_remove(k);
                found.insert(i);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    /// A reentrant checkpoint's backward: `detach_variable` detaches the
    /// block's input ([4, 8]), the recomputation detaches a tensor of its own
    /// ([4, 8] too), and the nested backward accumulates into the weight
    /// ([8, 8]) and the detached input; an `AccumulateGrad` of the same shape
    /// outside any checkpoint is a parameter's.
    const TRACE: &str = r#"{"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: CheckpointFunctionBackward", "pid": 1, "tid": 1, "ts": 100, "dur": 900},
        {"ph": "X", "cat": "cpu_op", "name": "CheckpointFunctionBackward", "pid": 1, "tid": 1, "ts": 101, "dur": 898, "args": {"Input Dims": [[4, 8]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::detach", "pid": 1, "tid": 1, "ts": 110, "dur": 5, "args": {"Input Dims": [[4, 8]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 200, "dur": 50, "args": {"Input Dims": [[4, 8], [8, 8], []], "Input type": ["float", "float", ""]}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::detach", "pid": 1, "tid": 1, "ts": 260, "dur": 5, "args": {"Input Dims": [[4, 8]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 500, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 501, "dur": 18, "args": {"Input Dims": [[8, 8]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 600, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 601, "dur": 18, "args": {"Input Dims": [[4, 8]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 1100, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 1101, "dur": 18, "args": {"Input Dims": [[4, 8]], "Input type": ["float"]}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1200, "args": {"Bytes": 64, "Addr": 9, "Device Type": 0, "Device Id": -1}}
    ]}"#;

    #[test]
    fn only_the_detached_input_of_its_checkpoint_is_a_leaf() {
        let trace = crate::trace::parse(TRACE.as_bytes()).unwrap().value;
        let found = super::reentrant_checkpoint_inputs(&trace);
        let names: Vec<(i64, &str)> = found
            .iter()
            .filter_map(|&i| trace.ops.get(i))
            .map(|o| (o.start.get(), trace.name(o.name)))
            .collect();
        // Only the AccumulateGrad at 601 µs: not the weight's (501), not the
        // one outside the checkpoint (1101), and the recomputation's own
        // detach (260) claims nothing.
        assert_eq!(names, vec![(601_000, "torch::autograd::AccumulateGrad")]);
    }
}
