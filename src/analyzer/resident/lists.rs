//! Tensor-list elements' dtypes: the profiler records none for the
//! elements of a `TensorList` argument, so the op's children tell them.

use super::reads::{Arg, Dtype};
use crate::trace::{list_element_types, CONCATENATIONS};

/// Gives tensor-list elements (`einsum`'s, `cat`'s, `stack`'s operands, for
/// which the profiler records no dtype) the dtype the op's own children
/// record for them ([`list_element_types`]). Sized at the trace's common
/// type, no live block would match them and they would pass for tensors
/// made before the trace (parameters).
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
    // (dims, dtype) of the children's typed arguments, in call order.
    let mut typed: Vec<(Vec<i64>, Dtype)> = Vec::new();
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
                typed.push((
                    trace.numbers(a.dims).to_vec(),
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
    let concatenates = input
        .index
        .ops
        .source_in(idx, &trace.ops)
        .is_some_and(|op| CONCATENATIONS.contains(&trace.name(op.name)));
    let elements: Vec<Option<&[i64]>> = args
        .iter()
        .map(|a| (a.list.is_some() && a.dtype.is_none()).then_some(a.layout.dims.as_slice()))
        .collect();
    let children: Vec<(&[i64], Dtype)> = typed.iter().map(|(d, t)| (d.as_slice(), *t)).collect();
    let types = list_element_types(&elements, &children, concatenates);
    for (a, t) in args.iter_mut().zip(types) {
        if let Some(t) = t {
            a.dtype = Some(t);
        }
    }
}
