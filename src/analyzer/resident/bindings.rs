//! The layout a block holds from its allocation, where the op that made it
//! says so: the engine's reads then cannot bind it to another tensor of the
//! same byte size (`reads::LiveBlocks::explain` binds an unbound block to
//! the first tensor read from it).
//!
//! - A batch block holds the shape the loader's collate function stacked.
//! - A block a top-level conversion or copy makes (`to`, `_to_copy`,
//!   `type_as`, `clone`, `contiguous`, `float`, `half`, `bfloat16`) holds
//!   its input's shape: these ops keep the shape and change only the dtype or
//!   the layout. Without it a read of an unrelated same-size tensor between
//!   the copy and its first reader (Llama's rotary `inv_freq` of 32 floats
//!   beside a `[2, 16, 1]` float position copy, both 128 bytes) takes the
//!   copy's block, and the copy's own read is left unexplained: state.

use super::Inputs;
use crate::analyzer::BlockRole;

/// Ops whose output has their first argument's shape.
const SHAPE_KEEPING: &[&str] = &[
    "aten::to",
    "aten::_to_copy",
    "aten::type_as",
    "aten::clone",
    "aten::contiguous",
    "aten::float",
    "aten::half",
    "aten::bfloat16",
];

/// The layout a block of `role` made by `op` holds from its allocation
/// (see the module doc), if the trace says.
pub(super) fn bound_dims(
    input: &Inputs<'_>,
    role: BlockRole,
    op: Option<usize>,
) -> Option<Vec<i64>> {
    if role == BlockRole::Batch {
        return collated_dims(input, op);
    }
    let ops = &input.index.ops;
    let outermost = ops.chain(op?).last()?;
    let name = input.names.get(ops.spans.get(outermost)?.name);
    if !SHAPE_KEEPING.contains(&name) {
        return None;
    }
    let source = ops.source_in(outermost, &input.trace.ops)?;
    let first = input
        .trace
        .tensor_args(source)
        .iter()
        .find(|a| a.position == 0 && a.list_index.is_none())?;
    Some(input.trace.numbers(first.dims).to_vec())
}

/// The shape a collate op stacked: the number of samples, then a sample's dims.
fn collated_dims(input: &Inputs<'_>, op: Option<usize>) -> Option<Vec<i64>> {
    let ops = &input.index.ops;
    let stack = ops.chain(op?).find(|&i| {
        ops.spans
            .get(i)
            .is_some_and(|o| input.names.get(o.name) == "aten::stack")
    })?;
    let source = ops.source_in(stack, &input.trace.ops)?;
    let args = input.trace.tensor_args(source);
    let first = args
        .iter()
        .find(|a| a.position == 0 && a.list_index == Some(0))?;
    let n = args
        .iter()
        .filter(|a| a.position == 0 && a.list_index.is_some())
        .count();
    let mut dims = vec![i64::try_from(n).ok()?];
    dims.extend_from_slice(input.trace.numbers(first.dims));
    Some(dims)
}
