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
//! cuDNN version; PyTorch cannot say, so the size is **measured**, not
//! derived: `benches/gpu/conv_workspaces.py` ran one forward and one
//! backward of 44 geometries in fp32 and bf16 on an H200 (sm90, cuDNN 9.19,
//! torch 2.11; `tests/data/gpu-h200/conv_workspaces_h200.json`), and the
//! profiler recorded what each pass allocated and freed inside the op.
//! What it shows:
//!
//! - **A pass's workspace is a copy of the tensors it touches**: input +
//!   weight + output bytes for the forward, grad_output + weight +
//!   grad_input for backward-data, input + grad_output + grad_weight for
//!   backward-filter — the same sum. bf16: every forward and backward-data
//!   pass to the byte (e.g. 64→64 3×3 at 56², batch 32: 24.57 MiB =
//!   12.25 + 12.25 + 0.07). fp32: the same from 96 input channels up; with
//!   64 input channels the forward copies input and weight only (0.33–0.68×
//!   the sum) into 128 channels, and into 64 under about 8M output elements
//!   ([`forward_workspace`]: 64→64 takes the sum from 12.8M, resnet18 at
//!   batch 64 and vgg16 at 224², where input + weight put the vgg16 pair
//!   22.7 % under); its backward passes take the whole sum. A backward-filter pass takes
//!   more than the copy in both dtypes (median 1.15×, 1.0–5.8×;
//!   [`filter_workspace`]): its split reduction's partial sums. The reason,
//!   assumed: cuDNN 9's engines on tensor-core GPUs work on channels-last
//!   tiles, and for the channels-first tensors PyTorch hands them the plan
//!   transposes each operand into its workspace first. A 1×1 window's
//!   weight is the same `[C_out, C_in]` matrix in either layout, so nothing
//!   of it is copied: a 1×1 convolution at stride 2 takes input + output
//!   (resnet's downsampling: 19,268,096 bytes for 12,845,056 + 6,422,528 at
//!   batch 32, fp32).
//! - **No copy where the tensors are read as they lie**: a 1×1 window at
//!   stride 1 (a channels-first 1×1 convolution is a matrix product over
//!   the channel dim as the tensor lies): no forward or backward-data
//!   workspace, and a backward-filter pass that keeps its reduction's
//!   partial sums, one weight gradient per image, unless the map is small
//!   or the input thin ([`pointwise_backward`]); and an input of fewer than
//!   8 channels per group (an RGB image) under a window of at most 3,
//!   forward in both dtypes and backward in fp32 (none but one pass at
//!   batch 32). In bf16 its backward passes take 1.1–9× the sum: cuDNN's
//!   half-precision backward engines are tensor-core ones, its fp32 ones
//!   also run channels-first (assumed), so those take the copy. A 7×7 stem
//!   (resnet's) takes the copy like any other window.
//!
//! Each pass frees its workspace before the next allocates, so a backward
//! call holds one workspace at a time. Measured on sm90 only; memcast
//! assumes the same on every architecture, so the blocks are on every GPU.
//! A trace without shapes gives no operand bytes: each pass then takes the
//! largest tensor it writes or reads that the trace shows (the forward's
//! output; the backward's grad_output and grad_input), the assumption before
//! the measurements, which undercounts by the other operands.

/// Whether a cuDNN pass reads a convolution's tensors in place, with no
/// copy: a 1×1 window at stride 1 (`pointwise`, `stride_one`; its
/// backward's partial sums are [`pointwise_backward`]'s); or a thin input
/// (fewer than 8 channels per group under a window of at most 3) in the
/// forward, and in fp32 backward passes (`half`: an element of 2 bytes or
/// fewer).
pub fn in_place(pointwise: bool, stride_one: bool, thin: bool, backward: bool, half: bool) -> bool {
    (pointwise && stride_one) || (thin && !(backward && half))
}

/// The workspace of one cuDNN pass over an input, weight and output of
/// these bytes (at the CUDA run's dtype): a copy of each.
pub fn workspace(input: u64, weight: u64, output: u64) -> u64 {
    input.saturating_add(weight).saturating_add(output)
}

/// The workspace of a backward-filter pass whose operands' copy
/// ([`workspace`]) is `copy` bytes: the copy and 15 % more, the median of the
/// 48 filter passes measured on the H200 (1.14× in fp32, 1.18× in bf16;
/// 1.0–5.8× in all: `tests/integration/gpu_pairs.rs` recomputes it from
/// `conv_workspaces_h200.json`).
///
/// Why more than the data pass, whose measured median is the copy to 0.01 %:
/// a weight gradient is a matrix product whose reduction runs over every
/// output position of the batch (N·H·W terms per element) into an output as
/// small as the weight, so cuDNN's weight-gradient engines split the
/// reduction across thread blocks and keep their partial sums in the
/// workspace (split-K); a data gradient reduces over C_out·k·k terms only.
/// How many splits a plan makes depends on the GPU's multiprocessors and on
/// cuDNN's heuristics, which PyTorch cannot see: the extra is a measured
/// median, not derived, and assumed on every architecture. What it decides
/// is that the filter pass asks for more than the data pass just freed, as
/// the H200 did: a block the data pass's cannot hold, so a backward's
/// caching allocator opens segments that a same-size rule reuses.
pub fn filter_workspace(copy: u64) -> u64 {
    u64::try_from(u128::from(copy) * FILTER_PER_COPY.0 / FILTER_PER_COPY.1).unwrap_or(u64::MAX)
}

