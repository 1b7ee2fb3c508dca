//! Stage 1 — **analyzer**: typed trace events → memory-block lifecycles with
//! attribution (xMem §3.2, VeritasEst §III-A/B).
//!
//! Input: a parsed [`Trace`]. Output: an [`Analysis`] with every memory block
//! (allocation paired with its free by address in time order, or persistent),
//! the iterations and their phases (data loading, forward, zero_grad, backward,
//! optimizer step), the innermost op and model layer of every block, and the
//! evidence the orchestrator needs (parameters from `AccumulateGrad` shapes,
//! gradient, optimizer-state and batch blocks).
//!
//! Invariants:
//! - Pure: no I/O, no clock, no environment; the same trace gives the same
//!   analysis, in the same order.
//! - Attribution uses an interval index over the span tree, not a scan per block.
//! - The running sum of block sizes reproduces the trace's `Total Allocated` at
//!   every event.
//! - All times in an [`Analysis`] are relative to [`Analysis::origin`].
//!
//! Rules, each checked on the 11 CPU fixtures (`tests/integration/analyzer.rs`):
//! - Pairing: an allocation pairs with the next free of the same address on
//!   the same device; a free with no allocation is memory from before the
//!   profiler started (counted, warned, never fatal).
//! - Operator-internal: freed before an op running at its allocation returned.
//! - Gradient: for each `AccumulateGrad` call, the latest unclaimed block of
//!   the parameter's size (numel × dtype size from `Input Dims`/`Input type`)
//!   allocated in the same iteration's backward, no later than the call, that
//!   outlives backward; else the latest one live at the call, which is then a
//!   temporary added into an existing `.grad` (`set_to_none=False`).
//! - Parameter: a leaf `AccumulateGrad` runs for, unless every gradient it
//!   kept died before its iteration's optimizer step ended (a leaf the
//!   forward made, freed with its graph; the optimizer holds its parameters).
//! - Optimizer state: allocated in the first `Optimizer.step`, never freed.
//! - Batch: allocated under the DataLoader `__next__`, outliving it.
//! - Layer: the `nn.Module` frames around the allocating op; in backward,
//!   those of the forward op linked by `fwdbwd` flow or sequence number.

mod autocast;
mod evidence;
pub mod generation;
pub mod kernels;
mod leaves;
mod lifecycle;
pub mod moe;
mod phases;
pub mod quantized;
mod recipes;
pub(crate) use phases::locate;
pub mod resident;
mod spans;
mod summary;
mod zero_grad;

pub(crate) use autocast::inference_at;
pub use autocast::{AutocastRegion, GradMode, InferenceSpan};
pub use summary::{
    summarize, AnalysisSummary, BeforeTraceSummary, BufferSummary, IterationSummary, LayerSummary,
    ParameterSummary, PhaseBytes, PhaseTime, RoleTotals, SUMMARY_SCHEMA, SUMMARY_TOP_LAYERS,
};

pub use recipes::{Checkpointing, Distributed, RunRecipe, TrainingLoop};
pub use resident::{ModelState, RunKind, StateKind};

use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::diag::{Warned, Warning};
use crate::trace::{Device, NameId, TensorInput, Trace};
use crate::units::{Bytes, Nanos};

pub use crate::trace::ACCUMULATE_GRAD;

/// The ops a data loader's collate function stacks the samples with: the
/// length of their tensor-list argument is the batch size.
pub const COLLATE_OPS: &[&str] = &["aten::stack", "aten::cat"];

/// Settings of the analyzer. Build one with [`AnalyzerConfig::standard`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnalyzerConfig {
    /// Op-name prefixes of CPU kernels whose operator-internal blocks are
    /// scratch with no GPU counterpart (oneDNN/mkldnn reorders).
    pub cpu_scratch_op_prefixes: Vec<String>,
    /// Fail with [`AnalyzeError::GpuTraceWithoutPythonFrames`] for a GPU
    /// trace without `python_function` events (replay mode is what reads
    /// those). A CPU trace without them is always analyzed: layers stay
    /// unknown and forward and backward are found from markers and ops.
    /// `false` analyzes GPU traces that way too (CUDA validation traces).
    pub require_python_frames: bool,
    /// Keep every op's tensor arguments ([`Analysis::op_inputs`]) even when
    /// the trace ran no autocast region: the mixed-precision what-if runs
    /// an fp32 trace's forward through the autocast rules with them.
    #[serde(default)]
    pub keep_op_inputs: bool,
}

