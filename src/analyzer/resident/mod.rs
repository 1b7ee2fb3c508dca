//! The model's resident state, from the trace's own evidence: every
//! parameter (with or without a gradient), the buffers, activations made
//! before the trace, optimizer state made before it, DistributedDataParallel's
//! gradient buckets, and the kind of run.
//!
//! **The rule.** A tensor that ops read but that was never allocated inside
//! the trace existed before it — a parameter, a buffer, an earlier batch or a
//! KV cache (read by the forward), optimizer state (read by its step), a
//! communication bucket (read by the reducer's all-reduce) — and is resident
//! from the start. The trace has no tensor identity (no address in `Input
//! Dims`), so "never allocated inside the trace" and "the same tensor" are
//! decided from what it does record (trace-format.md §4, §6, §7):
//!
//! 1. *Reads.* Every top-level op of the forward pass (no enclosing op; inside
//!    an `nn.Module` frame, or — without `with_stack` — outside data loading,
//!    `zero_grad`, backward and the optimizer step) is examined, each tensor
//!    argument by its storage extent: `1 + Σ (dim − 1) × stride` elements times
//!    the dtype's size.
//! 2. *Never allocated inside the trace.* A weight argument of a known op
//!    (the weight and bias of `linear`, `conv*`; `embedding` tables; the
//!    affine parameters of `layer_norm`, `group_norm`, `rms_norm`,
//!    `batch_norm` and its running statistics; Hugging Face `Conv1D`'s
//!    `addmm(bias, x, weight)`) is, unless a block of its size was allocated
//!    in the same module call (a weight computed in the forward: weight norm,
//!    a merged adapter). Any other argument is, unless a live block of exactly
//!    its extent could hold it: live blocks are the trace's allocations before
//!    the op and not yet freed, gradients and optimizer state excepted (never
//!    forward inputs); each block is *bound* to the dims and dtype of the
//!    first tensor read from it (a fresh output is read from the latest
//!    block), so a block holding a `[8, 64, 1]` variance cannot also explain a
//!    `[512]` norm weight of the same byte size; the loader's batch blocks are
//!    bound beforehand to the shape the collate function stacked.
//! 3. *Views.* The outputs of view ops (`t`, `transpose`, `permute`, `view`
//!    and `reshape` without a copy, `slice`, `select`, `unbind`, `split`,
//!    `expand`, `unsqueeze`, `movedim`, ...; [`views`]) are computed from
//!    their input's dims, strides and `Concrete Inputs` (ATen's
//!    `computeStride` for views of strided tensors). A later read of such an
//!    output is its input again: a transposed weight is not a second weight,
//!    a slice of an activation is not state.
//! 4. *Consensus.* A module class runs the same code in every call: a read
//!    place (class, op, its n-th call of that op in the module call,
//!    argument, dims, dtype) that is pre-trace in one call is pre-trace in
//!    all, so a block that happens to have a weight's size in some calls
//!    does not hide it.
//! 5. *Each tensor once.* Per module instance (`nn.Module: Class_k`: `k`
//!    numbers the instances of a class, and an instance called twice — a
//!    shared ReLU, T5's shared embedding — keeps its `k`), the multiset of
//!    state reads of its largest call, summed over instances; a read belongs
//!    to the innermost module frame only. The `DistributedDataParallel`
//!    wrapper's own reads (its buffer broadcast) are not state.
//! 6. *What each is.* A known op's weight argument is a parameter, its
//!    running statistics buffers; an integer tensor, or one read through a
//!    positional view (`slice`, `select`, `expand`, ...), is a buffer (a
//!    guess: position ids, rotary caches); the data input of a known op (the
//!    `x` of a `linear`), or a tensor read only by the first iteration and
//!    next to an in-trace tensor of the same rank and leading size (a KV
//!    cache concatenated with the new keys), is an activation made before
//!    the trace, resident until its last read; anything else a parameter.
//!    A read whose size matches a persistent block allocated outside the
//!    forward (a model built inside the profiled region) is that block: the
//!    parameter is counted once, through it.
//! 7. *Ties* ([`ties`]): a trace cannot tell a tied weight from two equal
//!    ones. The word embedding (the largest table an `embedding` op reads)
//!    and other reads of its exact signature (encoder and decoder tables, the
//!    output Linear) are one tensor when training shows one gradient for them
//!    (exact); in a Hugging Face model, the tables are one (HF shares them)
//!    and the output layer is tied when the model type ties by default (a
//!    guess from the library's defaults); without module frames they count
//!    once (a guess); otherwise separately.
//! 8. *Trainable.* `AccumulateGrad` runs once per trainable parameter in each
//!    backward pass: its shapes (the first pass's; exact, less the leaves of
//!    the forward whose gradient dies before the optimizer step,
//!    `analyzer::leaves`) are the trainable parameters, never fewer of a
//!    signature than it shows; the rest of the parameters are frozen. Without `record_shapes` the trainable sizes are
//!    the gradient blocks themselves (the blocks a backward pass allocates
//!    that outlive it, one per `AccumulateGrad`); frozen ones cannot be
//!    recovered then.
//!
//! **Limits.** A parameter or buffer the forward never reads (an unused
//! head, Llama's `original_inv_freq`, BatchNorm's `num_batches_tracked` in
//! eval mode), storage read through custom ops (quantized weights), weights
//! read by generic ops outside any module frame, and ties outside the
//! conventions above are not found; the parameter override is the way out.
//! Everything is a function of the trace alone, in time order, so the same
//! trace always gives the same state.