/// The workspace of a forward pass over an input, weight and output of
/// these bytes at the CUDA run's dtype (`half`: 2 bytes an element or
/// fewer), with `c_in` input channels per group and `c_out` output channels
/// (0: unknown): the copy of all three ([`workspace`]), except an fp32 pass
/// from 64 input channels into more, or into 64 with an output of at most
/// [`COPY_OUTPUT_MIN_ELEMS`] elements, which copies input and weight only
/// and writes its output where it lies.
///
/// Measured on the H200, not derived: every fp32 forward from 64 channels
/// into 128 (3×3 at 56² and 112², stride 1 and 2, batch 8 to 64: eight
/// geometries in `conv_workspaces_h200.json` and the CNN recordings) took
/// input + weight to the byte; 64→64 took it at 1.6M to 6.4M output
/// elements (batch 8 to 32 at 56²: the table, resnet18, resnet34, resnet50)
/// and the sum at 12.8M and more (resnet18 at batch 64, vgg16 at 224²); 32
/// and 96 channels take the sum, and bf16 passes do at 64 too. Guesses:
/// that outputs wider than 128 behave as 128 does, and where between 6.4M
/// and 12.8M elements a 64→64 pass starts taking the sum.
pub fn forward_workspace(
    input: u64,
    weight: u64,
    output: u64,
    c_in: u64,
    c_out: u64,
    half: bool,
) -> u64 {
    if !half && c_in == 64 && (c_out > 64 || output / 4 <= COPY_OUTPUT_MIN_ELEMS) {
        input.saturating_add(weight)
    } else {
        workspace(input, weight, output)
    }
}

/// The output elements from which an fp32 forward from 64 channels into 64
/// copies its output too ([`forward_workspace`]; 2²³, a guess between the
/// measured 6.4M and 12.8M).
pub const COPY_OUTPUT_MIN_ELEMS: u64 = 1 << 23;

/// The workspaces of the two backward passes of a 1×1 convolution at
/// stride 1, `(data, filter)`, over an input and grad_output of these bytes
/// at the CUDA run's dtype (`elem` bytes an element), a batch of `batch` and
/// a weight of `weight_elems` elements with `c_in` input channels per group
/// (0: unknown, no workspace, the rule before it was measured).
///
/// Such a pass is a matrix product over the channel dim as the tensors lie,
/// so its data pass copies nothing; what the filter pass keeps is its
/// reduction's partial sums. Measured on the H200 (`benches/gpu/align.py`;
/// resnet50, densenet121, mobilenet_v2 and efficientnet_b0 backward passes,
/// 7² to 112²), cuDNN's heuristics pick one of three plans:
///
/// - **Split by image**: the weight gradient reduces over N·H·W positions,
///   and the engine splits that reduction by image, one fp32 partial weight
///   gradient each: `batch × weight_elems × 4` bytes (1.0–1.35× that in 45
///   geometries), the data pass none.
/// - **Copy**, over an input of 32 channels or fewer (16, 24, 32 at 28² to
///   112²: 1.01–1.12× input + grad_output; 40 channels split): the split
///   engines are not chosen, and the filter pass copies input and
///   grad_output as any other window's does, the data pass none.
/// - **As any window**, where the partial sums would be more than
///   [`SPLIT_MAX_PER_COPY`] times the elements of input and grad_output (a
///   small map under many channels: resnet50's 512↔2048 at 7², 8.4×): both
///   passes take the copy as a 3×3 window's do ([`workspace`],
///   [`filter_workspace`]; data 1.0×, filter 1.0–1.5× the copy measured).
///   Per image, the ratio is C_in·C_out / ((C_in + C_out)·H·W): the batch
///   cancels, so it is a geometry's, not a run's.
///
/// All three are measured, not derived: which plan cuDNN's heuristics pick
/// is not in PyTorch's source. The threshold is a guess between the largest
/// ratio that split (2.8, mobilenet_v2's 160→960 at 7²) and the smallest
/// that did not (3.05, efficientnet_b0's 672→192 at 7²); one geometry
/// disagrees (efficientnet_b0's 192→1152 at 7², 3.36, split). The 4-byte
/// partial sums are assumed for half-precision passes too (none measured).
pub fn pointwise_backward(
    input: u64,
    grad_output: u64,
    elem: u64,
    batch: u64,
    weight_elems: u64,
    c_in: u64,
) -> (u64, u64) {
    let copy = input.saturating_add(grad_output);
    let partial_elems = u128::from(batch) * u128::from(weight_elems);
    let copy_elems = u128::from(copy.checked_div(elem).unwrap_or(0));
    match c_in {
        0 => (0, 0),
        1..=POINTWISE_COPY_MAX_C_IN => (0, copy),
        _ if partial_elems > copy_elems * SPLIT_MAX_PER_COPY => (copy, filter_workspace(copy)),
        _ => (0, u64::try_from(partial_elems * 4).unwrap_or(u64::MAX)),
    }
}

