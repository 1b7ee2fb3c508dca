//! Rule `bnb_cuda_kernels`: bitsandbytes' CUDA kernels allocate what their
//! CPU backend does not. On the CPU, several of its ops are Python over
//! ATen (bitsandbytes 0.50, `backends/default/ops.py`, `backends/cpu/ops.py`):
//! `int8_linear_matmul` multiplies float32 copies of both int8 operands
//! (the weight's copy is four times the int8 weight), `int8_mm_dequant` and
//! `int8_vectorwise_quant` run through float32 temporaries of the whole
//! matrix, and the fallback `dequantize_4bit` decodes through int32 and
//! lookup temporaries. Their CUDA kernels (`backends/cuda/ops.py`) allocate
//! their outputs and, for some, a documented temporary:
//!
//! | op | CUDA temporaries while the op runs |
//! |---|---|
//! | `int8_linear_matmul` (K a multiple of 4) | none: cuBLASLt's int32 output only |
//! | `int8_mm_dequant` | the float16 `[M, N]` result, cast to the layer's dtype (none when that is float16) |
//! | `int8_vectorwise_quant` | the float16 `|A|` `[M, K]` and the bool outlier mask `[M, K]` |
//! | `dequantize_4bit`, `dequantize_blockwise` | none |
//! | `gemm_4bit` with M ≤ 4 rows (float32: M < 8) | none: the fused 4-bit kernel, no dequantized weight |
//! | `gemv_4bit` on the CPU's re-laid-out weight | what `gemm_4bit` makes on the weight as loaded: as above, or the fallback's float32 absmax (two, with double quantisation) and the dequantized `[N, K]` weight in the input's dtype |
//!
//! On a CPU with AVX512-BF16, the first eval-mode call of a 4-bit layer
//! without grad re-lays its weight out for the CPU kernel
//! (`_convert_weight_packed_for_cpu`); the analyzer marks what that
//! allocates (`BlockRole::CpuRepack`), and this rule drops it: CUDA keeps
//! the weight and its quantisation state as loaded.
//!
//! So a block allocated and freed inside one of these calls is dropped and
//! the CUDA temporaries are added for the call's duration; the outputs (the
//! blocks that outlive the call) stay. A `gemm_4bit` with more rows runs
//! the dequantize-then-`linear` fallback on CUDA too, whose allocations the
//! trace already has: above 4 rows (8 in float32) the CUDA dispatch depends
//! on the GPU's architecture and SM count (`_gemm_4bit_use_custom_cuda`), and
//! the fallback is kept (its dequantized weight is the larger allocation, so
//! the estimate errs high there). `MatMul4Bit`'s backward and the int8
//! backward dequantize with the same allocations on both devices.

use std::collections::BTreeMap;

use super::autocast::{AddedBlock, Plan};
use super::RuleId;
use crate::analyzer::quantized::{QuantKernel, QuantOp};
use crate::analyzer::{Analysis, BlockRole};
use crate::units::Bytes;

/// What a kernel call allocates on CUDA besides its outputs, when that
/// differs from the trace; `None` when the trace's allocations stand.
fn cuda_temporaries(k: &QuantKernel, nested: bool) -> Option<Vec<u64>> {
    // `_gemm_4bit_use_custom_cuda`: the fused kernel for every GPU
    let fused = k.m > 0 && (k.m <= 4 || (k.input_elem == 4 && k.m < 8));
    match k.kind {
        QuantOp::Gemm4bit => fused.then(Vec::new),
        QuantOp::Gemv4bitCpuPacked if fused => Some(Vec::new()),
        QuantOp::Gemv4bitCpuPacked => {
            // `_dequant_linear_fallback`: the absmax dequantized (and the
            // offset added) in float32, then the whole weight in A's dtype
            let absmax = if nested {
                vec![k.absmax_blocks.saturating_mul(4); 2]
            } else {
                Vec::new()
            };
            Some(
                [
                    absmax,
                    vec![k.n.saturating_mul(k.k).saturating_mul(k.input_elem)],
                ]
                .concat(),
            )
        }
        QuantOp::Dequantize4bit | QuantOp::DequantizeBlockwise => Some(Vec::new()),
        QuantOp::Int8VectorwiseQuant => Some(vec![
            k.m.saturating_mul(k.k).saturating_mul(2),
            k.m.saturating_mul(k.k),
        ]),
        QuantOp::Int8LinearMatmul => (k.k > 0 && k.k % 4 == 0).then(Vec::new),
        QuantOp::Int8MmDequant => Some(if k.input_elem == 2 {
            Vec::new()
        } else {
            vec![k.m.saturating_mul(k.n).saturating_mul(2)]
        }),
    }
}

/// Adds the rule's changes to `plan`: the CPU temporaries of the kernel
/// calls dropped, the CUDA ones added. Nothing for a trace recorded on CUDA.
pub(super) fn apply(analysis: &Analysis, plan: &mut Plan) {
    if analysis.devices.recorded_on_cuda || analysis.quant_kernels.is_empty() {
        return;
    }
    // The trace's 4-bit state is double-quantized when it dequantizes an
    // 8-bit absmax (the CPU re-layout does it once per layer).
    let nested = analysis
        .quant_kernels
        .iter()
        .any(|k| k.kind == QuantOp::DequantizeBlockwise);
    let mut replaced: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for k in &analysis.quant_kernels {
        if let Some(temps) = cuda_temporaries(k, nested) {
            replaced.insert(k.op, temps);
        }
    }
    let inside_replaced = |op: usize| {
        std::iter::successors(Some(op), |&i| analysis.ops.get(i).and_then(|o| o.parent))
            .any(|i| replaced.contains_key(&i))
    };
    for block in &analysis.blocks {
        if block.role == BlockRole::CpuRepack || block.internal_to.is_some_and(inside_replaced) {
            plan.dropped
                .entry(block.id)
                .or_insert(RuleId::BnbCudaKernels);
        }
    }
    for (&op, temps) in &replaced {
        let Some(span) = analysis.ops.get(op) else {
            continue;
        };
        for &size in temps.iter().filter(|&&s| s > 0) {
            plan.added.push(AddedBlock {
                size: Bytes(size),
                alloc: span.start,
                free: Some(span.end),
                op,
                rule: RuleId::BnbCudaKernels,
                on: crate::kernels::ArchSet::ALL,
                per_gpu: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows and widths a hostile trace writes saturate the CUDA temporaries'
    /// sizes instead of wrapping them (issue 33).
    #[test]
    fn hostile_kernel_sizes_saturate() {
        let huge = QuantKernel {
            op: 0,
            kind: QuantOp::Gemv4bitCpuPacked,
            m: 100,
            k: u64::MAX / 2,
            n: 3,
            input_elem: 4,
            absmax_blocks: u64::MAX / 3,
        };
        assert_eq!(
            cuda_temporaries(&huge, true),
            Some(vec![u64::MAX, u64::MAX, u64::MAX])
        );
        let int8 = QuantKernel {
            kind: QuantOp::Int8VectorwiseQuant,
            m: u64::MAX,
            ..huge
        };
        assert_eq!(
            cuda_temporaries(&int8, false),
            Some(vec![u64::MAX, u64::MAX])
        );
        let dequant = QuantKernel {
            kind: QuantOp::Int8MmDequant,
            ..int8
        };
        assert_eq!(cuda_temporaries(&dequant, false), Some(vec![u64::MAX]));
    }
}
