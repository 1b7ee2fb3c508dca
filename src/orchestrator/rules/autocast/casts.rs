//! Rules `autocast_input_casts` and `autocast_cpu_only_casts`: the copies
//! autocast makes of an op's inputs.
//!
//! `lower_precision_fp` ops copy each fp32 input to the autocast type,
//! `fp32` ops each lower-precision input to fp32, `promote` ops the narrower
//! inputs to the widest (`cached_cast` in autocast_mode.cpp); the
//! `fp32_set_opt_dtype` ops (softmax, sum, ...) copy nothing. A copy lives
//! while the op runs, unless autograd keeps it for backward: matrix products
//! keep their (cast) inputs, and so do the fp32 ops in [`SAVES_INPUT`]. A
//! CPU trace shows CPU autocast's copies (under `aten::_to_copy`): one the
//! CUDA run makes too (same bytes) is kept, one it does not make is dropped,
//! and a CUDA copy the CPU did not make is added.

use super::{bare, cache, Input, Walk};
use crate::analyzer::GradMode;
use crate::autocast::{CastPolicy, Dtype};
use crate::orchestrator::rules::autocast::AddedBlock;
use crate::orchestrator::rules::RuleId;
use crate::units::{Bytes, Nanos};

/// The fp32-list ops whose backward keeps their input (`self` in the
/// formulas of `tools/autograd/derivatives.yaml`, pytorch/pytorch at
/// d327a787); under CUDA autocast they keep the fp32 copy. The others keep
/// their result (exp, expm1, reciprocal, rsqrt, tan) or nothing.
const SAVES_INPUT: &[&str] = &[
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "log",
    "log10",
    "log1p",
    "log2",
    "pow",
    "sinh",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "group_norm",
    "logsumexp",
    "cdist",
    "dist",
    "pdist",
    "renorm",
];

/// Whether an op (`name`, with `tensors` floating tensor inputs) reads its
/// inputs without autograd keeping any of them: its backward formula uses
/// none of their values (`tools/autograd/derivatives.yaml`, pytorch/pytorch
/// at d327a787: `add`, `sub` and `rsub` pass the gradient on, scaled by
/// `alpha`; `mul` and `div` by a Python number keep only the number; `neg`,
/// `cat`, `clone` and the copies keep nothing), or it is a view of the same
/// elements, whose own readers are matched to the tensor by element count.
pub(super) fn keeps_nothing(name: &str, tensors: usize) -> bool {
    let name = bare(name);
    match name {
        "add" | "add_" | "sub" | "sub_" | "rsub" | "neg" | "cat" | "clone" | "contiguous"
        | "to" | "_to_copy" | "copy_" | "view" | "reshape" | "_reshape_alias" | "_unsafe_view"
        | "transpose" | "permute" | "t" | "unsqueeze" | "squeeze" | "flatten" | "alias"
        | "detach" => true,
        "mul" | "mul_" | "div" | "div_" => tensors <= 1,
        _ => false,
    }
}

/// The type CUDA autocast casts an input of type `input` to under `policy`
/// (`inputs`: all the op's input types), `None` when it leaves it as it is.
pub(super) fn cuda_cast_to(
    policy: Option<CastPolicy>,
    input: Dtype,
    inputs: &[Dtype],
    target: Dtype,
) -> Option<Dtype> {
    if !input.is_castable() {
        return None;
    }
    let to = match policy? {
        CastPolicy::Lower => target,
        CastPolicy::Fp32 => Dtype::F32,
        CastPolicy::Promote => inputs
            .iter()
            .copied()
            .filter(|d| d.is_castable())
            .reduce(Dtype::promote)?,
        CastPolicy::Fp32SetOptDtype | CastPolicy::Fp32AppendDtype | CastPolicy::Banned => {
            return None
        }
    };
    (to != input).then_some(to)
}

