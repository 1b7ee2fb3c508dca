//! The bitsandbytes kernels of a quantized model, as the trace records them:
//! which op ran, on what shapes. The CPU backend computes several of them
//! with plain ATen ops (float copies of int8 operands, lookup tables) whose
//! temporaries a CUDA run does not make; the orchestrator's `bnb_cuda_kernels`
//! rule replaces them with what the CUDA kernels allocate. This module only
//! reads the facts those rules need.

use serde::{Deserialize, Serialize};

use super::lifecycle::Life;
use super::spans::SpanIndex;
use super::{BlockRole, Names};
use crate::trace::{dtype_size, Trace};
use crate::units::Nanos;

/// The Python frame in which bitsandbytes re-lays a 4-bit weight out for
/// its AVX512-BF16 CPU kernel (`functional.py`: `Linear4bit.forward` calls
/// it on the first eval-mode call without grad on such a CPU): the packed
/// weight becomes `[N, K/2]`, the double-quantized absmax a bfloat16
/// `[K/blocksize, N]`, and `gemv_4bit` then reads those. A CUDA run keeps
/// the weight and its quantisation state as loaded.
const CPU_PACKING_FRAME: &str = "_convert_weight_packed_for_cpu";

/// A bitsandbytes op with a CUDA kernel of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuantOp {
    /// `gemm_4bit(A, B, shapeB, absmax, …)`: a 4-bit layer's matmul.
    Gemm4bit,
    /// `dequantize_4bit(A, absmax, …)`: the whole weight, dequantized.
    Dequantize4bit,
    /// `dequantize_blockwise(A, absmax, code, …)`: an 8-bit blockwise tensor
    /// (a double-quantized absmax).
    DequantizeBlockwise,
    /// `int8_vectorwise_quant(A, threshold)`: the input's int8 rows.
    Int8VectorwiseQuant,
    /// `int8_linear_matmul(A, B)`: int8 × int8 → int32.
    Int8LinearMatmul,
    /// `int8_mm_dequant(A, row_stats, col_stats, …)`: int32 → the layer's dtype.
    Int8MmDequant,
    /// `gemv_4bit(A, B, shapeB, absmax, code, …)` on a weight re-laid out
    /// for the CPU (see [`CPU_PACKING_FRAME`]): CUDA runs `gemm_4bit` on the
    /// weight as loaded.
    Gemv4bitCpuPacked,
}

impl QuantOp {
    fn of(name: &str) -> Option<QuantOp> {
        Some(match name {
            "bitsandbytes::gemm_4bit" => QuantOp::Gemm4bit,
            "bitsandbytes::dequantize_4bit" => QuantOp::Dequantize4bit,
            "bitsandbytes::dequantize_blockwise" => QuantOp::DequantizeBlockwise,
            "bitsandbytes::int8_vectorwise_quant" => QuantOp::Int8VectorwiseQuant,
            "bitsandbytes::int8_linear_matmul" => QuantOp::Int8LinearMatmul,
            "bitsandbytes::int8_mm_dequant" => QuantOp::Int8MmDequant,
            "bitsandbytes::gemv_4bit" => QuantOp::Gemv4bitCpuPacked,
            _ => return None,
        })
    }
}

/// One call of a bitsandbytes kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuantKernel {
    /// The op (index into [`super::Analysis::ops`]).
    pub op: usize,
    pub kind: QuantOp,
    /// The matrix product's rows (the input's elements over its last dim),
    /// its input width and its output width, where the op has them (0 when
    /// the trace does not show them).
    pub m: u64,
    pub k: u64,
    pub n: u64,
    /// Bytes per element of the layer's input: `A` of `gemm_4bit`, the
    /// input of the enclosing `MatMul8bitLt` for the int8 ops (0 when not
    /// recorded).
    pub input_elem: u64,
    /// For `gemv_4bit` on the CPU layout: the blocks of the absmax (its
    /// element count), which a CUDA fallback dequantizes to float32.
    #[serde(default)]
    pub absmax_blocks: u64,
}