impl AnalyzerConfig {
    /// The settings for a CPU trace captured as the trace-format doc describes.
    pub fn standard() -> AnalyzerConfig {
        AnalyzerConfig {
            cpu_scratch_op_prefixes: vec![
                "aten::mkldnn_".to_owned(),
                "aten::to_mkldnn".to_owned(),
                "aten::_mkldnn".to_owned(),
                "mkldnn::".to_owned(),
            ],
            require_python_frames: true,
            keep_op_inputs: false,
        }
    }
}

/// The phase of a training run an instant, a block or an event belongs to:
/// the analyzer places the trace's instants in the phases of their
/// iteration, the orchestrator adds the setup before the first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before the first iteration: `model.to(device)`, the optimizer
    /// constructor. Only the orchestrator's setup blocks are here; the
    /// analyzer never places an instant of the trace in it.
    Setup,
    /// Inside the DataLoader `__next__` annotation.
    DataLoading,
    /// Inside an `Optimizer.zero_grad#...` annotation.
    ZeroGrad,
    /// From the first top-level `nn.Module` call to the end of the last one
    /// before backward (model and loss).
    Forward,
    /// The `backward` Python call, or the autograd-engine ops without frames.
    Backward,
    /// Gradient clipping between the last backward and the optimizer step
    /// (`clip_grad_norm_`, `clip_grad_value_`, or their norm ops without frames).
    ClipGrad,
    /// Inside an `Optimizer.step#...` annotation.
    OptimizerStep,
    /// Anywhere else (gaps, `loss.item()`, outside every iteration).
    Other,
}

impl Phase {
    /// Every phase of an iteration, in display order.
    pub const ALL: [Phase; 7] = [
        Phase::DataLoading,
        Phase::ZeroGrad,
        Phase::Forward,
        Phase::Backward,
        Phase::ClipGrad,
        Phase::OptimizerStep,
        Phase::Other,
    ];

    /// A short lowercase label.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::DataLoading => "data_loading",
            Phase::ZeroGrad => "zero_grad",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::ClipGrad => "clip_grad",
            Phase::OptimizerStep => "optimizer_step",
            Phase::Other => "other",
        }
    }
}

/// One phase interval of an iteration, `[start, end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseSpan {
    pub phase: Phase,
    pub start: Nanos,
    pub end: Nanos,
}

/// Where `zero_grad` sits in an iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ZeroGradPlacement {
    /// Before the forward pass ("pos1"): old gradients are freed before forward.
    #[serde(rename = "pos1")]
    BeforeForward,
    /// Between forward and backward ("pos0"): old gradients live through forward.
    #[serde(rename = "pos0")]
    BeforeBackward,
    /// After backward, or no forward/backward was found to compare with.
    #[serde(rename = "other")]
    Elsewhere,
}

/// One training iteration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Iteration {
    /// Position in [`Analysis::iterations`].
    pub index: usize,
    /// The `ProfilerStep#N` annotation name, or `None` when iterations were
    /// inferred from the optimizer-step / backward pattern.
    pub label: Option<String>,
    pub start: Nanos,
    pub end: Nanos,
    /// Phase intervals in time order (only phases that were found). An
    /// iteration with several micro-batches has one forward and one backward
    /// span per micro-batch.
    pub phases: Vec<PhaseSpan>,
    /// Forward/backward passes (micro-batches) in this optimizer step: the
    /// backward passes found in it (0 for a loop without backward).
    #[serde(default)]
    pub micro_batches: u32,
    /// Where this iteration's `zero_grad` ran, if it had one.
    pub zero_grad: Option<ZeroGradPlacement>,
    /// Allocated bytes per phase (sum of allocation sizes, frees ignored).
    pub allocated_by_phase: BTreeMap<Phase, Bytes>,
    /// Allocation and free events inside the iteration.
    pub n_allocs: usize,
    pub n_frees: usize,
    /// Highest running total (trace-relative, as reproduced from the blocks)
    /// reached inside the iteration.
    pub peak: Bytes,
}