mod bindings;
mod buckets;
mod findings;
mod lists;
mod optimizer;
mod reads;
mod ties;
mod views;

/// The view ops whose concrete values the trace reader keeps (owned by the
/// reader, which decides what it keeps; the resident state follows their
/// outputs back to their inputs).
pub use crate::trace::VIEW_OPS;

/// DDP's bucket layout (a first bucket, then `bucket_cap_mb` ones), used
/// where buckets are placed by size: the orchestrator and the what-if.
pub use buckets::{bucket_sizes, BUCKET_BYTES, FIRST_BUCKET_BYTES};

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::lifecycle::Life;
use super::phases::{backward_passes, locate, OPT_STEP_PREFIX};
use super::spans::SpanIndex;
use super::{BlockRole, Iteration, Names, OptimizerFacts, Parameter, Phase};
use crate::diag::Warning;
use crate::trace::{NameId, Trace};
use crate::units::{Bytes, Nanos};
use reads::{pre_trace_reads, Arg, Blk, BlockUse, Call, Dtype, Op, ReadKind};
use ties::resolve_word_embeddings;
use views::{Concrete, Layout};

/// What the profiled run does, from the trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// Backward passes train every parameter found.
    Training,
    /// Backward passes train some parameters; others are frozen (LoRA,
    /// a frozen backbone).
    FineTuning,
    /// Forward with autograd on (the ops record autograd sequence numbers)
    /// but no backward: the graph's saved tensors live until the loss goes.
    ForwardWithAutograd,
    /// Forward under `torch.no_grad()` or `torch.inference_mode()`.
    #[default]
    Inference,
}

impl RunKind {
    /// A short lowercase label.
    pub fn label(self) -> &'static str {
        match self {
            RunKind::Training => "training",
            RunKind::FineTuning => "fine_tuning",
            RunKind::ForwardWithAutograd => "forward_with_autograd",
            RunKind::Inference => "inference",
        }
    }

    /// Whether the run makes gradients and optimizer state.
    pub fn trains(self) -> bool {
        matches!(self, RunKind::Training | RunKind::FineTuning)
    }
}

/// What a resident tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    Parameter,
    Buffer,
    /// Made before the trace but of the data: an earlier batch, a KV cache.
    Activation,
    /// Made before the trace by the optimizer (its constructor, or steps the
    /// profiler's schedule did not record).
    OptimizerState,
    /// DistributedDataParallel's gradient buckets.
    Bucket,
    /// A quantized weight's quantisation state (bitsandbytes' blockwise
    /// absmax, its nested absmax and code, the offset; LLM.int8()'s `SCB`),
    /// resident with the model.
    QuantState,
}