/// Every bitsandbytes kernel call of the trace, in op order.
pub(crate) fn kernels(trace: &Trace, index: &SpanIndex, names: &Names) -> Vec<QuantKernel> {
    let spans = &index.ops.spans;
    let dims_at = |idx: usize, pos: u16| -> Option<(Vec<i64>, u64)> {
        let a = index.tensor_arg(trace, idx, pos)?;
        let elem = a.dtype.and_then(|d| dtype_size(trace.name(d))).unwrap_or(0);
        Some((trace.numbers(a.dims).to_vec(), elem))
    };
    let rows_and_width = |dims: &[i64]| -> (u64, u64) {
        let k = dims.last().map_or(0, |&d| d.max(0) as u64);
        let numel = dims
            .iter()
            .map(|&d| d.max(0).unsigned_abs())
            .fold(1, u64::saturating_mul);
        (numel.checked_div(k).unwrap_or(0), k)
    };
    let mut out = Vec::new();
    for (idx, span) in spans.iter().enumerate() {
        let Some(kind) = QuantOp::of(names.get(span.name)) else {
            continue;
        };
        let (mut m, mut k, mut n, mut input_elem, mut absmax_blocks) = (0, 0, 0, 0, 0);
        match kind {
            QuantOp::Gemm4bit => {
                if let Some((a, elem)) = dims_at(idx, 0) {
                    (m, k) = rows_and_width(&a);
                    input_elem = elem;
                }
                // two 4-bit values per byte of the packed weight
                if let Some((b, _)) = dims_at(idx, 1) {
                    let bytes = b
                        .iter()
                        .map(|&d| d.max(0).unsigned_abs())
                        .fold(1, u64::saturating_mul);
                    n = bytes.saturating_mul(2).checked_div(k).unwrap_or(0);
                }
            }
            QuantOp::Int8VectorwiseQuant => {
                if let Some((a, _)) = dims_at(idx, 0) {
                    (m, k) = rows_and_width(&a);
                }
            }
            QuantOp::Int8LinearMatmul => {
                if let Some((a, _)) = dims_at(idx, 0) {
                    (m, k) = rows_and_width(&a);
                }
                if let Some((b, _)) = dims_at(idx, 1) {
                    n = b.first().map_or(0, |&d| d.max(0) as u64);
                }
            }
            QuantOp::Int8MmDequant => {
                if let Some((a, _)) = dims_at(idx, 0) {
                    (m, n) = rows_and_width(&a);
                }
            }
            QuantOp::Gemv4bitCpuPacked => {
                if let Some((a, elem)) = dims_at(idx, 0) {
                    (m, k) = rows_and_width(&a);
                    input_elem = elem;
                }
                if let Some((b, _)) = dims_at(idx, 1) {
                    n = b.first().map_or(0, |&d| d.max(0) as u64);
                }
                if let Some((absmax, _)) = dims_at(idx, 3) {
                    absmax_blocks = absmax
                        .iter()
                        .map(|&d| d.max(0).unsigned_abs())
                        .fold(1, u64::saturating_mul);
                }
            }
            QuantOp::Dequantize4bit | QuantOp::DequantizeBlockwise => {}
        }
        if matches!(
            kind,
            QuantOp::Int8VectorwiseQuant | QuantOp::Int8LinearMatmul | QuantOp::Int8MmDequant
        ) {
            // The layer's own input, before its float16 cast.
            input_elem = index
                .ops
                .chain(idx)
                .find(|&i| {
                    spans
                        .get(i)
                        .is_some_and(|s| names.get(s.name) == "MatMul8bitLt")
                })
                .and_then(|i| dims_at(i, 0))
                .map_or(0, |(_, elem)| elem);
        }
        out.push(QuantKernel {
            op: idx,
            kind,
            m,
            k,
            n,
            input_elem,
            absmax_blocks,
        });
    }
    out
}

/// Arguments of an op that are not state a CUDA run holds: `gemv_4bit`'s
/// absmax in the CPU layout (bfloat16 `[K/blocksize, N]`, made by the
/// re-layout from the double-quantized state, which stays) and its NF4
/// code table (CUDA kernels take the quantisation type by name; the table
/// is counted once per 4-bit layer).
pub(crate) fn cpu_layout_args(op: &str) -> &'static [u16] {
    match op {
        "bitsandbytes::gemv_4bit" => &[3, 4],
        _ => &[],
    }
}

/// The frames of bitsandbytes' CPU re-layout of 4-bit weights.
fn packing_frames(index: &SpanIndex, names: &Names) -> Vec<bool> {
    index
        .frames
        .spans
        .iter()
        .map(|f| names.get(f.name).ends_with(CPU_PACKING_FRAME))
        .collect()
}

/// Whether `t` on thread `tid` lies inside a CPU re-layout of a 4-bit
/// weight, given [`packing_frames`].
fn inside(index: &SpanIndex, packing: &[bool], tid: i64, t: Nanos) -> bool {
    index
        .frames
        .innermost(tid, t)
        .is_some_and(|f| index.frames.chain(f).any(|i| packing.get(i) == Some(&true)))
}

/// Marks the blocks allocated while bitsandbytes re-lays 4-bit weights out
/// for its CPU kernel ([`BlockRole::CpuRepack`]: the new layout and its
/// temporaries, none of which a CUDA run makes) and returns the op spans
/// (indices) run inside such a re-layout, whose reads of the old layout are
/// not the model's state.
pub(crate) fn mark_cpu_packing(life: &mut Life, index: &SpanIndex, names: &Names) -> Vec<bool> {
    let packing = packing_frames(index, names);
    if !packing.contains(&true) {
        return Vec::new();
    }
    for b in &mut life.blocks {
        let tid = life.events.get(b.alloc_event).map(|e| e.tid);
        if tid.is_some_and(|tid| inside(index, &packing, tid, b.alloc_ts)) {
            b.role = BlockRole::CpuRepack;
        }
    }
    index
        .ops
        .spans
        .iter()
        .map(|o| inside(index, &packing, o.tid, o.start))
        .collect()
}
