//! Attribution of blocks to ops, layers and phases, and the evidence the
//! orchestrator needs: parameters, gradient / optimizer-state / batch blocks,
//! zero_grad and optimizer facts.

use std::collections::{BTreeMap, BTreeSet};

use super::leaves;
use super::lifecycle::Life;
use super::phases::{locate, OPT_STEP_PREFIX};
use super::spans::SpanIndex;
use super::{
    Analysis, AnalyzerConfig, BlockRole, DeviceSummary, Iteration, LayerAtPeak, Names,
    OptimizerFacts, Parameter, ParameterTotals, Phase, TracePeak, ZeroGradFacts,
};
use crate::diag::Warning;
use crate::trace::{Device, NameId, Trace};
use crate::units::{Bytes, Nanos};

use super::ACCUMULATE_GRAD;
const FOREACH_PREFIX: &str = "aten::_foreach_";

/// The optimizers `torch.optim` defines (PyTorch 2.x).
const TORCH_OPTIM_CLASSES: &[&str] = &[
    "SGD",
    "Adam",
    "AdamW",
    "Adagrad",
    "Adadelta",
    "Adamax",
    "ASGD",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "LBFGS",
    "SparseAdam",
    "Adafactor",
];

/// Fills the op, layer, iteration, phase and internal-ness of every block.
pub(crate) fn attribute(
    life: &mut Life,
    index: &SpanIndex,
    iterations: &[Iteration],
    config: &AnalyzerConfig,
    names: &Names,
) {
    for event in &mut life.events {
        let (iteration, phase) = locate(iterations, event.ts);
        event.iteration = iteration;
        event.phase = phase;
    }
    let ops = &index.ops;
    for block in &mut life.blocks {
        let Some(alloc) = life.events.get(block.alloc_event) else {
            continue;
        };
        block.alloc_iteration = alloc.iteration;
        block.alloc_phase = alloc.phase;
        block.alloc_op = ops.innermost(alloc.tid, block.alloc_ts);
        let alloc_op = block.alloc_op.and_then(|i| ops.spans.get(i));
        block.alloc_op_name = alloc_op.map(|o| o.name);
        block.layer = match alloc_op {
            Some(op) => op.layer,
            None => index
                .frames
                .innermost(alloc.tid, block.alloc_ts)
                .and_then(|f| index.frames.spans.get(f))
                .and_then(|f| f.layer),
        };
        let free = block.free_event.and_then(|i| life.events.get(i));
        if let (Some(free), Some(free_ts)) = (free, block.free_ts) {
            block.free_iteration = free.iteration;
            block.free_phase = Some(free.phase);
            block.free_op = ops.innermost(free.tid, free_ts);
            block.free_op_name = block.free_op.and_then(|i| ops.spans.get(i)).map(|o| o.name);
            if free.tid == alloc.tid {
                block.internal_to = block.alloc_op.and_then(|a| {
                    ops.chain(a)
                        .find(|&i| ops.spans.get(i).is_some_and(|o| o.end >= free_ts))
                });
            }
        }
        block.op_internal = block.internal_to.is_some();
        if let (Some(from), Some(to)) = (block.alloc_op, block.internal_to) {
            // A CPU-only op (oneDNN) anywhere from the allocating op up to
            // the one the block is internal to, or the kernel's own scratch.
            let cpu_only_op = ops.chain(from).position(|i| i == to).is_some_and(|n_up| {
                ops.chain(from)
                    .take(n_up + 1)
                    .any(|i| is_scratch(ops.spans.get(i).map_or("", |o| names.get(o.name)), config))
            });
            block.cpu_scratch = cpu_only_op || kernel_scratch(ops, names, from, to);
        }
    }
}

/// Whether `t` lies in one of `spans` (sorted by start, not overlapping).
pub(super) fn in_sorted_spans(spans: &[(Nanos, Nanos)], t: Nanos) -> bool {
    let n_started = spans.partition_point(|&(start, _)| start <= t);
    n_started
        .checked_sub(1)
        .and_then(|i| spans.get(i))
        .is_some_and(|&(_, end)| t <= end)
}

/// The ops that only make a tensor (the kernel fills it): what a kernel
/// calls for its own buffers (`at::empty(...)` inside an ATen kernel goes
/// through the dispatcher and is recorded as a child op).
const FACTORY_OPS: &[&str] = &[
    "aten::empty",
    "aten::empty_like",
    "aten::empty_strided",
    "aten::new_empty",
    "aten::new_empty_strided",
    "aten::zeros",
    "aten::zeros_like",
    "aten::new_zeros",
    "aten::ones",
    "aten::ones_like",
    "aten::full",
    "aten::full_like",
    "aten::new_full",
];