/// How a resident tensor was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum StateSource {
    /// An argument of a forward op (`known_op`: a weight argument of a
    /// known layer op, rather than a generic read).
    OpArgument {
        op: String,
        argument: u16,
        known_op: bool,
    },
    /// An `AccumulateGrad` shape with no forward read found for it.
    AccumulateGrad,
    /// The gradient block of a parameter (a trace without shapes).
    GradientBlock,
    /// The optimizer's class and the trainable parameters.
    OptimizerClass,
    /// A tensor the reducer's collective reads in backward.
    Collective,
    /// The trainable bytes (a DDP trace whose buckets show no sizes).
    TrainableBytes,
    /// A 4-bit weight's 16-value code table (its `QuantState.code`), which
    /// no kernel is handed: one per 4-bit layer whose state was read.
    FourBitCodeTable,
}

/// One tensor resident from the start of the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateItem {
    pub kind: StateKind,
    /// A parameter that gets a gradient.
    pub trainable: bool,
    pub bytes: Bytes,
    /// Its dims (empty when unknown).
    pub shape: Vec<i64>,
    pub dtype: Option<String>,
    /// The module path that reads it.
    pub layer: Option<NameId>,
    pub source: StateSource,
    /// The first and last read (activations made before the trace are freed
    /// after their last read; pre-trace buckets when the reducer rebuilds its
    /// own inside the trace).
    pub first_read: Option<Nanos>,
    pub last_read: Option<Nanos>,
    /// A block of the trace holds it (a model built inside the profiled
    /// region): it is not added again.
    pub block: Option<usize>,
}

/// Totals over the resident state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateTotals {
    pub n_parameters: usize,
    pub parameters: Bytes,
    pub n_trainable: usize,
    pub trainable: Bytes,
    pub frozen: Bytes,
    pub buffers: Bytes,
    pub activations_before_trace: Bytes,
    pub optimizer_state_before_trace: Bytes,
    pub buckets: Bytes,
    /// Parameters stored as integers: quantized weights (bitsandbytes'
    /// int8 `Int8Params`, packed 4-bit `Params4bit`), included in
    /// `parameters` and `frozen`.
    #[serde(default)]
    pub quantized: Bytes,
    /// The quantized weights' quantisation state ([`StateKind::QuantState`]).
    #[serde(default)]
    pub quant_state: Bytes,
}

/// A tie decision: several reads of one signature counted as one tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TieFinding {
    pub shape: Vec<i64>,
    pub bytes_each: Bytes,
    pub reads: u32,
    pub kept: u32,
    /// Decided by gradients (exact) rather than a convention (a guess).
    pub exact: bool,
    pub why: String,
}

/// The model's resident state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelState {
    pub run_kind: RunKind,
    /// Every resident tensor, parameters first in forward order.
    pub items: Vec<StateItem>,
    pub totals: StateTotals,
    pub tie: Option<TieFinding>,
    /// The trace has shapes (`record_shapes=True`).
    pub has_shapes: bool,
    /// The trace records ops but not their shapes (`record_shapes=False`):
    /// parameters that get no gradient cannot be found.
    #[serde(default)]
    pub shapes_missing: bool,
    /// The trace has `nn.Module` frames (`with_stack=True`).
    pub has_module_frames: bool,
    /// A DistributedDataParallel run (its module frame or `c10d::` collectives).
    pub distributed: bool,
    /// The Hugging Face model type, from its `transformers/models/<type>/` frames.
    pub hf_model_type: Option<String>,
}

impl ModelState {
    /// The items of one kind.
    pub fn of(&self, kind: StateKind) -> impl Iterator<Item = &StateItem> {
        self.items.iter().filter(move |i| i.kind == kind)
    }
}

/// Bytes per element and whether floating, of a dtype name as
/// `record_shapes` writes it.
fn dtype_info(dtype: &str) -> Option<(u64, bool)> {
    let size = crate::trace::dtype_size(dtype)?;
    let floating = dtype.contains("float")
        || dtype.contains("double")
        || dtype.contains("Half")
        || dtype.contains("BFloat16")
        || dtype.contains("complex")
        || dtype.contains("Float8");
    Some((size, floating))
}

const MODULE_PREFIX: &str = "nn.Module: ";
/// Factories: they take no tensor, so record no tensor shapes even with
/// `record_shapes` on.
const NO_TENSOR_INPUTS: &[&str] = &[
    "aten::empty",
    "aten::empty_strided",
    "aten::zeros",
    "aten::ones",
    "aten::full",
    "aten::arange",
    "aten::rand",
    "aten::randn",
    "aten::randint",
    "aten::scalar_tensor",
];
const WRAPPERS: &[&str] = &["DistributedDataParallel", "DataParallel"];
const HF_FRAME_PREFIX: &str = "transformers/models/";

