//! The orchestration rules, one function each, named by [`RuleId`].
//!
//! A CPU trace is evidence of tensor sizes and lifetimes, not of what a CUDA
//! run holds: parameters, buffers and constructor-built optimizer state were
//! allocated before profiling; oneDNN scratch, the data loader's work and the
//! optimizer's step counters live in host memory on a CUDA run; and CUDA runs
//! the multi-tensor optimizer path. Each rule turns one of these differences
//! into blocks of the schedule:
//!
//! - [`setup`] — `parameters`, `batchnorm_buffers`, `constructor_optimizer_state`;
//! - [`dropped`] — `other_device`, `cpu_scratch`, `host_data_loading`,
//!   `host_step_counters` (captured blocks a CUDA run does not make);
//! - [`captured`] — `activations` (the categories of the captured blocks) over
//!   the planned iterations;
//! - [`iterations`] — `iterations` (which captured iteration each simulated one
//!   repeats) and the phase windows;
//! - [`lifetimes`] — `gradients`, `batch_handover`;
//! - [`foreach`] — `foreach_optimizer`;
//! - [`workspaces`] — `cublas_workspaces`;
//! - [`kernels`] — `sdpa_cuda_kernels`, `dropout_cuda_mask`,
//!   `cuda_reduce_buffers`, `cudnn_conv_workspaces`, `cuda_softmax_backward`
//!   (CUDA kernels that allocate otherwise than the CPU's, per GPU
//!   architecture).
//!
//! [`apply_all`] runs them in [`RuleId::ALL`] order. To add a rule: add its
//! [`RuleId`] variant (the compiler then asks for its name, summary and
//! whether it drops captured blocks), write its function in the file of its
//! kind, and call it from [`apply_all`], counting what it did.

pub mod autocast;
mod bnb;
mod captured;
mod dropped;
mod foreach;
mod iterations;
mod kernels;
mod lifetimes;
mod order;
mod setup;
mod workspaces;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use foreach::foreach_temporary_lists;
pub use workspaces::CUBLAS_OPS;

use super::schedule::{
    BlockId, Category, EventKind, IterationSpan, Phase, PhaseWindow, Schedule, ScheduleEvent,
    ScheduledBlock,
};
use super::{OrchestrateError, OrchestrationFacts, OrchestratorConfig, RuleBytes, RuleCount};
use crate::analyzer::Analysis;
use crate::diag::Warning;
use crate::trace::NameId;
use crate::units::{Bytes, Nanos};
use order::Key;

/// An orchestration rule. The report counts what each did under its
/// [`RuleId::name`] (its serde name), in declaration order, which is the
/// order the rules apply in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleId {
    Parameters,
    BatchnormBuffers,
    ModelBuffers,
    QuantState,
    ConstructorOptimizerState,
    ActivationsBeforeTrace,
    DdpBuckets,
    OtherDevice,
    CpuScratch,
    CpuCollectiveTemporaries,
    HostDataLoading,
    HostStepCounters,
    Activations,
    AutocastFp32Ops,
    AutocastLowerOps,
    AutocastPromotion,
    AutocastInputCasts,
    AutocastCpuOnlyCasts,
    AutocastCastCache,
    CpuLowpMatmulCopies,
    AutocastBackward,
    BnbCudaKernels,
    SdpaCudaKernels,
    DropoutCudaMask,
    CudaReduceBuffers,
    CudnnConvWorkspaces,
    CudaSoftmaxBackward,
    Gradients,
    BatchHandover,
    ForeachOptimizer,
    Iterations,
    CublasWorkspaces,
    GradScalerState,
}

