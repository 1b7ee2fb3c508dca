//! Facts of PyTorch's operator signatures that more than one stage reads.

/// The autograd node that accumulates a parameter's gradient: its input
/// shape and dtype are the parameter's.
pub const ACCUMULATE_GRAD: &str = "torch::autograd::AccumulateGrad";

/// Argument positions that hold module state in known ops: the weight and
/// bias of linear and convolution layers, embedding tables, the affine
/// parameters of the norms and BatchNorm's running statistics, and Hugging
/// Face's `Conv1D` (`torch.addmm(bias, x, weight)`, in a `Conv1D` frame).
pub fn weight_args(op: &str, conv1d: bool) -> &'static [u16] {
    match op {
        "aten::linear"
        | "aten::conv1d"
        | "aten::conv2d"
        | "aten::conv3d"
        | "aten::conv_transpose1d"
        | "aten::conv_transpose2d"
        | "aten::conv_transpose3d"
        | "aten::convolution"
        | "aten::_convolution" => &[1, 2],
        "aten::embedding" | "aten::embedding_bag" | "aten::_embedding_bag" => &[0],
        "aten::layer_norm" | "aten::group_norm" => &[2, 3],
        "aten::rms_norm" => &[2],
        "aten::batch_norm" | "aten::instance_norm" => &[1, 2, 3, 4],
        "aten::prelu" => &[1],
        "aten::bilinear" => &[2, 3],
        "aten::_native_multi_head_attention" => &[5, 6, 7, 8],
        // bitsandbytes' autograd functions, recorded by name: the input,
        // then the quantized weight (int8 for LLM.int8(), packed NF4/FP4
        // bytes for 4-bit), a parameter (`Int8Params`, `Params4bit`).
        "MatMul8bitLt" | "MatMul4Bit" => &[1],
        // bitsandbytes' 4-bit kernels (the inference path calls them
        // directly): `gemm_4bit(A, B, ...)`, `dequantize_4bit(B, ...)`.
        "bitsandbytes::gemm_4bit" => &[1],
        // on a weight bitsandbytes re-laid out for its AVX512-BF16 CPU
        // kernel: `gemv_4bit(A, B, shapeB, absmax, code, blocksize)`
        "bitsandbytes::gemv_4bit" => &[1],
        "bitsandbytes::dequantize_4bit" => &[0],
        // Hugging Face Conv1D: torch.addmm(bias, x, weight)
        "aten::addmm" if conv1d => &[0, 2],
        _ => &[],
    }
}

/// Argument positions of bitsandbytes ops that hold a quantized weight's
/// *quantisation state* (`QuantState` for 4-bit: the blockwise absmax —
/// itself 8-bit with double quantisation, then with its own absmax and
/// code table — and the offset; `SCB`, the per-output-row scales, for
/// LLM.int8()). The state lives beside the packed weight for the model's
/// whole life; bitsandbytes hands it to these ops directly, so they are
/// read inside the layer's autograd Function (nested ops), not by the
/// layer's top-level op:
/// - `gemm_4bit(A, B, shapeB, absmax, blocksize, …)`: every tensor after
///   `A` and `B` (with double quantisation the nested absmax, the quantized
///   absmax, its code table and the offset);
/// - `dequantize_4bit(A, absmax, …)`: the absmax (without double
///   quantisation the stored one; with it, a temporary the call made, which
///   the state search tells apart by its allocation);
/// - `dequantize_blockwise(A, absmax, code, …)`: the quantized absmax, its
///   absmax and code (how a 4-bit layer undoes double quantisation);
/// - `int8_scaled_mm(A, B, row_stats, col_stats, …)`,
///   `int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, …)`,
///   `int8_mm_dequant(A, row_stats, col_stats, …)`: the weight's `SCB`.
pub fn quant_state_args(op: &str) -> &'static [u16] {
    match op {
        "bitsandbytes::gemm_4bit" => &[3, 4, 5, 6, 7, 8, 9, 10],
        "bitsandbytes::dequantize_4bit" => &[1],
        "bitsandbytes::dequantize_blockwise" => &[0, 1, 2],
        "bitsandbytes::int8_scaled_mm" => &[3],
        "bitsandbytes::int8_mixed_scaled_mm" => &[4],
        "bitsandbytes::int8_mm_dequant" => &[2],
        _ => &[],
    }
}