/// What a block is, as far as the analyzer can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BlockRole {
    /// The gradient of parameter `param` (an index into [`Analysis::parameters`]).
    Gradient { param: usize },
    /// Optimizer state: allocated in the first `Optimizer.step`, never freed.
    OptimizerState,
    /// An input batch tensor: allocated under the DataLoader `__next__` and
    /// still live when it returns.
    Batch,
    /// A parameter the trace allocated (the model was built inside the
    /// profiled region): found by [`resident`] as a tensor the forward reads.
    Parameter,
    /// A buffer the trace allocated, likewise.
    Buffer,
    /// A DistributedDataParallel gradient bucket the reducer (re)built
    /// inside the trace: read by its all-reduce in backward.
    Bucket,
    /// A generation's KV cache: keys and values a call of the model makes
    /// and a later call reads ([`generation`]).
    KvCache,
    /// Made while bitsandbytes re-lays a 4-bit weight out for its CPU
    /// kernel ([`quantized`]): a CUDA run makes none of it.
    CpuRepack,
    /// Anything else: activations and temporaries (decided by later stages).
    Other,
}

/// One memory block: an allocation and its free (if any).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    /// Position in [`Analysis::blocks`] (allocation order).
    pub id: usize,
    pub addr: u64,
    pub size: Bytes,
    pub device: Device,
    pub alloc_ts: Nanos,
    /// `None`: never freed inside the trace (persistent).
    pub free_ts: Option<Nanos>,
    /// Index of the allocation in [`Analysis::events`].
    pub alloc_event: usize,
    /// Index of the free in [`Analysis::events`].
    pub free_event: Option<usize>,
    /// Innermost `cpu_op` running at allocation (index into [`Analysis::ops`]).
    pub alloc_op: Option<usize>,
    /// Its name (interned in [`Analysis::names`]).
    pub alloc_op_name: Option<NameId>,
    /// Innermost `cpu_op` running at the free.
    pub free_op: Option<usize>,
    pub free_op_name: Option<NameId>,
    /// The `nn.Module` path at allocation, e.g. `ResNet_0/Sequential_0/BasicBlock_1/Conv2d_3`
    /// (interned). In backward, the layer of the forward op linked to the
    /// allocating autograd node.
    pub layer: Option<NameId>,
    pub alloc_iteration: Option<usize>,
    pub alloc_phase: Phase,
    pub free_iteration: Option<usize>,
    pub free_phase: Option<Phase>,
    /// Allocated and freed inside one operator call (xMem's filtering rule):
    /// freed before an op that was running at allocation returned. Such
    /// operator-internal temporaries do not outlive their operator.
    pub op_internal: bool,
    /// For an operator-internal block, the innermost op (index into
    /// [`Analysis::ops`]) that contains both the allocation and the free.
    /// Equal to `alloc_op` when the innermost op at allocation frees it itself.
    pub internal_to: Option<usize>,
    /// An operator-internal block of a CPU-only kernel (oneDNN/mkldnn), which
    /// has no counterpart on a GPU.
    pub cpu_scratch: bool,
    pub role: BlockRole,
}

/// One `[memory]` event in time order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryRecord {
    pub ts: Nanos,
    pub tid: i64,
    pub addr: u64,
    /// Signed size: positive allocation, negative free.
    pub delta: i64,
    /// `Total Allocated` as recorded in the trace.
    pub total_allocated: Option<i64>,
    pub device: Device,
    /// The block this event allocates or frees; `None` for a free of memory
    /// allocated before profiling started.
    pub block: Option<usize>,
    pub iteration: Option<usize>,
    pub phase: Phase,
}

/// One `cpu_op` call, sorted by thread, start, longer first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSpan {
    pub name: NameId,
    pub tid: i64,
    pub start: Nanos,
    pub end: Nanos,
    /// The enclosing op on the same thread (by time containment).
    pub parent: Option<usize>,
    pub sequence_number: Option<i64>,
    /// A backward op (autograd node or run by one, `Fwd thread id` > 0).
    pub backward: bool,
    /// For a backward op: the forward op that created its autograd node
    /// (linked by `fwdbwd` flow or equal sequence number).
    pub forward_op: Option<usize>,
    /// The `nn.Module` path at the op's start (forward ops) or of its forward op.
    pub layer: Option<NameId>,
    /// Its tensor arguments (element count and type), as the trace records
    /// them: a range of [`Analysis::op_inputs`] ([`Analysis::inputs_of`]).
    #[serde(default)]
    pub inputs: std::ops::Range<u32>,
}