impl RuleId {
    /// Every rule, in the order they apply (and the report lists them).
    pub const ALL: [RuleId; 33] = [
        RuleId::Parameters,
        RuleId::BatchnormBuffers,
        RuleId::ModelBuffers,
        RuleId::QuantState,
        RuleId::ConstructorOptimizerState,
        RuleId::ActivationsBeforeTrace,
        RuleId::DdpBuckets,
        RuleId::OtherDevice,
        RuleId::CpuScratch,
        RuleId::CpuCollectiveTemporaries,
        RuleId::HostDataLoading,
        RuleId::HostStepCounters,
        RuleId::Activations,
        RuleId::AutocastFp32Ops,
        RuleId::AutocastLowerOps,
        RuleId::AutocastPromotion,
        RuleId::AutocastInputCasts,
        RuleId::AutocastCpuOnlyCasts,
        RuleId::AutocastCastCache,
        RuleId::CpuLowpMatmulCopies,
        RuleId::AutocastBackward,
        RuleId::BnbCudaKernels,
        RuleId::SdpaCudaKernels,
        RuleId::DropoutCudaMask,
        RuleId::CudaReduceBuffers,
        RuleId::CudnnConvWorkspaces,
        RuleId::CudaSoftmaxBackward,
        RuleId::Gradients,
        RuleId::BatchHandover,
        RuleId::ForeachOptimizer,
        RuleId::Iterations,
        RuleId::CublasWorkspaces,
        RuleId::GradScalerState,
    ];

    /// The autocast rules ([`autocast`]).
    pub const AUTOCAST: [RuleId; 8] = [
        RuleId::AutocastFp32Ops,
        RuleId::AutocastLowerOps,
        RuleId::AutocastPromotion,
        RuleId::AutocastInputCasts,
        RuleId::AutocastCpuOnlyCasts,
        RuleId::AutocastCastCache,
        RuleId::CpuLowpMatmulCopies,
        RuleId::AutocastBackward,
    ];