/// Everything [`find`] reads from the analysis.
pub(crate) struct Inputs<'a> {
    pub trace: &'a Trace,
    pub index: &'a SpanIndex,
    pub iterations: &'a [Iteration],
    pub names: &'a Names,
    pub parameters: &'a [Parameter],
    pub optimizer: &'a OptimizerFacts,
    /// Per op span: run inside bitsandbytes' CPU re-layout of a 4-bit
    /// weight (empty when the trace has none).
    pub cpu_packing: &'a [bool],
}

/// Finds the resident state (see the module docs) and marks the blocks that
/// hold some of it (a model built in the trace, DDP's rebuilt buckets).
pub(crate) fn find(input: &Inputs<'_>, life: &mut Life, warnings: &mut Vec<Warning>) -> ModelState {
    let trace = input.trace;
    let names = input.names;
    let passes = backward_passes(input.index, names);
    let in_pass = |t: Nanos| {
        let n = passes.partition_point(|&(s, _)| s <= t);
        n.checked_sub(1)
            .and_then(|i| passes.get(i))
            .is_some_and(|&(_, e)| t <= e)
    };
    let has_module_frames = input
        .index
        .frames
        .spans
        .iter()
        .any(|f| names.get(f.name).starts_with(MODULE_PREFIX));
    let has_shapes =
        trace.header.record_shapes.unwrap_or(true) && trace.ops.iter().any(|o| o.tensors.len > 0);
    // Without the header's flag: ops that take tensors (not factories) ran,
    // and none recorded any shape.
    let shapes_missing = match trace.header.record_shapes {
        Some(recorded) => !recorded,
        None => {
            trace
                .ops
                .iter()
                .any(|o| !NO_TENSOR_INPUTS.contains(&trace.name(o.name)))
                && !trace.ops.iter().any(|o| o.tensors.len > 0)
        }
    };
    let hf_model_type = hf_model_type(input);

    // The engine's view of the trace: forward ops, module calls, blocks.
    let mut dtypes: FxHashMap<NameId, Option<(u64, bool)>> = FxHashMap::default();
    let mut dtype_of = |id: NameId| {
        *dtypes
            .entry(id)
            .or_insert_with(|| dtype_info(trace.name(id)))
    };
    let mut calls: Vec<Call> = Vec::new();
    let mut call_layer: Vec<Option<NameId>> = Vec::new();
    let mut call_of_frame: FxHashMap<usize, usize> = FxHashMap::default();
    let mut strings: FxHashMap<String, u32> = FxHashMap::default();
    let mut string_id = |s: &str| {
        let n = u32::try_from(strings.len()).unwrap_or(u32::MAX);
        *strings.entry(s.to_owned()).or_insert(n)
    };
    let mut ops: Vec<Op> = Vec::new();
    let mut floating_votes: BTreeMap<NameId, usize> = BTreeMap::new();
    let mut any_forward_sequence = false;
    for (idx, span) in input.index.ops.spans.iter().enumerate() {
        // Nested ops are read for one thing only: a quantized layer's
        // quantisation state, which bitsandbytes hands to its kernels
        // inside the layer's autograd Function.
        let nested = span.parent.is_some();
        let quant_args = crate::trace::quant_state_args(names.get(span.name));
        if (nested && quant_args.is_empty()) || span.backward || in_pass(span.start) {
            continue;
        }
        // The CPU re-layout of a 4-bit weight reads the old layout to make
        // the new one; only its reads of quantisation state are the model's.
        if quant_args.is_empty() && input.cpu_packing.get(idx) == Some(&true) {
            continue;
        }
        let (iteration, phase) = locate(input.iterations, span.start);
        if matches!(
            phase,
            Phase::DataLoading | Phase::ZeroGrad | Phase::OptimizerStep | Phase::Backward
        ) {
            continue;
        }
        let frame = module_frame(input, span.tid, span.start);
        if has_module_frames && frame.is_none() {
            continue;
        }
        if reads::is_bookkeeping(names.get(span.name)) {
            continue;
        }
        let Some(source) = input.index.ops.source_in(idx, &trace.ops) else {
            continue;
        };
        // A Python autograd Function (`MatMul8bitLt`, named without a
        // `::` namespace) is recorded with the next sequence number
        // whatever the grad mode (`THPFunction_apply` peeks it): only an
        // ATen op's number shows that autograd records the forward.
        any_forward_sequence |=
            !nested && source.sequence_number.is_some() && names.get(span.name).contains("::");
        let call = frame.map(|f| {
            *call_of_frame.entry(f).or_insert_with(|| {
                let frame = input.index.frames.spans.get(f);
                let full = frame.map_or("", |fr| names.get(fr.name));
                let instance = full.strip_prefix(MODULE_PREFIX).unwrap_or(full);
                let class = instance.rsplit_once('_').map_or(instance, |(c, _)| c);
                calls.push(Call {
                    instance: string_id(instance),
                    class: string_id(class),
                    start: frame.map_or(0, |fr| fr.start.0),
                    wrapper: WRAPPERS.contains(&class),
                    conv1d: class == "Conv1D",
                });
                call_layer.push(frame.and_then(|fr| fr.layer));
                calls.len() - 1
            })
        });
        let numbers = &trace.op_args;
        let mut args = Vec::new();
        for a in trace.tensor_args(source) {
            let dtype = a.dtype.and_then(|id| {
                let (size, floating) = dtype_of(id)?;
                if floating {
                    *floating_votes.entry(id).or_default() += 1;
                }
                Some(Dtype {
                    size,
                    name: id.0,
                    floating,
                })
            });
            if a.dtype.is_some() && dtype.is_none() {
                continue; // a dtype of unknown size
            }
            if (nested && !quant_args.contains(&a.position))
                || super::quantized::cpu_layout_args(names.get(span.name)).contains(&a.position)
            {
                continue;
            }
            args.push(Arg {
                pos: a.position,
                list: a.list_index,
                dtype,
                layout: Layout {
                    dims: numbers.slice(a.dims).to_vec(),
                    strides: a
                        .strides
                        .map(|s| numbers.slice(s).to_vec())
                        .unwrap_or_default(),
                },
            });
        }
        if args.is_empty() {
            continue;
        }
        lists::list_dtypes_from_children(input, idx, &mut args, &mut dtype_of);
        let concrete = Concrete::of_op(numbers, trace.concrete_args(source));
        ops.push(Op {
            name: names.get(span.name).to_owned(),
            start: span.start.0,
            call,
            // Its forward pass, numbered below.
            iteration: iteration.unwrap_or(usize::MAX),
            pass: passes.partition_point(|&(s, _)| s <= span.start),
            args,
            concrete,
            copied: copies(input, idx),
        });
    }
    ops.sort_by_key(|o| o.start);
    // The unit of "each tensor once" is a forward pass: an iteration with
    // gradient accumulation runs one per micro-batch (the backward passes
    // before an op tell which), and each reads every weight again.
    let mut last: Option<(usize, usize)> = None;
    let mut unit = 0_usize;
    for op in &mut ops {
        let key = (op.iteration, op.pass);
        if last.is_some_and(|l| l != key) {
            unit += 1;
        }
        last = Some(key);
        op.iteration = unit;
    }
    let default_dtype = floating_votes
        .iter()
        .max_by_key(|&(id, n)| (*n, std::cmp::Reverse(*id)))
        .map(|(id, _)| *id);
    let default_elem = default_dtype
        .and_then(|id| dtype_info(trace.name(id)))
        .map_or(4, |d| d.0);
    let blocks = engine_blocks(input, life, has_module_frames, &in_pass);
    let mut found = pre_trace_reads(
        &ops,
        &calls,
        &blocks,
        default_elem,
        default_dtype.map(|d| d.0),
    );

    // Ties, then the trainable split against AccumulateGrad.
    let dtype_ids: FxHashMap<&str, u32> = trace
        .names
        .iter()
        .enumerate()
        .filter(|(_, n)| dtype_info(n).is_some())
        .filter_map(|(i, n)| Some((n.as_str(), u32::try_from(i).ok()?)))
        .collect();
    let grad_key = |p: &Parameter| {
        (
            p.shape.clone(),
            p.dtype
                .as_deref()
                .and_then(|d| dtype_ids.get(d).copied())
                .or(default_dtype.map(|d| d.0)),
        )
    };
    let mut grads: BTreeMap<(Vec<i64>, Option<u32>), u32> = BTreeMap::new();
    for p in input.parameters.iter().filter(|p| !p.sized_by_gradient) {
        *grads.entry(grad_key(p)).or_default() += 1;
    }
    let tie = resolve_word_embeddings(
        &mut found,
        &grads,
        hf_model_type.as_deref(),
        has_module_frames,
    );

    let mut items: Vec<StateItem> = Vec::new();
    let dtype_name = |id: Option<u32>| id.map(|i| trace.name(NameId(i)).to_owned());
    let mut unmatched: Vec<&Parameter> = Vec::new();
    let mut taken = vec![false; found.len()];
    for p in input.parameters {
        if p.sized_by_gradient {
            unmatched.push(p);
            continue;
        }
        let key = grad_key(p);
        let hit = found.iter().enumerate().position(|(i, f)| {
            !taken.get(i).copied().unwrap_or(true)
                && f.kind == ReadKind::Parameter
                && f.dims == key.0
                && f.dtype == key.1
        });
        match hit {
            Some(i) => {
                if let Some(t) = taken.get_mut(i) {
                    *t = true;
                }
            }
            None => unmatched.push(p),
        }
    }
    // Forward reads, in forward order; the trainable ones are those matched.
    let mut order: Vec<usize> = (0..found.len()).collect();
    order.sort_by_key(|&i| found.get(i).map(|f| (f.first_read, f.kind)));
    for i in order {
        let Some(f) = found.get(i) else { continue };
        let kind = match f.kind {
            ReadKind::Parameter => StateKind::Parameter,
            ReadKind::Buffer => StateKind::Buffer,
            ReadKind::Activation => StateKind::Activation,
            ReadKind::QuantState => StateKind::QuantState,
        };
        let layer = f.instance.and_then(|inst| {
            calls
                .iter()
                .position(|c| c.instance == inst)
                .and_then(|c| call_layer.get(c).copied().flatten())
        });
        let block = f.block.and_then(|b| blocks.get(b)).and_then(|b| b.source);
        if let Some(b) = block.and_then(|b| life.blocks.get_mut(b)) {
            b.role = match kind {
                StateKind::Buffer => BlockRole::Buffer,
                _ => BlockRole::Parameter,
            };
        }
        items.push(StateItem {
            kind,
            trainable: taken.get(i).copied().unwrap_or(false),
            bytes: Bytes(f.bytes),
            shape: f.dims.clone(),
            dtype: dtype_name(f.dtype),
            layer,
            source: StateSource::OpArgument {
                op: f.op.clone(),
                argument: f.arg,
                known_op: f.known_role,
            },
            first_read: Some(Nanos(f.first_read)),
            last_read: Some(Nanos(f.last_read)),
            block,
        });
    }
    items.extend(findings::four_bit_code_tables(&items));
    for p in unmatched {
        items.push(StateItem {
            kind: StateKind::Parameter,
            trainable: true,
            bytes: p.bytes,
            shape: p.shape.clone(),
            dtype: p.dtype.clone(),
            layer: p.layer,
            source: if p.sized_by_gradient {
                StateSource::GradientBlock
            } else {
                StateSource::AccumulateGrad
            },
            first_read: None,
            last_read: None,
            block: None,
        });
    }

    if !passes.is_empty() {
        untrained_generic_reads_are_buffers(&mut items);
    }
    let distributed = buckets::is_distributed(input);
    items.extend(optimizer::state_before_trace(input, warnings));
    items.extend(buckets::buckets(
        input,
        life,
        distributed,
        &passes,
        warnings,
    ));

    let run_kind = findings::run_kind(!passes.is_empty(), any_forward_sequence, &items);
    let mut state = ModelState {
        run_kind,
        items,
        totals: StateTotals::default(),
        tie: tie.map(|t| findings::tie_finding(&t, hf_model_type.as_deref())),
        has_shapes,
        shapes_missing,
        has_module_frames,
        distributed,
        hf_model_type,
    };
    state.totals = findings::totals(&state.items);
    findings::state_warnings(&state, warnings);
    state
}