/// One trainable parameter recovered from `AccumulateGrad` shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parameter {
    /// Position in [`Analysis::parameters`]. Parameters are listed in the
    /// reverse of the order in which the first backward pass ran their
    /// `AccumulateGrad`; for a sequential model that is the order of
    /// `model.parameters()` (an approximation for branching models).
    pub index: usize,
    pub shape: Vec<i64>,
    pub numel: u64,
    /// The dtype name recorded on `AccumulateGrad` (`"float"`, `"c10::Half"`, ...).
    pub dtype: Option<String>,
    pub bytes: Bytes,
    /// The layer of the forward op whose backward produced its gradient.
    pub layer: Option<NameId>,
    /// Sized by its gradient block: the trace has no shapes
    /// (`record_shapes=False`), so `shape` is empty and `numel` unknown (0).
    #[serde(default)]
    pub sized_by_gradient: bool,
}

/// Totals over [`Analysis::parameters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParameterTotals {
    pub count: usize,
    pub numel: u64,
    pub bytes: Bytes,
}

/// What `zero_grad` does in this trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZeroGradFacts {
    /// Number of `Optimizer.zero_grad` annotations.
    pub n_calls: usize,
    /// The placement of the calls (the most common one when they differ).
    pub placement: Option<ZeroGradPlacement>,
    /// `Some(true)` if a zero_grad freed blocks (set_to_none), `Some(false)` if
    /// it ran `aten::zero_`, `None` if it did neither (no gradient existed yet).
    pub set_to_none: Option<bool>,
}

/// What the optimizer does in this trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OptimizerFacts {
    /// Class name from `Optimizer.step#<Class>.step`.
    pub class_name: Option<String>,
    /// Number of `Optimizer.step` annotations.
    pub n_steps: usize,
    /// Whether a step ran `aten::_foreach_*` ops (multi-tensor implementation).
    pub uses_foreach: bool,
    /// Whether the `step` Python frame comes from `torch/optim/` (`Some(false)`:
    /// a custom optimizer; `None`: no frame found).
    pub torch_optim: Option<bool>,
    /// Blocks allocated in the first step and never freed.
    pub n_state_blocks: usize,
    pub state_bytes: Bytes,
}

/// Memory events per device, and whether the trace was recorded on CUDA.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSummary {
    pub events_by_device: BTreeMap<Device, usize>,
    /// CUDA memory events, GPU-side events or GPU device properties were seen.
    pub recorded_on_cuda: bool,
}

/// Bytes of live blocks attributed to one layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerAtPeak {
    /// `None`: blocks with no layer (outside every `nn.Module`).
    pub layer: Option<NameId>,
    pub bytes: Bytes,
    pub n_blocks: usize,
}

/// The highest running total of the trace's own allocations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracePeak {
    pub bytes: Bytes,
    /// The event right after which the peak is reached.
    pub event: usize,
    pub ts: Nanos,
}