    /// The rule's name, as the report and the docs write it.
    pub const fn name(self) -> &'static str {
        match self {
            RuleId::Parameters => "parameters",
            RuleId::BatchnormBuffers => "batchnorm_buffers",
            RuleId::ModelBuffers => "model_buffers",
            RuleId::QuantState => "quant_state",
            RuleId::ConstructorOptimizerState => "constructor_optimizer_state",
            RuleId::ActivationsBeforeTrace => "activations_before_trace",
            RuleId::DdpBuckets => "ddp_buckets",
            RuleId::OtherDevice => "other_device",
            RuleId::CpuScratch => "cpu_scratch",
            RuleId::CpuCollectiveTemporaries => "cpu_collective_temporaries",
            RuleId::HostDataLoading => "host_data_loading",
            RuleId::HostStepCounters => "host_step_counters",
            RuleId::Activations => "activations",
            RuleId::AutocastFp32Ops => "autocast_fp32_ops",
            RuleId::AutocastLowerOps => "autocast_lower_ops",
            RuleId::AutocastPromotion => "autocast_promotion",
            RuleId::AutocastInputCasts => "autocast_input_casts",
            RuleId::AutocastCpuOnlyCasts => "autocast_cpu_only_casts",
            RuleId::AutocastCastCache => "autocast_cast_cache",
            RuleId::CpuLowpMatmulCopies => "cpu_lowp_matmul_copies",
            RuleId::AutocastBackward => "autocast_backward",
            RuleId::BnbCudaKernels => "bnb_cuda_kernels",
            RuleId::SdpaCudaKernels => "sdpa_cuda_kernels",
            RuleId::DropoutCudaMask => "dropout_cuda_mask",
            RuleId::CudaReduceBuffers => "cuda_reduce_buffers",
            RuleId::CudnnConvWorkspaces => "cudnn_conv_workspaces",
            RuleId::CudaSoftmaxBackward => "cuda_softmax_backward",
            RuleId::Gradients => "gradients",
            RuleId::BatchHandover => "batch_handover",
            RuleId::ForeachOptimizer => "foreach_optimizer",
            RuleId::Iterations => "iterations",
            RuleId::CublasWorkspaces => "cublas_workspaces",
            RuleId::GradScalerState => "grad_scaler_state",
        }
    }

    /// What the rule does.
    pub const fn summary(self) -> &'static str {
        match self {
            RuleId::Parameters => "one persistent block per parameter, with or without a gradient (the analyzer's resident state: AccumulateGrad shapes and the tensors the forward reads that were never allocated in the trace; or the bytes the user gave), allocated first, in module order, as model.to(device) does; a model built inside the trace keeps its own blocks",
            RuleId::BatchnormBuffers => "running_mean, running_var (the BatchNorm weight's shape and dtype) and num_batches_tracked (8 bytes) of every BatchNorm layer, allocated after its parameters",
            RuleId::ConstructorOptimizerState => "optimizer state made before the trace (in the constructor, like Adagrad's sum, or in steps a profiler schedule did not record): the state tensors of each trainable parameter, from the optimizer class and what its step runs, made where the job made them: at setup for a class that builds its state in the constructor (Adagrad), else at the first optimizer step (torch.optim builds state lazily in step())",
            RuleId::ModelBuffers => "buffers other than BatchNorm's that the forward reads and the trace never allocated (position ids, rotary caches), allocated at setup",
            RuleId::QuantState => "the quantisation state of bitsandbytes-quantized weights that the layers' kernels read and the trace never allocated (a 4-bit weight's blockwise absmax, with double quantisation its nested absmax and code table, the offset and its 16-value NF4/FP4 code table; an int8 weight's SCB row scales), allocated at setup with the model",
            RuleId::ActivationsBeforeTrace => "activations made before the trace (an earlier batch, a KV cache the first iteration reads), allocated at setup and freed after their last read",
            RuleId::DdpBuckets => "DistributedDataParallel's gradient buckets made when the model was wrapped (the tensors its all-reduce reads that the trace never allocated), allocated at setup and freed when the reducer rebuilds its own inside the trace",
            RuleId::OtherDevice => "only blocks of the profiled device are kept: CPU blocks of a CPU trace, CUDA blocks of a CUDA trace (its CPU blocks are host memory)",
            RuleId::CpuScratch => "a CPU kernel's private scratch is dropped: a block one op allocates (itself or through a factory call of its own) and frees before it returns, neither an output nor a saved tensor (oneDNN reorders, the CPU flash-attention kernel's per-thread buffers, a reduction's per-thread partial sums, bf16 GEMM packing), and every operator-internal block of a CPU-only (oneDNN) op; the CUDA kernel's own allocations come from the kernel rules where it makes any",
            RuleId::CpuCollectiveTemporaries => "blocks a CPU-backend (gloo) collective allocates and frees inside a c10d:: op are dropped: NCCL reduces on the device without them (its own memory is outside the caching allocator)",
            RuleId::HostDataLoading => "blocks the DataLoader allocates and frees inside __next__ live in host memory on a CUDA run and are dropped; the batch tensors are kept",
            RuleId::HostStepCounters => "scalar optimizer step counters (at most 8 bytes) of torch.optim optimizers stay on the host unless capturable or fused, and are dropped",
            RuleId::Activations => "other forward and backward blocks keep their CPU lifetimes; blocks freed inside the op or optimizer step that made them are temporaries",
            RuleId::AutocastFp32Ops => "in an autocast region, the outputs of ops CUDA autocast runs in fp32 (exp, log, pow, rsqrt, softmax, sum, norms, losses; CPU autocast lists none of them) take fp32's size",
            RuleId::AutocastLowerOps => "in an autocast region, the outputs of ops CUDA autocast runs in 16 bits (matrix products, convolutions, einsum) take 16-bit size where the trace ran them in fp32",
            RuleId::AutocastPromotion => "in an autocast region, an op autocast does not list runs on the types it is given: its outputs take their promoted type (fp32 when an input is fp32, 16 bits when all are), as PyTorch's type promotion does",
            RuleId::AutocastInputCasts => "the input copies CUDA autocast makes (16-bit copies for matrix products, fp32 copies for fp32 ops, widest-type copies for promote ops) and the CPU did not, alive while the op runs or, with autograd, as long as backward keeps them",
            RuleId::AutocastCpuOnlyCasts => "input copies CPU autocast made and CUDA autocast does not (the CPU's fp32 loss and promote lists: cross_entropy_loss, cat, stack) are dropped",
            RuleId::AutocastCastCache => "CUDA autocast caches the 16-bit copy of each parameter once per region until the outermost autocast exits (not under inference_mode from PyTorch 2.10); the CPU's per-call copies of a parameter (einsum's bmm) follow it",
            RuleId::CpuLowpMatmulCopies => "the contiguous copies CPU bf16/fp16 matrix-product kernels make of a transposed operand are dropped: cuBLAS reads it in place",
            RuleId::AutocastBackward => "blocks a backward node makes change type with the outputs of its forward op (a gradient has its tensor's type); a guess at the block level",
            RuleId::BnbCudaKernels => "bitsandbytes ops whose CPU backend computes through ATen temporaries run CUDA kernels that allocate their outputs only, plus a float16 result in int8_mm_dequant and the float16 |A| and bool outlier mask in int8_vectorwise_quant: the CPU's temporaries inside int8_linear_matmul (float32 copies of both int8 operands), int8_mm_dequant, int8_vectorwise_quant, dequantize_4bit, dequantize_blockwise and a gemm_4bit of at most 4 rows (7 in float32: the fused kernel, no dequantized weight) are replaced by the CUDA ones",
            RuleId::SdpaCudaKernels => "scaled_dot_product_attention runs the CUDA backend PyTorch selects for each GPU's architecture (cuDNN, flash, memory-efficient or math: dtype, head dims, mask, dropout, grouped-query attention): what the CPU kernel allocated beside the output and the input gradients is replaced by that backend's saved statistics and workspaces, or by the math path's scores, probabilities and masks; a fused kernel keeps query, key and value for its backward where the CPU's math composite did not, and where the CPU's flash kernel kept them and the GPU runs the math composite (which keeps copies of its own) they die when the backward pass starts; where the CPU ran the math composite, the copy its caller's reshape makes of the output (transposed to [batch, tokens, heads x dim]) is made only where the GPU runs the math composite too: a fused kernel writes its output in that layout (attention.cu; cuDNN's MHA.cpp alloc_with_matching_layout), so the reshape is a view and the output lives as long as the copy would have",
            RuleId::DropoutCudaMask => "dropout's mask is a bool tensor on CUDA (native_dropout), one byte an element, where the CPU makes it in the input's dtype",
            RuleId::CudaReduceBuffers => "a CUDA sum or mean that splits its rows across thread blocks (a bias gradient over many tokens) allocates a global buffer for their partial results while it runs, sized by the GPU's multiprocessors (Reduce.cuh's setReduceConfig)",
            RuleId::CudnnConvWorkspaces => "each convolution pass cuDNN runs (forward, backward-data, backward-filter; not an fp32 or bf16 depthwise one, which PyTorch runs itself) allocates its plan's workspace through the caching allocator and frees it when the pass returns (Conv_v8.cpp run_conv_plan, Conv_v7.cpp allocate_workspace); under the default heuristics the workspace measured on an H200 is a copy of the input, the weight (none of a 1x1 one) and the output, none where cuDNN reads them in place (a 1x1 window at stride 1; an input of fewer than 8 channels under a window of at most 3, forward and fp32 backward), and a backward holds the data pass's, then the filter pass's, which takes 15 % more for its split reduction's partial sums (the median of the filter passes measured; kernels/conv.rs)",
            RuleId::CudaSoftmaxBackward => "a CUDA softmax backward first multiplies the incoming gradient by the softmax's output into a temporary of the gradient's size, freed when it returns (SoftMax.cu's softmax_backward_cuda_out: tmp = grad * output); the CPU kernel makes none",
            RuleId::Gradients => "a gradient lives until the zero_grad that frees it: a captured free outside zero_grad is moved to the next zero_grad; with set_to_none=False gradients are never freed",
            RuleId::BatchHandover => "a batch lives until just after the next batch is loaded, so both are briefly alive, and never past the next iteration's data loading",
            RuleId::ForeachOptimizer => "torch.optim optimizers left at their default run the foreach path on CUDA: the captured per-tensor step temporaries are replaced by whole lists of parameter-sized temporaries alive until the step ends",
            RuleId::Iterations => "simulate the requested number of iterations (default 3): later iterations repeat the last captured one, which is in steady state",
            RuleId::CublasWorkspaces => "one cuBLAS workspace per thread and stream, allocated through the caching allocator at the first forward (main thread) and backward (autograd thread) of the run",
            RuleId::GradScalerState => "with fp16 and a GradScaler: its scale and growth tracker (kept from the first backward) and each step's inverse scale and found-inf flag",
        }
    }
}