/// A CPU kernel's private scratch (issue 32): a block that one op `to`
/// allocates — itself, or through a factory call of its own (`at::empty`
/// inside the kernel) — and frees before it returns. It is neither an output
/// (it does not outlive the op) nor a saved tensor, and the CUDA kernel of
/// the same op allocates its own scratch, or none (the oneDNN reorders of a
/// CPU convolution, the per-thread buffers of the CPU flash-attention
/// kernel, a CPU reduction's per-thread partial sums, a bf16 GEMM's packing
/// buffers). A block a composite op's computing child makes and the
/// composite frees (a `log_softmax` output inside `cross_entropy_loss`
/// without grad) is no scratch: the CUDA run makes it too.
fn kernel_scratch(
    ops: &super::spans::Forest<super::OpSpan>,
    names: &Names,
    from: usize,
    to: usize,
) -> bool {
    // Up through the factory calls (`empty_like` calls `empty_strided`).
    let first_not_factory = ops.chain(from).find(|&i| {
        ops.spans
            .get(i)
            .is_none_or(|o| !FACTORY_OPS.contains(&names.get(o.name)))
    });
    first_not_factory == Some(to)
}

fn is_scratch(name: &str, config: &AnalyzerConfig) -> bool {
    config
        .cpu_scratch_op_prefixes
        .iter()
        .any(|p| name.starts_with(p.as_str()))
}

/// What [`evidence`] found.
#[derive(Debug)]
pub(crate) struct Evidence {
    parameters: Vec<Parameter>,
    pub(super) zero_grad: ZeroGradFacts,
    optimizer: OptimizerFacts,
}

impl Evidence {
    /// The trainable parameters, from `AccumulateGrad`.
    pub(crate) fn parameters(&self) -> &[Parameter] {
        &self.parameters
    }

    /// What the optimizer does.
    pub(crate) fn optimizer(&self) -> &OptimizerFacts {
        &self.optimizer
    }
}

/// One `AccumulateGrad` call with its parameter's size.
struct AccCall {
    op: usize,
    iteration: usize,
    /// The backward pass (micro-batch) of the iteration it ran in: its
    /// position among the iteration's backward spans.
    pass: usize,
    /// The end of that backward pass (the call's own end without one).
    pass_end: Nanos,
    /// `None` without `record_shapes`: the size then comes from the
    /// gradient block it keeps.
    shape: Option<Vec<i64>>,
    numel: u64,
    dtype: Option<String>,
    bytes: u64,
}