/// Everything the analyzer found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Analysis {
    /// The raw trace time that is time 0 here (the earliest kept event).
    pub origin: Nanos,
    /// Interned names: op names, layer paths. [`NameId`] indexes here.
    pub names: Vec<String>,
    /// `[memory]` events in time order (ties in file order).
    pub events: Vec<MemoryRecord>,
    /// Blocks in allocation order.
    pub blocks: Vec<Block>,
    /// Indices of events that free memory allocated before profiling started.
    pub unmatched_frees: Vec<usize>,
    pub ops: Vec<OpSpan>,
    pub iterations: Vec<Iteration>,
    pub parameters: Vec<Parameter>,
    pub parameter_totals: ParameterTotals,
    pub zero_grad: ZeroGradFacts,
    pub optimizer: OptimizerFacts,
    pub devices: DeviceSummary,
    pub peak: TracePeak,
    /// Live bytes per layer at [`Analysis::peak`], largest first (ties by name).
    pub layers_at_peak: Vec<LayerAtPeak>,
    /// Samples per batch as the data loader made it, when the trace shows it
    /// (see [`loader_batch_size`]).
    #[serde(default)]
    pub batch_size: Option<u32>,
    /// The run's structure and training recipe (micro-batches per step,
    /// checkpointing, clipping, torch.compile, distributed, the loop).
    #[serde(default)]
    pub recipe: RunRecipe,
    /// The `torch.autocast` regions, in time order.
    #[serde(default)]
    pub autocast: Vec<AutocastRegion>,
    /// The `torch.inference_mode()` contexts, by thread and start: the
    /// cast cache is decided at each cast from the mode in force then.
    #[serde(default)]
    pub inference_mode: Vec<InferenceSpan>,
    /// The ops' tensor arguments ([`OpSpan::inputs`]): kept when the trace
    /// has an autocast region or the config asks for them, empty otherwise.
    #[serde(default)]
    pub op_inputs: Vec<TensorInput>,
    /// The model's resident state (every parameter, buffers, state made
    /// before the trace) and the kind of run ([`resident`]).
    #[serde(default)]
    pub state: resident::ModelState,
    /// A `generate()` run: its calls and KV cache ([`generation`]).
    #[serde(default)]
    pub generation: Option<generation::Generation>,
    /// The bitsandbytes kernel calls of a quantized model ([`quantized`]).
    #[serde(default)]
    pub quant_kernels: Vec<quantized::QuantKernel>,
    /// The calls whose CUDA kernels allocate otherwise than the CPU's
    /// (attention, dropout: [`kernels`]).
    #[serde(default)]
    pub kernel_calls: kernels::KernelCalls,
    /// A mixture-of-experts model's layers, experts and routing ([`moe`]).
    #[serde(default)]
    pub moe: Option<moe::Moe>,
}

/// The batch size of a trace as its data loader made it: the number of
/// samples the collate function stacked (the tensor list of the first
/// `aten::stack` or `aten::cat` inside the first `DataLoader … __next__`
/// span), read from `Input Dims`. `None` when the trace has no such op (the
/// profiler leaves long tensor lists out of `Input Dims`).
pub fn loader_batch_size(trace: &Trace) -> Option<u32> {
    let is_next = |name: &str| name.contains("DataLoader") && name.contains("__next__");
    let spans = trace
        .annotations
        .iter()
        .map(|a| (a.name, a.start, a.dur))
        .chain(trace.python.iter().map(|p| (p.name, p.start, p.dur)))
        .chain(trace.ops.iter().map(|o| (o.name, o.start, o.dur)));
    let (start, end) = spans
        .filter(|&(name, _, _)| is_next(trace.name(name)))
        .map(|(_, start, dur)| (start, start.saturating_add(dur)))
        .min()?;
    trace
        .ops
        .iter()
        .filter(|o| o.start >= start && o.start <= end)
        .filter(|o| COLLATE_OPS.contains(&trace.name(o.name)))
        .filter_map(|o| o.tensor_list_len.filter(|&n| n > 0).map(|n| (o.start, n)))
        .min()
        .map(|(_, n)| n)
}

impl Analysis {
    /// The name behind an id (empty for an unknown id).
    /// The tensor arguments of `op` (none when they were not kept).
    pub fn inputs_of(&self, op: &OpSpan) -> &[TensorInput] {
        let range = op.inputs.start as usize..op.inputs.end as usize;
        self.op_inputs.get(range).unwrap_or(&[])
    }

    pub fn name(&self, id: NameId) -> &str {
        self.names.get(id.index()).map_or("", String::as_str)
    }

    /// Blocks never freed inside the trace.
    pub fn persistent_blocks(&self) -> impl Iterator<Item = &Block> {
        self.blocks.iter().filter(|b| b.free_ts.is_none())
    }

    /// Allocated bytes per phase over all iterations.
    pub fn allocated_by_phase(&self) -> BTreeMap<Phase, Bytes> {
        let mut out = BTreeMap::new();
        for block in &self.blocks {
            *out.entry(block.alloc_phase).or_insert(Bytes::ZERO) += block.size;
        }
        out
    }
}