/// How many blocks each rule added, dropped or moved.
type RuleCounts = BTreeMap<RuleId, u32>;

/// One block instance while the rules run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Item {
    pub size: Bytes,
    pub category: Category,
    pub iteration: Option<u32>,
    pub phase: Phase,
    pub op: Option<String>,
    pub layer: Option<String>,
    pub alloc: Key,
    pub free: Option<Key>,
    /// The analyzer block it comes from, if any.
    pub source: Option<usize>,
    /// The rule that added it, for blocks no trace block stands for.
    pub rule: Option<RuleId>,
    /// The GPU architectures that make it (a kernel rule's block made by
    /// one backend only); every one by default.
    pub on: crate::kernels::ArchSet,
    /// Sized per GPU (`size` a placeholder).
    pub per_gpu: Option<crate::kernels::PerGpu>,
}

/// A name of the analysis, `None` when absent or empty.
fn name_of(analysis: &Analysis, id: Option<NameId>) -> Option<String> {
    id.map(|id| analysis.name(id).to_owned())
        .filter(|name| !name.is_empty())
}

/// A count that fits the report's `u32`.
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Applies every rule in [`RuleId::ALL`] order: the setup blocks, the
/// captured blocks over the planned iterations (minus the dropped ones), the
/// lifetime rules, the foreach optimizer path and the cuBLAS workspaces;
/// then sorts everything into a schedule. Returns the schedule and what each
/// rule did.
pub(crate) fn apply_all(
    analysis: &Analysis,
    config: &OrchestratorConfig,
    warnings: &mut Vec<Warning>,
) -> Result<(Schedule, OrchestrationFacts), OrchestrateError> {
    let mut counts = RuleCounts::new();
    let (mut items, state) =
        setup::setup_items(analysis, config.parameters, &mut counts, warnings)?;

    // Captured blocks over the planned iterations, as CUDA autocast runs them.
    let mut changes = autocast::changes(analysis, &config.autocast, warnings);
    let autocast_bytes: Vec<RuleBytes> = changes
        .bytes(analysis)
        .into_iter()
        .map(|(rule, bytes)| RuleBytes { rule, bytes })
        .collect();
    bnb::apply(analysis, &mut changes);
    let version = config
        .autocast
        .policy()
        .unwrap_or_else(crate::autocast::PolicyVersion::latest);
    let kernel_notes = kernels::apply(
        analysis,
        crate::kernels::attention::Rules {
            efficient_gqa: version.efficient_attention_gqa,
        },
        config.autocast.dtype == Some(crate::autocast::Dtype::F16),
        &mut changes,
    );
    if kernel_notes.iter().any(|n| n.family == "attention") {
        warnings.push(Warning::new(
            "attention_backend_assumed",
            format!("scaled_dot_product_attention is estimated with the CUDA backend PyTorch {} picks by default on each GPU (the report names it per GPU); a script that restricts the backends (torch.nn.attention.sdpa_kernel, torch.backends.cuda.enable_flash_sdp and the like) or a PyTorch built with an older cuDNN (which puts flash attention before cuDNN's on Hopper) runs another, with other saved tensors and workspaces", version.torch),
        ));
    }
    let plan = iterations::plan_iterations(analysis, config.iterations, warnings);
    let (captured, dropped) = captured::captured_items(analysis, &plan, &changes);
    counts.extend(dropped);
    items.extend(captured);
    let windows = iterations::phase_windows(analysis, &plan);
    setup::place_lazy_optimizer_state(analysis, &windows, &mut items);

    let moved = lifetimes::rule_gradients(&mut items, &windows);
    counts.insert(RuleId::Gradients, moved);
    if analysis.zero_grad.set_to_none == Some(false) {
        warnings.push(Warning::new(
            "gradients_kept",
            "zero_grad(set_to_none=False) was captured: gradients stay allocated across iterations",
        ));
    }
    let handovers = lifetimes::handovers(&windows);
    let moved = lifetimes::rule_batch_handover(&mut items, &handovers);
    counts.insert(RuleId::BatchHandover, moved);

    let foreach_modelled = foreach::apply_foreach(
        analysis,
        config.optimizer_path,
        config.remodel_foreach,
        &windows,
        &mut items,
        &mut counts,
        warnings,
    );

    let start_of_first_iteration = plan
        .copies
        .first()
        .and_then(|c| analysis.iterations.get(c.source))
        .map(|it| it.start);
    let workspaces = workspaces::rule_cublas_workspaces(&items, &windows, start_of_first_iteration);
    counts.insert(RuleId::CublasWorkspaces, count(workspaces.len()));
    items.extend(workspaces);
    if config.autocast.grad_scaler {
        let scaler = autocast::grad_scaler_items(&windows);
        counts.insert(RuleId::GradScalerState, count(scaler.len()));
        items.extend(scaler);
    }
    // Only a job that convolves uses cuDNN's convolution workspaces.
    if !analysis.devices.recorded_on_cuda && !analysis.kernel_calls.conv.is_empty() {
        warnings.push(Warning::new(
            "cudnn_workspace_assumed",
            "each cuDNN convolution pass is estimated with the workspace cuDNN 9.19's default heuristics took on an H200 (torch 2.11): a copy of the tensors the pass touches, none where it reads them in place (an assumption on other GPUs and cuDNN versions, whose heuristics may pick plans with other workspaces; the backward-filter pass measured up to 1.3 times the copy). With torch.backends.cudnn.benchmark=True cuDNN times the plans whose workspace fits the largest free cached block and keeps the fastest; torch.backends.cudnn.deterministic or allow_tf32 changes the plans it may pick; and where a workspace cannot be allocated PyTorch runs the next plan, slower, instead of failing",
        ));
    }

    let facts = OrchestrationFacts {
        iterations_captured: count(analysis.iterations.len()),
        iterations_simulated: count(plan.copies.len()),
        foreach_modelled,
        // In rule order: `RuleId`'s order is its declaration order.
        rule_counts: counts
            .into_iter()
            .map(|(rule, blocks)| RuleCount { rule, blocks })
            .collect(),
        autocast_bytes,
        state,
        cpu_scratch: dropped::scratch_by_op(analysis),
    };
    let mut schedule = into_schedule(items, iterations::iteration_spans(analysis, &plan));
    schedule.phases = windows;
    schedule.kernels = kernel_notes;
    Ok((schedule, facts))
}

