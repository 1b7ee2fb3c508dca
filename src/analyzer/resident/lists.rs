//! Tensor-list elements' dtypes: the profiler records none for the
//! elements of a `TensorList` argument, so the op's children tell them.

use super::reads::{Arg, Dtype};

/// Gives tensor-list elements (`einsum`'s, `cat`'s, `stack`'s operands, for
/// which the profiler records no dtype) the dtype the op's own children
/// record for them: the op hands each element to a view, a `bmm` or a copy
/// whose `Input type` is kept, the first child argument of the same dims
/// (each taken once), else of the same element count. Under autocast an
/// `einsum` reads bf16 probabilities and products in an fp32 trace; sized
/// at the trace's common type, no live block matches them and they would
/// pass for tensors made before the trace (parameters).
pub(super) fn list_dtypes_from_children(
    input: &super::Inputs<'_>,
    idx: usize,
    args: &mut [Arg],
    dtype_of: &mut impl FnMut(crate::trace::NameId) -> Option<(u64, bool)>,
) {
    if !args.iter().any(|a| a.list.is_some() && a.dtype.is_none()) {
        return;
    }
    let trace = input.trace;
    let spans = &input.index.ops.spans;
    let Some(end) = spans.get(idx).map(|s| s.end) else {
        return;
    };
    // (dims, numel, dtype) of the children's typed arguments, in call order.
    let mut typed: Vec<(Vec<i64>, i64, Dtype)> = Vec::new();
    let mut j = idx + 1;
    while let Some(child) = spans.get(j) {
        if child.start > end || typed.len() >= 64 {
            break;
        }
        if let Some(src) = input.index.ops.source_in(j, &trace.ops) {
            for a in trace.tensor_args(src) {
                let Some(id) = a.dtype else { continue };
                let Some((size, floating)) = dtype_of(id) else {
                    continue;
                };
                let dims = trace.numbers(a.dims).to_vec();
                let numel = dims.iter().fold(1_i64, |n, &d| n.saturating_mul(d));
                typed.push((
                    dims,
                    numel,
                    Dtype {
                        size,
                        name: id.0,
                        floating,
                    },
                ));
            }
        }
        j += 1;
    }
    let mut used = vec![false; typed.len()];
    for a in args
        .iter_mut()
        .filter(|a| a.list.is_some() && a.dtype.is_none())
    {
        let numel = a
            .layout
            .dims
            .iter()
            .fold(1_i64, |n, &d| n.saturating_mul(d));
        let pick = (0..typed.len())
            .find(|&k| !used[k] && typed[k].0 == a.layout.dims)
            .or_else(|| (0..typed.len()).find(|&k| !used[k] && typed[k].1 == numel && numel > 0));
        if let Some(k) = pick {
            used[k] = true;
            a.dtype = Some(typed[k].2);
        }
    }
    // A concatenation writes each element into a view of its output
    // (`narrow`), so where no child shows an element, the view of the whole
    // output does: it has every element's values, in the dtype they share
    // (`cat`'s result type, the elements' own where none is promoted; under
    // autocast a bf16 `rotate_half` in an fp32 trace).
    let concatenates = input
        .index
        .ops
        .source_in(idx, &trace.ops)
        .is_some_and(|op| CONCATENATIONS.contains(&trace.name(op.name)));
    if !concatenates {
        return;
    }
    let numel = |a: &Arg| {
        a.layout
            .dims
            .iter()
            .fold(1_i64, |n, &d| n.saturating_mul(d))
    };
    let total = args
        .iter()
        .filter(|a| a.list.is_some())
        .map(numel)
        .fold(0_i64, i64::saturating_add);
    let Some(output) = typed
        .iter()
        .find(|t| t.1 == total && total > 0)
        .map(|t| t.2)
    else {
        return;
    };
    for a in args
        .iter_mut()
        .filter(|a| a.list.is_some() && a.dtype.is_none())
    {
        a.dtype = Some(output);
    }
}

/// Ops whose output is their tensor-list operands laid end to end.
const CONCATENATIONS: [&str; 6] = [
    "aten::cat",
    "aten::_cat",
    "aten::concat",
    "aten::concatenate",
    "aten::stack",
    "aten::hstack",
];