/// Why a trace could not be analyzed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnalyzeError {
    #[error("the trace has no [memory] events: profile with torch.profiler.profile(profile_memory=True) and export again")]
    NoMemoryEvents,
    #[error("this is a GPU profiler trace without python_function events: to check memcast against the memory it recorded use replay mode (`memcast replay FILE`); to estimate a job, profile it on the CPU with torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True)")]
    GpuTraceWithoutPythonFrames,
    #[error("the trace has [memory] events for several GPUs, but memcast estimates one device: profile a single-process run on one device (CUDA_VISIBLE_DEVICES=0) or on the CPU, got device ids {0:?}")]
    SeveralGpus(Vec<i64>),
}

/// Analyzes a parsed trace.
pub fn analyze(trace: &Trace, config: &AnalyzerConfig) -> Result<Warned<Analysis>, AnalyzeError> {
    if trace.memory.is_empty() {
        return Err(AnalyzeError::NoMemoryEvents);
    }
    if config.require_python_frames && trace.python.is_empty() && trace.recorded_on_cuda() {
        return Err(AnalyzeError::GpuTraceWithoutPythonFrames);
    }
    let gpu_ids: BTreeSet<i64> = trace
        .memory
        .iter()
        .filter(|m| m.device.is_gpu())
        .map(|m| m.device_id.unwrap_or(0))
        .collect();
    if gpu_ids.len() > 1 {
        return Err(AnalyzeError::SeveralGpus(gpu_ids.into_iter().collect()));
    }
    let mut warnings: Vec<Warning> = Vec::new();
    if trace.recorded_on_cuda() {
        warnings.push(Warning::new(
            "gpu_trace",
            "this trace was recorded on a GPU, so its GPU blocks are taken as they are; to check memcast's allocator model against what the GPU really reserved, use replay mode (`memcast replay FILE`)",
        ));
    }
    if trace.python.is_empty() && !trace.recorded_on_cuda() {
        warnings.push(Warning::new(
            "no_python_frames",
            "the trace was recorded without with_stack=True, so it has no Python frames: the forward and backward passes come from the ProfilerStep, optimizer and autograd-engine markers and the op names, and the breakdown is by operator instead of by model layer; profile with torch.profiler.profile(with_stack=True) to get the layers back",
        ));
    }
    let mut names = Names::from_trace(trace);
    let origin = origin_of(trace);

    let index = spans::SpanIndex::build(trace, origin, &mut names, &mut warnings);
    let mut life = lifecycle::pair_blocks(trace, origin, &mut warnings);
    let trace_end = trace_end_of(&life, &index);
    let iterations = phases::find_iterations(&index, trace_end, &names, &mut warnings);
    let mut iterations = iterations;
    evidence::attribute(&mut life, &index, &iterations, config, &names);
    let found = evidence::evidence(trace, &mut life, &index, &iterations, &names, &mut warnings);
    zero_grad::infer_zero_grad(&mut life, &mut iterations, &mut warnings);
    let found = zero_grad::finish(found, &mut life, &index, &iterations, &names);
    let recipe = recipes::find(trace, &index, &iterations, &names, &mut warnings);
    let cpu_packing = quantized::mark_cpu_packing(&mut life, &index, &names);
    let state = resident::find(
        &resident::Inputs {
            trace,
            index: &index,
            iterations: &iterations,
            names: &names,
            parameters: found.parameters(),
            optimizer: found.optimizer(),
            cpu_packing: &cpu_packing,
        },
        &mut life,
        &mut warnings,
    );

    let generation = generation::find(trace, &mut life, &index, &iterations, &names);
    let (regions, inference_mode) = autocast::find_regions(&index, &names, &trace.tensor_args);
    let quant_kernels = quantized::kernels(trace, &index, &names);
    let kernel_calls = kernels::find(trace, &index, &names, &life);
    let mut moe = moe::find(trace, &index, &names, &life);
    if let Some(m) = moe.as_mut() {
        moe::set_expert_bytes(m, &state, &names);
        warnings.push(moe::routing_warning(m));
    }
    let op_inputs = if regions.is_empty() && !config.keep_op_inputs {
        Vec::new()
    } else {
        trace.tensor_args.clone()
    };
    let mut analysis = evidence::assemble(trace, life, index, iterations, found, names);
    analysis.recipe = recipe;
    analysis.autocast = regions;
    analysis.inference_mode = inference_mode;
    analysis.op_inputs = op_inputs;
    analysis.state = state;
    analysis.generation = generation;
    analysis.quant_kernels = quant_kernels;
    analysis.kernel_calls = kernel_calls;
    analysis.moe = moe;
    Ok(Warned {
        value: analysis,
        warnings,
    })
}