/// Finds the evidence the orchestrator needs in the paired blocks and the
/// span index: the parameters (from the first iteration's `AccumulateGrad`
/// shapes and dtypes, in reverse call order = module order, less the leaves
/// whose gradient dies before the step, [`leaves`]), the gradient
/// blocks they produce, the optimizer and its state blocks, `zero_grad`
/// placement and `set_to_none`, and the batch blocks of the data loader;
/// each block gets its role. Long because each finding uses the ones before
/// (gradients need parameters, state needs the step spans).
pub(crate) fn evidence(
    trace: &Trace,
    life: &mut Life,
    index: &SpanIndex,
    iterations: &[Iteration],
    names: &Names,
    warnings: &mut Vec<Warning>,
) -> Evidence {
    let ops = &index.ops;

    // AccumulateGrad calls, in time order, with their iteration and pass.
    let mut n_unknown_dtype = 0_usize;
    let mut calls: Vec<AccCall> = Vec::new();
    for (idx, op) in ops.spans.iter().enumerate() {
        if names.get(op.name) != ACCUMULATE_GRAD {
            continue;
        }
        let Some(iteration) = locate(iterations, op.start).0 else {
            continue;
        };
        let (pass, pass_end) = iterations
            .get(iteration)
            .and_then(|it| {
                it.phases
                    .iter()
                    .filter(|p| p.phase == Phase::Backward)
                    .enumerate()
                    .find(|(_, p)| p.start <= op.start && op.start <= p.end)
                    .map(|(k, p)| (k, p.end.max(op.end)))
            })
            .unwrap_or((0, op.end));
        let Some(source) = ops.source_in(idx, &trace.ops) else {
            continue;
        };
        let first = trace
            .tensor_args(source)
            .iter()
            .find(|a| a.position == 0 && a.list_index.is_none());
        let shape = first.map(|a| trace.numbers(a.dims).to_vec());
        let numel = shape.as_deref().map_or(0, |shape| {
            shape
                .iter()
                .try_fold(1_u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
                .unwrap_or(0)
        });
        let dtype = first
            .and_then(|a| a.dtype)
            .map(|t| trace.name(t).to_owned());
        let elem = match dtype.as_deref().and_then(crate::trace::dtype_size) {
            Some(size) => size,
            None => {
                if shape.is_some() {
                    n_unknown_dtype += 1;
                }
                4
            }
        };
        calls.push(AccCall {
            op: idx,
            iteration,
            pass,
            pass_end,
            bytes: if shape.is_some() {
                numel.saturating_mul(elem)
            } else {
                0
            },
            shape,
            numel,
            dtype,
        });
    }
    calls.sort_by_key(|c| (ops.spans.get(c.op).map(|o| o.start), c.op));
    if n_unknown_dtype > 0 {
        warnings.push(Warning::new(
            "unknown_parameter_dtype",
            format!("{n_unknown_dtype} AccumulateGrad calls have an unknown dtype; 4 bytes per element were assumed"),
        ));
    }

    // Parameters: the reverse of the first backward pass's AccumulateGrad
    // order. A pass runs AccumulateGrad once per parameter that gets a
    // gradient; with gradient accumulation an optimizer step holds several
    // passes, and each parameter still counts once.
    let mut per_pass: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for (i, call) in calls.iter().enumerate() {
        per_pass
            .entry((call.iteration, call.pass))
            .or_default()
            .push(i);
    }
    let reference: Vec<usize> = per_pass.values().next().cloned().unwrap_or_default();
    let n_params = reference.len();
    if per_pass.values().any(|v| v.len() != n_params) {
        warnings.push(Warning::new(
            "parameter_count_differs",
            "backward passes ran AccumulateGrad a different number of times; parameters come from the first pass and later gradients are matched by position",
        ));
    }

    // Link each call to its gradient block: the latest earlier allocation of
    // exactly the parameter's bytes that is still live and not yet claimed.
    let mut by_size: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for block in &life.blocks {
        by_size.entry(block.size.get()).or_default().push(block.id);
    }
    let all_blocks: Vec<usize> = life.blocks.iter().map(|b| b.id).collect();
    let mut claimed = vec![false; life.blocks.len()];
    let mut param_layer: Vec<Option<NameId>> = vec![None; n_params];
    let mut grad_of_param: Vec<Option<usize>> = vec![None; n_params];
    let mut n_unlinked = 0_usize;
    let mut sized_from_block: Vec<Option<u64>> = vec![None; n_params];
    for calls_of_pass in per_pass.values() {
        for (k, &call_idx) in calls_of_pass.iter().enumerate() {
            let (Some(call), Some(param)) = (calls.get(call_idx), n_params.checked_sub(k + 1))
            else {
                continue;
            };
            let Some(op) = ops.spans.get(call.op) else {
                continue;
            };
            // Without shapes every block is a candidate: the gradient is then
            // the latest block of the pass that outlives it.
            let candidates = if call.shape.is_some() {
                by_size.get(&call.bytes).map_or(&[][..], Vec::as_slice)
            } else {
                &all_blocks[..]
            };
            // A gradient is made by the backward of the same iteration, before
            // or (when AccumulateGrad copies a non-contiguous gradient) inside
            // the call, and outlives that backward (it is freed by the next
            // zero_grad or never). Activation gradients can have the same size
            // (t5-small: 8x64x512 = 512x512), so prefer the latest block that
            // outlives backward; then the latest one still live when the call
            // starts (a buffer added into an existing `.grad`).
            // From the second micro-batch on, AccumulateGrad adds the new
            // gradient into the existing `.grad` in place and the new block
            // dies with this pass: a transient, not a gradient.
            let backward_end = call.pass_end;
            let n_until_end = candidates
                .partition_point(|&b| life.blocks.get(b).is_some_and(|b| b.alloc_ts <= op.end));
            let eligible = |b: &super::Block| {
                !claimed.get(b.id).copied().unwrap_or(true)
                    && b.alloc_iteration == Some(call.iteration)
                    && b.alloc_phase == Phase::Backward
            };
            // Only this iteration's blocks qualify: never scan earlier ones.
            let iteration_start = iterations
                .get(call.iteration)
                .map_or(Nanos::ZERO, |it| it.start);
            let n_before_iteration = candidates.partition_point(|&b| {
                life.blocks
                    .get(b)
                    .is_some_and(|b| b.alloc_ts < iteration_start)
            });
            let until_end = candidates
                .get(n_before_iteration..n_until_end)
                .unwrap_or_default();
            let pick = |keep: &dyn Fn(&super::Block) -> bool| {
                until_end.iter().rev().copied().find(|&b| {
                    life.blocks
                        .get(b)
                        .is_some_and(|block| eligible(block) && keep(block))
                })
            };
            let pass_end = backward_end;
            let found = if call.shape.is_some() {
                pick(&|b| b.free_ts.is_none_or(|f| f > backward_end)).or_else(|| {
                    pick(&|b| b.alloc_ts <= op.start && b.free_ts.is_none_or(|f| f >= op.start))
                })
            } else {
                // Sized by the block: only one that outlives its pass is a gradient.
                pick(&|b| b.free_ts.is_none_or(|f| f > pass_end))
            };
            let Some(block_id) = found else {
                // With zero_grad(set_to_none=False) the backward may add into
                // the existing `.grad` in place: no new block is expected.
                let has_live_grad = grad_of_param
                    .get(param)
                    .copied()
                    .flatten()
                    .and_then(|g| life.blocks.get(g))
                    .is_some_and(|g| g.free_ts.is_none_or(|f| f >= op.start));
                if !has_live_grad {
                    n_unlinked += 1;
                }
                continue;
            };
            if let Some(slot) = claimed.get_mut(block_id) {
                *slot = true;
            }
            let Some(block) = life.blocks.get_mut(block_id) else {
                continue;
            };
            if let Some(slot) = param_layer.get_mut(param) {
                if slot.is_none() {
                    *slot = block.layer;
                }
            }
            if call.shape.is_none() {
                if let Some(slot) = sized_from_block.get_mut(param) {
                    slot.get_or_insert(block.size.get());
                }
            }
            // A buffer freed before backward ends was added into an existing
            // `.grad` (zero_grad(set_to_none=False)): a temporary, not a gradient.
            if block.free_ts.is_none_or(|f| f > backward_end) {
                block.role = BlockRole::Gradient { param };
                if let Some(slot) = grad_of_param.get_mut(param) {
                    *slot = Some(block_id);
                }
            }
        }
    }
    if n_unlinked > 0 {
        warnings.push(Warning::new(
            "gradient_block_not_found",
            format!("{n_unlinked} AccumulateGrad calls had no live block of the parameter's size before them; those gradients are not marked"),
        ));
    }
    // Leaves whose gradient died before the optimizer step: no parameters.
    // A reentrant checkpoint's detached inputs get an AccumulateGrad too.
    let detached = crate::trace::reentrant_checkpoint_inputs(trace);
    let checkpoint_inputs: BTreeSet<usize> = reference
        .iter()
        .enumerate()
        .filter(|&(_, &call_idx)| {
            calls
                .get(call_idx)
                .and_then(|c| ops.source.get(c.op))
                .is_some_and(|source| detached.contains(source))
        })
        .filter_map(|(k, _)| n_params.checked_sub(k + 1))
        .collect();
    let new_index = leaves::drop_leaves(life, iterations, n_params, checkpoint_inputs, warnings);
    let parameters: Vec<Parameter> = reference
        .iter()
        .rev()
        .enumerate()
        .filter_map(|(old, &call_idx)| {
            let index = new_index.get(old).copied().flatten()?;
            let call = calls.get(call_idx)?;
            let bytes = match &call.shape {
                Some(_) => call.bytes,
                None => sized_from_block.get(old).copied().flatten()?,
            };
            Some(Parameter {
                index,
                shape: call.shape.clone().unwrap_or_default(),
                numel: call.numel,
                dtype: call.dtype.clone(),
                bytes: Bytes(bytes),
                layer: param_layer.get(old).copied().flatten(),
                sized_by_gradient: call.shape.is_none(),
            })
        })
        .collect();

    let optimizer = optimizer_facts(life, index, iterations, names);
    mark_batches(life, iterations);

    Evidence {
        parameters,
        zero_grad: ZeroGradFacts::default(),
        optimizer,
    }
}

/// Optimizer facts, and marks the state blocks of the first step.
fn optimizer_facts(
    life: &mut Life,
    index: &SpanIndex,
    iterations: &[Iteration],
    names: &Names,
) -> OptimizerFacts {
    let steps: Vec<(NameId, Nanos, Nanos)> = index
        .annotations
        .iter()
        .filter(|a| names.get(a.name).starts_with(OPT_STEP_PREFIX))
        .map(|a| (a.name, a.start, a.end))
        .collect();
    let mut facts = OptimizerFacts {
        n_steps: steps.len(),
        ..OptimizerFacts::default()
    };
    let Some(&(first_name, first_start, first_end)) = steps.first() else {
        return facts;
    };
    let full = names.get(first_name);
    let class = full.strip_prefix(OPT_STEP_PREFIX).unwrap_or(full);
    facts.class_name = Some(class.strip_suffix(".step").unwrap_or(class).to_owned());
    let step_spans: Vec<(Nanos, Nanos)> = steps.iter().map(|&(_, s, e)| (s, e)).collect();
    // The step proper: inside an `Optimizer.step` annotation and in none of
    // the phases that can run inside it (Lightning calls `step(closure)`, so
    // the last micro-batch's forward, backward and clipping run inside the
    // annotation).
    let in_a_step = |t: Nanos| {
        in_sorted_spans(&step_spans, t) && locate(iterations, t).1 == Phase::OptimizerStep
    };
    facts.uses_foreach = index
        .ops
        .spans
        .iter()
        .any(|o| in_a_step(o.start) && names.get(o.name).starts_with(FOREACH_PREFIX));
    let mut step_frames: Vec<(Nanos, &str)> = index
        .frames
        .spans
        .iter()
        .filter(|f| in_a_step(f.start))
        .map(|f| (f.start, names.get(f.name)))
        .filter(|(_, name)| {
            name.ends_with("): step") && !name.starts_with("torch/optim/optimizer.py(")
        })
        .collect();
    step_frames.sort();
    facts.torch_optim = match step_frames.first() {
        Some((_, name)) => Some(name.starts_with("torch/optim/")),
        // Without Python frames (with_stack=False) the source of `step` is
        // unknown, but the `Optimizer.step#<Class>.step` annotation is
        // recorded by torch.optim.Optimizer itself: a class of torch.optim's
        // own name is taken as torch.optim's.
        None if index.frames.spans.is_empty() => facts
            .class_name
            .as_deref()
            .map(|c| TORCH_OPTIM_CLASSES.contains(&c)),
        None => None,
    };
    for block in &mut life.blocks {
        if block.free_ts.is_none()
            && block.alloc_ts >= first_start
            && block.alloc_ts <= first_end
            && block.alloc_phase == Phase::OptimizerStep
            && block.role == BlockRole::Other
        {
            block.role = BlockRole::OptimizerState;
            facts.n_state_blocks += 1;
            facts.state_bytes += block.size;
        }
    }
    facts
}

/// Marks blocks allocated under a DataLoader fetch that outlive it.
fn mark_batches(life: &mut Life, iterations: &[Iteration]) {
    for block in &mut life.blocks {
        if block.alloc_phase != Phase::DataLoading || block.role != BlockRole::Other {
            continue;
        }
        let span_end = block
            .alloc_iteration
            .and_then(|i| iterations.get(i))
            .and_then(|it| {
                it.phases
                    .iter()
                    .filter(|p| {
                        p.phase == Phase::DataLoading
                            && p.start <= block.alloc_ts
                            && block.alloc_ts <= p.end
                    })
                    .map(|p| p.end)
                    .max()
            });
        if let Some(end) = span_end {
            if block.free_ts.is_none_or(|f| f > end) {
                block.role = BlockRole::Batch;
            }
        }
    }
}

/// Builds the final [`Analysis`]: per-iteration statistics, peak, layers.
pub(crate) fn assemble(
    trace: &Trace,
    life: Life,
    index: SpanIndex,
    mut iterations: Vec<Iteration>,
    found: Evidence,
    names: Names,
) -> Analysis {
    let mut events_by_device: BTreeMap<Device, usize> = BTreeMap::new();
    for event in &life.events {
        *events_by_device.entry(event.device).or_default() += 1;
    }
    // The device whose totals the peak is about: the one with most events.
    let primary = events_by_device
        .iter()
        .max_by_key(|&(d, n)| (*n, std::cmp::Reverse(*d)))
        .map_or(Device::Cpu, |(d, _)| *d);

    let mut running: i64 = 0;
    let mut peak = TracePeak::default();
    for (i, event) in life.events.iter().enumerate() {
        if let Some(it) = event.iteration.and_then(|i| iterations.get_mut(i)) {
            if event.delta > 0 {
                it.n_allocs += 1;
                *it.allocated_by_phase
                    .entry(event.phase)
                    .or_insert(Bytes::ZERO) += Bytes(event.delta.unsigned_abs());
            } else {
                it.n_frees += 1;
            }
        }
        if event.device != primary {
            continue;
        }
        running = running.saturating_add(event.delta);
        let now = Bytes(u64::try_from(running).unwrap_or(0));
        if let Some(it) = event.iteration.and_then(|i| iterations.get_mut(i)) {
            it.peak = it.peak.max(now);
        }
        if now > peak.bytes {
            peak = TracePeak {
                bytes: now,
                event: i,
                ts: event.ts,
            };
        }
    }

    let mut by_layer: BTreeMap<Option<NameId>, (Bytes, usize)> = BTreeMap::new();
    for block in &life.blocks {
        let live_at_peak = block.device == primary
            && block.alloc_event <= peak.event
            && block.free_event.is_none_or(|f| f > peak.event);
        if live_at_peak && !peak.bytes.get().eq(&0) {
            let slot = by_layer.entry(block.layer).or_insert((Bytes::ZERO, 0));
            slot.0 += block.size;
            slot.1 += 1;
        }
    }
    let mut layers_at_peak: Vec<LayerAtPeak> = by_layer
        .into_iter()
        .map(|(layer, (bytes, n_blocks))| LayerAtPeak {
            layer,
            bytes,
            n_blocks,
        })
        .collect();
    layers_at_peak.sort_by(|a, b| {
        b.bytes.cmp(&a.bytes).then_with(|| {
            let name = |l: Option<NameId>| l.map_or("", |id| names.get(id));
            name(a.layer).cmp(name(b.layer))
        })
    });

    let numel = found.parameters.iter().map(|p| p.numel);
    let parameter_totals = ParameterTotals {
        count: found.parameters.len(),
        numel: numel.fold(0, u64::saturating_add),
        bytes: found.parameters.iter().map(|p| p.bytes).sum(),
    };
    Analysis {
        origin: super::origin_of(trace),
        names: names.into_names(),
        events: life.events,
        blocks: life.blocks,
        unmatched_frees: life.unmatched_frees,
        ops: index.ops.spans,
        iterations,
        parameters: found.parameters,
        parameter_totals,
        zero_grad: found.zero_grad,
        optimizer: found.optimizer,
        devices: DeviceSummary {
            events_by_device,
            recorded_on_cuda: trace.recorded_on_cuda(),
        },
        peak,
        layers_at_peak,
        batch_size: super::loader_batch_size(trace),
        recipe: super::RunRecipe::default(),
        autocast: Vec::new(),
        inference_mode: Vec::new(),
        op_inputs: Vec::new(),
        state: super::resident::ModelState::default(),
        generation: None,
        quant_kernels: Vec::new(),
        kernel_calls: super::kernels::KernelCalls::default(),
        moe: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_sizes_follow_record_shapes_names() {
        assert_eq!(crate::trace::dtype_size("float"), Some(4));
        assert_eq!(crate::trace::dtype_size("c10::BFloat16"), Some(2));
        assert_eq!(crate::trace::dtype_size("c10::Half"), Some(2));
        assert_eq!(crate::trace::dtype_size("double"), Some(8));
        assert_eq!(crate::trace::dtype_size("long int"), Some(8));
        assert_eq!(crate::trace::dtype_size("bool"), Some(1));
        assert_eq!(crate::trace::dtype_size("Scalar"), None);
    }

    #[test]
    fn sorted_span_lookup() {
        let spans = [(Nanos(0), Nanos(10)), (Nanos(20), Nanos(30))];
        let hits: Vec<i64> = (-1..32)
            .filter(|&t| in_sorted_spans(&spans, Nanos(t)))
            .collect();
        let expected: Vec<i64> = (0..=10).chain(20..=30).collect();
        assert_eq!(hits, expected);
        assert!(!in_sorted_spans(&[], Nanos(0)));
    }

    #[test]
    fn scratch_prefixes_match_onednn_ops() {
        let config = AnalyzerConfig::standard();
        assert!(is_scratch("aten::mkldnn_convolution", &config));
        assert!(is_scratch("aten::to_mkldnn", &config));
        assert!(!is_scratch("aten::convolution", &config));
    }
}