/// In a training run where every weight of a known layer op gets a
/// gradient, a floating tensor without one that only generic ops read
/// (Llama's rotary `inv_freq`, a sinusoidal table) is a buffer: freezing is
/// done per layer, so a frozen parameter shows as a frozen layer weight. A
/// guess from how models freeze, not from the trace; with any frozen layer
/// weight (LoRA, a frozen backbone) nothing is reclassified.
fn untrained_generic_reads_are_buffers(items: &mut [StateItem]) {
    let known_op =
        |i: &StateItem| matches!(i.source, StateSource::OpArgument { known_op: true, .. });
    let any_frozen_layer_weight = items
        .iter()
        .any(|i| i.kind == StateKind::Parameter && !i.trainable && known_op(i));
    if any_frozen_layer_weight {
        return;
    }
    for i in items.iter_mut() {
        if i.kind == StateKind::Parameter && !i.trainable && i.block.is_none() && !known_op(i) {
            i.kind = StateKind::Buffer;
        }
    }
}

/// The innermost `nn.Module` frame at `t` on thread `tid`.
fn module_frame(input: &Inputs<'_>, tid: i64, t: Nanos) -> Option<usize> {
    let frames = &input.index.frames;
    let innermost = frames.innermost(tid, t)?;
    frames.chain(innermost).find(|&f| {
        frames
            .spans
            .get(f)
            .is_some_and(|fr| input.names.get(fr.name).starts_with(MODULE_PREFIX))
    })
}

