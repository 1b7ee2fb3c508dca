//! Rules `autocast_fp32_ops`, `autocast_lower_ops` and `autocast_promotion`:
//! the dtype of each op's outputs under CUDA autocast.
//!
//! CUDA autocast runs the ops of its `fp32` lists in fp32 (exp, log, pow,
//! softmax, sum, the norms and losses: CPU autocast lists none of them, so a
//! CPU trace shows them in bf16), the ops of its lower-precision list in the
//! autocast type, and every other op on the types it is given, promoted as
//! PyTorch promotes (an fp32 input makes the output fp32). An output whose
//! type differs from the CPU's changes size by the ratio of element sizes.

use std::collections::BTreeMap;

use super::{bare, op_chain, Walk};
use crate::analyzer::{Analysis, OpSpan};
use crate::autocast::{policy_of, CastPolicy, Device, Dtype, PolicyVersion};
use crate::orchestrator::rules::RuleId;
use crate::units::Bytes;

/// Ops that return an integer tensor next to their values (indices, which
/// keep their type): only the values follow the rules.
const INDEX_OUTPUTS: &[&str] = &[
    "max",
    "min",
    "sort",
    "topk",
    "kthvalue",
    "mode",
    "median",
    "nanmedian",
    "cummax",
    "cummin",
    "max_pool2d_with_indices",
    "max_pool3d_with_indices",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
];

/// The policy CPU autocast applied to `op`: its own, or, for an op it does
/// not list, that of the last listed op inside it with no listed op between
/// (CPU autocast intercepts the ops an unlisted composite such as `einsum`
/// calls, so `einsum` runs in bf16 through its `bmm`).
pub(super) fn cpu_policy(
    analysis: &Analysis,
    version: &PolicyVersion,
    op: usize,
) -> Option<CastPolicy> {
    let policy = |o: &OpSpan| policy_of(version, Device::Cpu, analysis.name(o.name));
    let top = analysis.ops.get(op)?;
    if let Some(own) = policy(top) {
        return Some(own);
    }
    // Ops are sorted by thread, then start: an op's descendants follow it.
    let mut last = None;
    for (i, o) in analysis.ops.iter().enumerate().skip(op + 1) {
        if o.tid != top.tid || o.start > top.end {
            break;
        }
        let Some(p) = policy(o) else {
            continue;
        };
        let shadowed = op_chain(analysis, o.parent)
            .take_while(|a| !std::ptr::eq(*a, top))
            .any(|a| policy(a).is_some());
        if !shadowed {
            last = Some((i, p));
        }
    }
    last.map(|(_, p)| p)
}

/// The type of an op's floating output under `policy` with these input
/// types; `None` when no input is floating.
pub(super) fn output_dtype(
    policy: Option<CastPolicy>,
    inputs: &[Dtype],
    lower: Dtype,
) -> Option<Dtype> {
    let promoted = inputs
        .iter()
        .copied()
        .filter(|d| d.size().is_some())
        .reduce(Dtype::promote)?;
    let castable = inputs.iter().any(|d| d.is_castable());
    Some(match policy {
        Some(CastPolicy::Lower) if castable => lower,
        Some(p) if p.outputs_fp32() && castable => Dtype::F32,
        _ => promoted,
    })
}

/// The blocks allocated under a top-level op, split into CPU autocast's
/// casts (made inside an `aten::_to_copy` called by an op of the CPU list)
/// and the outputs (alive when the op returns; for ops that also return
/// indices, the values only). Other casts (a Python scalar made a tensor,
/// an explicit `.to()`) are neither. `cpu_autocast`: the CPU policy, when
/// the trace ran under CPU autocast.
pub(super) fn split_blocks(
    analysis: &Analysis,
    cpu_autocast: Option<&PolicyVersion>,
    dropped: &BTreeMap<usize, RuleId>,
    op: &OpSpan,
    blocks: &[usize],
) -> (Vec<usize>, Vec<usize>) {
    let mut casts = Vec::new();
    let mut outputs = Vec::new();
    for &b in blocks {
        let Some(block) = analysis.blocks.get(b) else {
            continue;
        };
        if dropped.contains_key(&b) {
            continue;
        }
        let mut chain = op_chain(analysis, block.alloc_op);
        let in_cast = chain
            .by_ref()
            .any(|o| analysis.name(o.name) == "aten::_to_copy");
        let autocast = in_cast
            && cpu_autocast.is_some_and(|version| {
                chain.any(|o| policy_of(version, Device::Cpu, analysis.name(o.name)).is_some())
            });
        if autocast {
            casts.push(b);
        } else if in_cast {
            continue;
        } else if block.free_ts.is_none_or(|f| f > op.end) {
            outputs.push(b);
        }
    }
    (casts, outputs)
}