/// The earliest time of any kept event: time 0 of the analysis.
fn origin_of(trace: &Trace) -> Nanos {
    let starts = trace
        .memory
        .iter()
        .map(|m| m.ts)
        .chain(trace.ops.iter().map(|o| o.start))
        .chain(trace.annotations.iter().map(|a| a.start))
        .chain(trace.python.iter().map(|p| p.start));
    starts.min().unwrap_or(Nanos::ZERO)
}

/// The latest time of any kept event, relative to the origin.
fn trace_end_of(life: &lifecycle::Life, index: &spans::SpanIndex) -> Nanos {
    let ends = life
        .events
        .iter()
        .map(|e| e.ts)
        .chain(index.ops.spans.iter().map(|o| o.end))
        .chain(index.frames.spans.iter().map(|f| f.end))
        .chain(index.annotations.iter().map(|a| a.end));
    ends.max().unwrap_or(Nanos::ZERO)
}

/// The name table of an analysis: the trace's names plus layer paths.
pub(crate) struct Names {
    names: Vec<String>,
    lookup: FxHashMap<String, NameId>,
}

impl Names {
    fn from_trace(trace: &Trace) -> Names {
        let mut lookup = FxHashMap::with_capacity_and_hasher(trace.names.len(), Default::default());
        for (i, name) in trace.names.iter().enumerate() {
            lookup
                .entry(name.clone())
                .or_insert(NameId(u32::try_from(i).unwrap_or(u32::MAX)));
        }
        Names {
            names: trace.names.clone(),
            lookup,
        }
    }

    fn intern(&mut self, name: &str) -> NameId {
        if let Some(&id) = self.lookup.get(name) {
            return id;
        }
        let id = NameId(u32::try_from(self.names.len()).unwrap_or(u32::MAX));
        self.names.push(name.to_owned());
        self.lookup.insert(name.to_owned(), id);
        id
    }

    fn into_names(self) -> Vec<String> {
        self.names
    }

    fn get(&self, id: NameId) -> &str {
        self.names.get(id.index()).map_or("", String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_reader_keeps_the_shapes_the_analyzer_reads() {
        let kept = crate::trace::ARGS_KEPT;
        assert!(kept.keeps_shapes(ACCUMULATE_GRAD));
        assert!(COLLATE_OPS.iter().all(|op| kept.keeps_shapes(op)));
        // the resident state reads the known layer ops and every view op's dims
        for op in [
            "aten::linear",
            "aten::conv2d",
            "aten::embedding",
            "aten::layer_norm",
            "aten::batch_norm",
            "aten::addmm",
            "aten::mul",
            "aten::einsum",
            "aten::cat",
            "c10d::allreduce_",
            "aten::lerp_",
            "aten::_foreach_mul_",
        ] {
            assert!(kept.keeps_shapes(op), "{op}");
        }
        assert!(resident::VIEW_OPS
            .iter()
            .all(|op| kept.keeps_shapes(op) && kept.keeps_concrete(op)));
    }

    #[test]
    fn batch_size_is_read_from_the_first_collate_op_of_the_loader() {
        let text = r#"{"traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "ts": 10.0, "dur": 50.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::cat", "ts": 5.0, "dur": 1.0, "args": {"Input Dims": [[[2], [2]], []]}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::stack", "ts": 20.0, "dur": 5.0, "args": {"Input Dims": [[[3, 8, 8], [3, 8, 8], [3, 8, 8]], []]}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::stack", "ts": 30.0, "dur": 5.0, "args": {"Input Dims": [[[1], [1], [1], [1]], []]}},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 1, "args": {"Addr": 1, "Bytes": 8}}
        ]}"#;
        let trace = crate::trace::parse(text.as_bytes()).unwrap().value;
        assert_eq!(loader_batch_size(&trace), Some(3));
        // No loader span, or no tensor list inside it: unknown.
        let mut no_loader = trace.clone();
        no_loader.annotations.clear();
        assert_eq!(loader_batch_size(&no_loader), None);
        let mut no_list = trace;
        for op in &mut no_list.ops {
            op.tensor_list_len = None;
        }
        assert_eq!(loader_batch_size(&no_list), None);
    }
}