/// The most input channels per group over which a pointwise backward-filter
/// pass copies its operands rather than splitting its reduction by image
/// ([`pointwise_backward`]).
pub const POINTWISE_COPY_MAX_C_IN: u64 = 32;

/// The most partial-sum elements per element of input and grad_output for
/// which a pointwise backward-filter pass splits its reduction by image
/// ([`pointwise_backward`]; a guess between measured geometries).
pub const SPLIT_MAX_PER_COPY: u128 = 3;

/// A backward-filter pass's workspace over its operands' copy, as a ratio
/// (23/20 = 1.15): see [`filter_workspace`].
pub const FILTER_PER_COPY: (u128, u128) = (23, 20);

/// The workspace memcast assumes for one cuDNN pass that writes or reads
/// tensors of these bytes, where the trace has no shapes: the largest of
/// them (0 for none).
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

    /// The measured H200 geometries (`conv_workspaces_h200.json`) each rule
    /// stands on.
    #[test]
    fn a_pass_copies_what_it_touches_unless_cudnn_reads_it_in_place() {
        // bf16 64→64 3×3 at 56², batch 32: 24.57 MiB measured, forward and
        // backward-data.
        let (x, w) = (32 * 64 * 56 * 56 * 2, 64 * 64 * 9 * 2);
        assert_eq!(workspace(x, w, x), 25_763_840);
        // Its backward-filter pass: 26.40 MiB measured, 28.26 at the median.
        assert_eq!(filter_workspace(25_763_840), 29_628_416);
        assert_eq!(filter_workspace(u64::MAX), u64::MAX);
        // (pointwise, stride_one, thin, backward, half)
        assert!(!in_place(false, true, false, false, true));
        // fp32 64→128 3×3 at 112², batch 8 (vgg11): input + weight, 24.78
        // MiB measured; 64→64 and bf16 keep the sum.
        let (x, w, y) = (
            8 * 64 * 112 * 112 * 4,
            128 * 64 * 9 * 4,
            8 * 128 * 112 * 112 * 4,
        );
        assert_eq!(forward_workspace(x, w, y, 64, 128, false), x + w);
        assert_eq!(forward_workspace(x, w, y, 64, 64, false), x + w + y);
        assert_eq!(forward_workspace(x, w, y, 64, 128, true), x + w + y);
        assert_eq!(forward_workspace(x, w, y, 96, 128, false), x + w + y);
        // (input, grad_output, elem, batch, weight elements, C_in)
        // mobilenet_v2's 16→96 at 112², batch 32: the copy (174.0 MiB
        // measured).
        let (x, dy) = (32 * 16 * 112 * 112 * 4, 32 * 96 * 112 * 112 * 4);
        assert_eq!(pointwise_backward(x, dy, 4, 32, 96 * 16, 16), (0, x + dy));
        // resnet50's 256→64 at 56², batch 16: a weight gradient per image
        // (1.0 MiB measured).
        let (x, dy) = (16 * 256 * 56 * 56 * 4, 16 * 64 * 56 * 56 * 4);
        assert_eq!(
            pointwise_backward(x, dy, 4, 16, 64 * 256, 256),
            (0, 1 << 20)
        );
        // resnet50's 2048→512 at 7²: 8.4 partial sums per element copied,
        // so the copy in both passes (7.66 MiB measured in each).
        let (x, dy) = (16 * 2048 * 49 * 4, 16 * 512 * 49 * 4);
        assert_eq!(
            pointwise_backward(x, dy, 4, 16, 512 * 2048, 2048),
            (x + dy, filter_workspace(x + dy))
        );
        // An analysis saved before the channels were kept: none.
        assert_eq!(pointwise_backward(x, dy, 4, 16, 512 * 2048, 0), (0, 0));
        // 1×1 at stride 1: none; at stride 2 a window like any other.
        assert!(in_place(true, true, false, true, false));
        assert!(!in_place(true, false, false, false, false));
        // An RGB image under 3×3 (vgg, mobilenet): none forward, none in an
        // fp32 backward, the copy in a bf16 one.
        assert!(in_place(false, false, true, false, true));
        assert!(in_place(false, false, true, true, false));
        assert!(!in_place(false, false, true, true, true));
    }
}