/// The input copies of op `index`: CUDA's against the CPU's (`cpu_casts`,
/// the blocks the CPU made under an `aten::_to_copy` inside the op).
pub(super) fn input_casts(
    walk: &mut Walk,
    index: usize,
    policy: Option<CastPolicy>,
    inputs: &[Input],
    mut cpu_casts: Vec<usize>,
) {
    let analysis = walk.analysis;
    let Some(op) = analysis.ops.get(index) else {
        return;
    };
    let types: Vec<Dtype> = inputs.iter().map(|i| i.cuda).collect();
    for input in inputs {
        let Some(to) = cuda_cast_to(policy, input.cuda, &types, walk.target) else {
            continue;
        };
        let size = Bytes(input.numel.saturating_mul(to.size().unwrap_or(4)));
        // The CPU's copy of the same bytes, if it made one.
        let twin = cpu_casts
            .iter()
            .position(|&b| analysis.blocks.get(b).is_some_and(|b| b.size == size))
            .map(|k| cpu_casts.remove(k));
        if let Some(parameter) = input.parameter.filter(|_| to.is_lower()) {
            cache::cast_parameter(walk, index, parameter, size, twin);
            continue;
        }
        if twin.is_some() {
            continue;
        }
        let free = copy_free(walk, index, policy, input);
        walk.plan.added.push(AddedBlock {
            size,
            alloc: op.start,
            free: Some(free),
            op: index,
            rule: RuleId::AutocastInputCasts,
            on: crate::kernels::ArchSet::ALL,
            per_gpu: None,
        });
    }
    // Copies the CPU made and CUDA does not (freed inside the op; a copy
    // kept longer is a tensor the CUDA run also has, whatever its origin).
    for b in cpu_casts {
        let internal = analysis
            .blocks
            .get(b)
            .is_some_and(|b| b.free_ts.is_some_and(|f| f <= op.end));
        if internal {
            walk.plan.dropped.insert(b, RuleId::AutocastCpuOnlyCasts);
        }
    }
}

/// When a copy CUDA makes for op `index` is freed: when the op returns,
/// unless autograd records and the op keeps it for backward; then when the
/// CPU freed the tensor it copies, if that is after the region (autograd
/// kept it too).
fn copy_free(walk: &Walk, index: usize, policy: Option<CastPolicy>, input: &Input) -> Nanos {
    let analysis = walk.analysis;
    let Some(op) = analysis.ops.get(index) else {
        return walk.region.end;
    };
    if walk.region.grad != GradMode::Enabled {
        return op.end;
    }
    let keeps = match policy {
        Some(CastPolicy::Lower) => true,
        Some(CastPolicy::Fp32) => SAVES_INPUT.contains(&bare(analysis.name(op.name))),
        _ => false,
    };
    let cpu_free = input
        .tensor
        .and_then(|t| walk.tensors.get(t))
        .and_then(|t| analysis.blocks.get(t.block))
        .and_then(|b| b.free_ts);
    match cpu_free {
        Some(free) if keeps && free > walk.region.end => free,
        _ => op.end,
    }
}

/// After a region that records autograd: a tensor the CPU kept past the
/// region (for backward, or with a graph no backward frees) that a reader
/// copied under CUDA autocast, and whose every reader that autograd may
/// keep it for made a CUDA cast copy of it (which autograd keeps instead), is
/// freed on CUDA when the model's code lets go of it: when the block of the
/// model that made it returns ([`holders`](super::holders)), and not before
/// its last reader returns.
pub(super) fn saved_copies(walk: &mut Walk) {
    if walk.region.grad != GradMode::Enabled {
        return;
    }
    let analysis = walk.analysis;
    for t in &walk.tensors {
        let (true, true, Some(last)) = (t.only_copied, t.copied, t.last_read) else {
            continue;
        };
        let Some(block) = analysis.blocks.get(t.block) else {
            continue;
        };
        // Kept past the region: freed in backward, or, in a forward that
        // records autograd and runs no backward, when the graph is dropped
        // (the output reassigned, the trace's end).
        let kept = block.free_ts.is_none_or(|f| f > walk.region.end);
        if kept {
            // Its Python references: until the model's block that made it
            // returns (a guess, see `holders`), within the region.
            let held = walk
                .stacks
                .call_end(analysis, block)
                .map_or(last, |end| end.min(walk.region.end).max(last));
            walk.plan
                .freed
                .insert(block.id, (held, RuleId::AutocastInputCasts));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_casts_what_its_policy_names() {
        use Dtype::*;
        let lower = Some(CastPolicy::Lower);
        assert_eq!(cuda_cast_to(lower, F32, &[F32], Bf16), Some(Bf16));
        assert_eq!(cuda_cast_to(lower, Bf16, &[Bf16], Bf16), None);
        assert_eq!(
            cuda_cast_to(Some(CastPolicy::Fp32), Bf16, &[Bf16], Bf16),
            Some(F32)
        );
        assert_eq!(
            cuda_cast_to(Some(CastPolicy::Fp32SetOptDtype), Bf16, &[Bf16], Bf16),
            None
        );
        assert_eq!(
            cuda_cast_to(Some(CastPolicy::Promote), Bf16, &[Bf16, F32], Bf16),
            Some(F32)
        );
        assert_eq!(cuda_cast_to(None, F32, &[F32], Bf16), None);
        assert_eq!(cuda_cast_to(lower, F64, &[F64], Bf16), None);
    }
}