/// Turns items into a schedule: blocks in allocation order, events sorted by
/// key (an allocation before its own free when they tie).
fn into_schedule(mut items: Vec<Item>, iterations: Vec<IterationSpan>) -> Schedule {
    items.sort_by_key(|item| item.alloc);
    let mut events: Vec<(Key, u8, ScheduleEvent)> = Vec::with_capacity(items.len() * 2);
    let mut blocks = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        let id = BlockId(index as u32);
        events.push((
            item.alloc,
            0,
            ScheduleEvent {
                time: item.alloc.time,
                kind: EventKind::Alloc,
                block: id,
            },
        ));
        if let Some(free) = item.free {
            let free = free.max(item.alloc);
            events.push((
                free,
                1,
                ScheduleEvent {
                    time: free.time,
                    kind: EventKind::Free,
                    block: id,
                },
            ));
        }
        blocks.push(ScheduledBlock {
            size: item.size,
            category: item.category,
            iteration: item.iteration,
            phase: item.phase,
            op: item.op,
            layer: item.layer,
            on: item.on,
            per_gpu: item.per_gpu,
        });
    }
    events.sort_by_key(|&(key, kind, event)| (key, kind, event.block));
    Schedule {
        blocks,
        events: events.into_iter().map(|(_, _, event)| event).collect(),
        iterations,
        phases: Vec::new(),
        kernels: Vec::new(),
    }
}

/// The windows of one phase, in schedule order.
fn windows_of(windows: &[PhaseWindow], phase: Phase) -> impl Iterator<Item = &PhaseWindow> {
    windows.iter().filter(move |w| w.phase == phase)
}

/// The start of the first window of a phase.
fn first_start(windows: &[PhaseWindow], phase: Phase) -> Option<Nanos> {
    windows_of(windows, phase).map(|w| w.start).min()
}

/// When an optimizer step's update begins: after the closure it ran, if
/// any. `optimizer.step(closure)` (Lightning's automatic optimization,
/// LBFGS) calls the closure — forward, zero_grad, backward — first; only
/// then does `_init_group` build missing state and the update make its
/// temporaries (`torch/optim/*.py`). The end of the last other phase of the
/// same iteration inside the step's window, else the window's start.
fn update_start(windows: &[PhaseWindow], step: &PhaseWindow) -> Nanos {
    windows
        .iter()
        .filter(|w| w.iteration == step.iteration && w.phase != Phase::OptimizerStep)
        .filter(|w| w.start >= step.start && w.end <= step.end)
        .map(|w| w.end)
        .fold(step.start, Nanos::max)
}