/// The outputs of an op that also returns indices, without the index
/// blocks (an int64 index block is 8 / (element size) times the size of
/// its values block); other ops' outputs as they are.
pub(super) fn values_only(
    analysis: &Analysis,
    op: &OpSpan,
    mut outputs: Vec<usize>,
    cpu_out: Option<Dtype>,
) -> Vec<usize> {
    if INDEX_OUTPUTS.contains(&bare(analysis.name(op.name))) {
        let ratio = 8 / cpu_out.and_then(Dtype::size).unwrap_or(8);
        let sizes: Vec<u64> = outputs
            .iter()
            .filter_map(|&b| analysis.blocks.get(b))
            .map(|b| b.size.get())
            .collect();
        outputs.retain(|&b| {
            analysis.blocks.get(b).is_some_and(|x| {
                let size = x.size.get();
                !(ratio > 1 && size % ratio == 0 && sizes.contains(&(size / ratio)))
            })
        });
    }
    outputs
}

/// Resizes the outputs of op `index` whose CUDA type differs from the
/// CPU's, and starts following them.
pub(super) fn outputs(
    walk: &mut Walk,
    index: usize,
    cuda_policy: Option<CastPolicy>,
    cpu_out: Option<Dtype>,
    cuda_out: Option<Dtype>,
    outputs: &[usize],
) {
    let (Some(cpu_out), Some(cuda_out)) = (cpu_out, cuda_out) else {
        return;
    };
    let (Some(cpu_size), Some(cuda_size)) = (cpu_out.size(), cuda_out.size()) else {
        return;
    };
    let rule = match cuda_policy {
        Some(p) if p.outputs_fp32() => RuleId::AutocastFp32Ops,
        Some(CastPolicy::Lower) => RuleId::AutocastLowerOps,
        _ => RuleId::AutocastPromotion,
    };
    let changed = cuda_size != cpu_size && cpu_out.is_castable();
    if changed {
        walk.factors.insert(index, (cpu_size, cuda_size));
    }
    for &b in outputs {
        let Some(block) = walk.analysis.blocks.get(b) else {
            continue;
        };
        let numel = block.size.get() / cpu_size;
        if changed {
            let new = Bytes(numel.saturating_mul(cuda_size));
            walk.plan.resized.insert(b, (new, rule));
        }
        walk.track(b, numel, cpu_out, cuda_out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_types_follow_the_policy_then_promotion() {
        use Dtype::*;
        let lower = Some(CastPolicy::Lower);
        let fp32 = Some(CastPolicy::Fp32);
        let opt = Some(CastPolicy::Fp32SetOptDtype);
        assert_eq!(output_dtype(lower, &[F32, F32], Bf16), Some(Bf16));
        assert_eq!(output_dtype(fp32, &[Bf16], Bf16), Some(F32));
        assert_eq!(output_dtype(opt, &[Bf16], Bf16), Some(F32));
        // Unlisted: promotion; an fp32 input wins over bf16.
        assert_eq!(output_dtype(None, &[Bf16, F32], Bf16), Some(F32));
        assert_eq!(output_dtype(None, &[Bf16, Bf16], Bf16), Some(Bf16));
        assert_eq!(output_dtype(None, &[Bf16, NonFloat], Bf16), Some(Bf16));
        // No floating input: no floating output; double is left alone.
        assert_eq!(output_dtype(lower, &[NonFloat], Bf16), None);
        assert_eq!(output_dtype(lower, &[F64], Bf16), Some(F64));
        assert_eq!(
            output_dtype(Some(CastPolicy::Promote), &[F16, Bf16], F16),
            Some(F32)
        );
    }
}
