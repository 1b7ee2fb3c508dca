//! The temporary of a CUDA softmax backward.
//!
//! PyTorch's CUDA `_softmax_backward_data` (`softmax_backward_cuda_out` in
//! `aten/src/ATen/native/cuda/SoftMax.cu`, pytorch/pytorch at 000cace5)
//! first computes `Tensor tmp = grad * output;` and hands `tmp` to the
//! reduction kernel (`host_softmax_backward` with `SoftMaxBackwardEpilogue`,
//! which forms `tmp - output * sum(tmp)`). `tmp` is a new tensor of the
//! incoming gradient's shape and type (`grad` and `output` share it: fp32
//! where the forward ran `half_to_float`), made after the structured
//! kernel's `grad_input` and freed when the op returns. Its bytes are those
//! of the gradient a CPU trace shows the call making: the CPU converts a
//! half input to the softmax's type before its kernel, so its gradient has
//! the incoming gradient's type where the CUDA one keeps the input's. The CPU kernel (`softmax_backward_cpu_out`) reads
//! `grad` and `output` directly and makes nothing, so a CPU trace never
//! shows it. The log-softmax backward (`log_softmax_backward_cuda_out`)
//! passes `grad` as it is: no temporary there, nor in the masked softmax's
//! fallback.
//!
//! Measured on an H200 (torch 2.11, `tests/data/gpu-h200/*.cuda.json.gz`):
//! every `aten::_softmax_backward_data` of BERT-large's eager attention in
//! fp32 and under bf16 autocast, and of llama-small's in fp32, allocates its
//! gradient, then an `aten::mul` of the same bytes inside it, freed before
//! it returns (64 MiB each at batch 4, 16 heads, 512 tokens).

/// The bytes of the temporary of one CUDA softmax backward: the incoming
/// gradient's bytes at the CUDA run's type. `grad_input` is the size of
/// the gradient the call makes as the CUDA run makes it (the same shape;
/// its type the one autocast gave the gradient); without it, the traced
/// gradient's bytes (`grad_bytes`).
pub fn backward_temporary(grad_input: Option<u64>, grad_bytes: Option<u64>) -> u64 {
    grad_input.or(grad_bytes).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_is_the_gradient_the_call_makes() {
        // BERT-large's attention probabilities at batch 4: [4, 16, 512, 512] fp32.
        let bytes = 4 * 16 * 512 * 512 * 4;
        assert_eq!(backward_temporary(Some(bytes), Some(bytes / 2)), bytes);
        assert_eq!(backward_temporary(None, Some(bytes)), bytes);
        assert_eq!(backward_temporary(None, None), 0);
    }
}
