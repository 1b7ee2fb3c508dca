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
        "bitsandbytes::dequantize_4bit" => &[0],
        // Hugging Face Conv1D: torch.addmm(bias, x, weight)
        "aten::addmm" if conv1d => &[0, 2],
        _ => &[],
    }
}