/// Whether a conditionally viewing op (`to`, `reshape`, `contiguous`) made a
/// copy: one of its descendants allocates or copies.
fn copies(input: &Inputs<'_>, op: usize) -> bool {
    const COPYING: &[&str] = &[
        "aten::_to_copy",
        "aten::clone",
        "aten::copy_",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::_unsafe_view",
    ];
    let ops = &input.index.ops.spans;
    let Some(me) = ops.get(op) else { return false };
    ops.iter()
        .skip(op + 1)
        .take_while(|o| o.tid == me.tid && o.start <= me.end)
        .any(|o| o.end <= me.end && COPYING.contains(&input.names.get(o.name)))
}

/// The blocks as the engine sees them: gradients and optimizer state are
/// never forward inputs; a persistent block made outside the forward may be
/// a model built in the trace; some blocks are bound to a shape from their
/// allocation ([`bindings`]).
fn engine_blocks(
    input: &Inputs<'_>,
    life: &Life,
    has_module_frames: bool,
    in_pass: &dyn Fn(Nanos) -> bool,
) -> Vec<Blk> {
    life.blocks
        .iter()
        .map(|b| {
            let ignored = matches!(
                b.role,
                BlockRole::Gradient { .. } | BlockRole::OptimizerState | BlockRole::CpuRepack
            ) || matches!(b.alloc_phase, Phase::Backward | Phase::OptimizerStep)
                || in_pass(b.alloc_ts);
            let construction = has_module_frames
                && b.free_ts.is_none()
                && b.role == BlockRole::Other
                && b.layer.is_none()
                && matches!(b.alloc_phase, Phase::Other | Phase::Setup);
            Blk {
                alloc: b.alloc_ts.0,
                free: b.free_ts.map(|f| f.0),
                size: b.size.get(),
                usage: if ignored {
                    BlockUse::Ignored
                } else if construction {
                    BlockUse::Construction
                } else {
                    BlockUse::Live
                },
                bound_dims: bindings::bound_dims(input, b.role, b.alloc_op),
                source: Some(b.id),
            }
        })
        .collect()
}

/// The Hugging Face model type (`gpt2`, `llama`, ...) of the most frequent
/// `transformers/models/<type>/modeling_*.py` frames.
fn hf_model_type(input: &Inputs<'_>) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &input.index.frames.spans {
        let name = input.names.get(f.name);
        if let Some(rest) = name.strip_prefix(HF_FRAME_PREFIX) {
            if let Some((model_type, _)) = rest.split_once('/') {
                *counts.entry(model_type).or_default() += 1;
            }
        }
    }
    counts
        .into_iter()
        .max_by_key(|&(t, n)| (n, std::cmp::Reverse(t)))
        .map(|(t, _)| t.to_owned())
}

#[cfg(test)]
mod tests;
