//! cuDNN convolution workspaces under PyTorch's default heuristics
//! (`torch.backends.cudnn.benchmark = False`).
//!
//! What PyTorch does (read in `aten/src/ATen/native/cudnn/Conv_v8.cpp` and
//! `Conv_v7.cpp`):
//!
//! - Each pass — forward, backward-data, backward-filter — runs its own
//!   cuDNN plan (v8 API, the default with cuDNN 9: `run_single_conv`) or
//!   algorithm (v7 API: `raw_cudnn_convolution_*_out_32bit`) and asks the
//!   caching allocator for that plan's workspace just before it runs
//!   (`run_conv_plan`: `plan.getWorkspaceSize()`, then
//!   `CUDACachingAllocator::get()->allocate`; v7's `allocate_workspace`, an
//!   `at::empty` of bytes, refused above 1 TiB). The workspace is a local:
//!   it is freed when the pass returns, so the three never overlap, and a
//!   0-byte plan allocates nothing.
//! - Without benchmark mode the plan is the first that cuDNN's heuristics
//!   return (v8: `get_configs_from_heuristics`, heuristic mode instant, or
//!   B under `TORCH_CUDNN_USE_HEURISTIC_MODE_B`; v7: `cudnnGet…Algorithm_v7`
//!   through `AlgoIterator`) that builds and runs. There is no PyTorch
//!   bound on its workspace in this path: the bound is an allocation that
//!   fails. `try_configs` (v8) and `AlgoIterator::try_all` (v7) catch the
//!   allocator's out-of-memory error and try the next plan, then cuDNN's
//!   fallback list, so a workspace that does not fit makes the convolution
//!   slower, not the job fail. (Benchmark mode instead times every plan whose
//!   workspace fits the largest free cached block — v7's
//!   `getMaxWorkspaceSize`, v8's `get_available_workspace` — and caches the
//!   fastest: another workspace, unknowable without the GPU.)
//! - A depthwise convolution (`groups == C_in > 1`) in fp32 or bf16 with the
//!   default layout does not run cuDNN (`Convolution.cpp`,
//!   `use_cudnn_depthwise`): `conv_depthwise2d` allocates only its outputs.
//!
//! Which plan the heuristics return depends on the shapes, dtype, GPU and
//! cuDNN version, and its workspace has no closed form (on an H200, cuDNN
//! 9.19, torch 2.11: 400 bytes for many 1×1 forwards, 0.5 to 9 times the
//! larger tensor for 3×3 and 7×7 ones, odd sizes that are properties of the
//! plan; resnet18 at batch 32 fp32: 21.4 MB forward workspaces beside
//! 25.7 MB outputs at 56², but 34.5–53.6 MB backward-filter ones beside
//! 0.6–3.2 MB tensors in the 7×7 and 14×14 stages, the allocator's
//! snapshot shows). So memcast states an assumption instead of a formula:
//! **each pass's workspace is as large as the largest tensor the pass
//! writes or reads that the trace shows** — the forward's output; the
//! backward's grad_output and grad_input. The reason: the engines with a
//! workspace hold an operand in another form (a Winograd or FFT transform of
//! the input or output tiles, split-K partial sums over the output, an
//! explicit im2col of the input), at least one operand's bytes; cheaper
//! plans (implicit GEMM) need none, and those above it are what the
//! allocator may refuse, where PyTorch falls back. It underestimates the
//! deep layers' backward-filter workspaces (above), which come one at a
//! time and rarely at the peak. It is the same on every architecture, so
//! the blocks are on every GPU.

/// The workspace memcast assumes for one cuDNN pass that writes or reads
/// tensors of these bytes: the largest of them (0 for none).
pub fn assumed_workspace(operands: &[u64]) -> u64 {
    operands.iter().copied().max().unwrap_or(0)
}

/// Whether a convolution runs cuDNN (and may take a workspace): not a
/// depthwise one in fp32 or bf16, which runs PyTorch's own kernel.
pub fn runs_cudnn(native_depthwise: bool) -> bool {
    !native_depthwise
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_takes_its_largest_operand() {
        // resnet18's stem at batch 32: input 3x224x224, output 64x112x112 fp32
        let input = 32 * 3 * 224 * 224 * 4;
        let output = 32 * 64 * 112 * 112 * 4;
        assert_eq!(assumed_workspace(&[output]), output);
        assert_eq!(assumed_workspace(&[output, input]), output);
        assert_eq!(assumed_workspace(&[]), 0);
        assert!(runs_cudnn(false) && !runs_cudnn(true));
    }
}
