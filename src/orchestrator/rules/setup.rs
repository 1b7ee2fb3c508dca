//! Rules `parameters`, `batchnorm_buffers`, `model_buffers`,
//! `constructor_optimizer_state`, `activations_before_trace` and
//! `ddp_buckets`: the blocks a process holds before its first profiled step,
//! which a CPU trace does not allocate. What they are comes from the
//! analyzer's resident state ([`crate::analyzer::resident`]); these rules
//! place them: allocated first, in `model.to(device)` order, and kept (or
//! freed where the trace shows the tensor goes); optimizer state a lazily
//! initialising optimizer made moves to the first optimizer step
//! ([`place_lazy_optimizer_state`]).

use std::collections::BTreeMap;

use super::order::Key;
use super::{count, name_of, update_start, windows_of, Item, RuleCounts, RuleId};
use crate::analyzer::resident::{bucket_sizes, StateItem, StateKind, StateSource};
use crate::analyzer::Analysis;
use crate::diag::{Setting, Warning};
use crate::orchestrator::schedule::{Category, Phase, PhaseWindow};
use crate::orchestrator::{OrchestrateError, ParameterOverride, StateFacts, BUCKET_OP};
use crate::units::Bytes;

/// One parameter to allocate at setup: its size and layer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Param {
    bytes: Bytes,
    layer: Option<String>,
    frozen: bool,
}

/// The setup blocks (parameters with their buffers, the other state made
/// before the trace), their counts and their warnings.
pub(super) fn setup_items(
    analysis: &Analysis,
    overrides: ParameterOverride,
    counts: &mut RuleCounts,
    warnings: &mut Vec<Warning>,
) -> Result<(Vec<Item>, StateFacts), OrchestrateError> {
    let (params, in_trace) = parameters(analysis, overrides, warnings)?;
    let n_parameters = params.len();
    let mut items = rule_parameters(&params);
    counts.insert(RuleId::Parameters, count(n_parameters));
    let n_batchnorm = items
        .iter()
        .filter(|i| i.category == Category::Buffer)
        .count();
    counts.insert(RuleId::BatchnormBuffers, count(n_batchnorm));
    if n_parameters == 0 && in_trace == Bytes::ZERO {
        warnings.push(Warning::asking(
            "no_parameters",
            "no parameter was found in the trace (no tensor the forward pass reads comes from before the trace, and no AccumulateGrad), so the estimate has none; if the model has parameters, ",
            Setting::ParameterBytes,
        ));
    }

    let batchnorm_layers: Vec<String> = items
        .iter()
        .filter(|i| i.category == Category::Buffer)
        .filter_map(|i| i.layer.clone())
        .collect();
    let state = &analysis.state;
    let buffers: Vec<&StateItem> = state
        .of(StateKind::Buffer)
        .filter(|b| b.block.is_none())
        .filter(|b| {
            name_of(analysis, b.layer).is_none_or(|layer| !batchnorm_layers.contains(&layer))
        })
        .collect();
    let n_buffers = buffers.len();
    for b in buffers {
        items.push(setup_item(
            analysis,
            b,
            Category::Buffer,
            "model.to(device) buffer",
            items.len(),
        ));
    }
    if n_buffers > 0 {
        counts.insert(RuleId::ModelBuffers, count(n_buffers));
    }
    // Quantisation state goes with the model (it is part of the quantized
    // weights' state dict), unless the user gave the parameter bytes.
    let mut n_quant = 0_usize;
    if !overrides.is_set() {
        for q in state
            .of(StateKind::QuantState)
            .filter(|q| q.block.is_none())
        {
            items.push(setup_item(
                analysis,
                q,
                Category::QuantState,
                "bitsandbytes quantisation state",
                items.len(),
            ));
            n_quant += 1;
        }
    }
    if n_quant > 0 {
        counts.insert(RuleId::QuantState, count(n_quant));
    }

    let class = analysis
        .optimizer
        .class_name
        .as_deref()
        .unwrap_or("the optimizer");
    let op = format!("{class} state made before the trace");
    let mut n_state = 0_usize;
    for s in state.of(StateKind::OptimizerState) {
        items.push(setup_item(
            analysis,
            s,
            Category::OptimizerState,
            &op,
            items.len(),
        ));
        n_state += 1;
    }
    counts.insert(RuleId::ConstructorOptimizerState, count(n_state));
    if n_state > 0 {
        let total: Bytes = state.of(StateKind::OptimizerState).map(|s| s.bytes).sum();
        warnings.push(Warning::new(
            "optimizer_state_before_trace",
            format!(
                "{class} allocated no state in the first recorded step, so its state was made before the trace (in its constructor, like Adagrad's, or in steps a profiler schedule did not record): {} bytes of state for the trainable parameters, from the optimizer class and what its step runs, are allocated {}",
                total.get(),
                if builds_state_lazily(class) {
                    "at the first optimizer step, where torch.optim builds them"
                } else {
                    "before the first iteration, as its constructor does"
                }
            ),
        ));
    }

    let mut n_activations = 0_usize;
    for a in state
        .of(StateKind::Activation)
        .filter(|a| a.block.is_none())
    {
        let mut item = setup_item(
            analysis,
            a,
            Category::Activation,
            "made before the trace",
            items.len(),
        );
        // Freed after its last read: a KV cache or a batch replaced by the
        // trace's own.
        item.free = a.last_read.map(|t| Key::after_trace(t, items.len() as u64));
        items.push(item);
        n_activations += 1;
    }
    if n_activations > 0 {
        counts.insert(RuleId::ActivationsBeforeTrace, count(n_activations));
    }

    let mut n_buckets = 0_usize;
    for b in state.of(StateKind::Bucket) {
        // Sized by the trainable bytes (a trace without shapes): split as
        // the reducer does (a first bucket of 1 MiB, then 25 MiB ones).
        let sizes = if b.source == StateSource::TrainableBytes {
            bucket_sizes(b.bytes.get())
        } else {
            vec![b.bytes.get()]
        };
        for size in sizes {
            let mut item = setup_item(analysis, b, Category::Bucket, BUCKET_OP, items.len());
            item.size = Bytes(size);
            // The reducer rebuilds its buckets after the first iteration:
            // the ones made before the trace go when the trace's own arrive.
            item.free = b.last_read.map(|t| Key::before_trace(t, 0));
            items.push(item);
            n_buckets += 1;
        }
    }
    if n_buckets > 0 {
        counts.insert(RuleId::DdpBuckets, count(n_buckets));
    }
    let mut facts = state_facts(analysis, &params, in_trace, &items);
    if !overrides.is_set() {
        facts.quantized_bytes = analysis.state.totals.quantized;
    }
    if n_parameters > 0 && !overrides.is_set() {
        warnings.push(found_warning(analysis, &facts));
    }
    Ok((items, facts))
}

/// What the schedule holds of the model.
fn state_facts(
    analysis: &Analysis,
    params: &[Param],
    in_trace: Bytes,
    items: &[Item],
) -> StateFacts {
    let sum = |frozen: bool| -> Bytes {
        params
            .iter()
            .filter(|p| p.frozen == frozen)
            .map(|p| p.bytes)
            .sum()
    };
    let n_in_trace = analysis
        .state
        .of(StateKind::Parameter)
        .filter(|p| p.block.is_some())
        .count();
    let in_trace_buffers: Bytes = analysis
        .state
        .of(StateKind::Buffer)
        .filter(|b| b.block.is_some())
        .map(|b| b.bytes)
        .sum();
    let buffers: Bytes = items
        .iter()
        .filter(|i| i.category == Category::Buffer)
        .map(|i| i.size)
        .sum();
    let trainable = sum(false);
    let frozen = sum(true);
    StateFacts {
        n_parameters: count(params.len() + n_in_trace),
        parameter_bytes: trainable + frozen + in_trace,
        // A model built in the trace: its parameters' blocks are its own,
        // trainable or not as the analyzer found.
        trainable_bytes: trainable
            + analysis
                .state
                .of(StateKind::Parameter)
                .filter(|p| p.block.is_some() && p.trainable)
                .map(|p| p.bytes)
                .sum(),
        frozen_bytes: frozen
            + analysis
                .state
                .of(StateKind::Parameter)
                .filter(|p| p.block.is_some() && !p.trainable)
                .map(|p| p.bytes)
                .sum(),
        buffer_bytes: buffers + in_trace_buffers,
        // set by the caller when the parameters are the trace's own
        quantized_bytes: Bytes::ZERO,
        quant_state_bytes: items
            .iter()
            .filter(|i| i.category == Category::QuantState)
            .map(|i| i.size)
            .sum(),
    }
}

/// The warning that says what was found and how.
fn found_warning(analysis: &Analysis, facts: &StateFacts) -> Warning {
    let how = if analysis.state.has_shapes {
        "trainable ones from their AccumulateGrad shapes, the others as tensors the forward pass reads that were never allocated in the trace"
    } else {
        "sized from their gradient blocks (the trace has no shapes)"
    };
    Warning::new(
        "parameters_inferred",
        format!(
            "{} parameters ({} bytes: {} trainable, {} frozen) and {} bytes of buffers were found ({how}) and allocated before the first iteration; buffers and weights the forward pass never reads are not counted",
            facts.n_parameters,
            facts.parameter_bytes.get(),
            facts.trainable_bytes.get(),
            facts.frozen_bytes.get(),
            facts.buffer_bytes.get()
        ),
    )
}

/// Optimizer classes whose constructor builds their state (`sum` in
/// `torch/optim/adagrad.py`'s `__init__`); every other `torch.optim` class
/// builds it lazily, in its first `step()` (`_init_group`: `if len(state) ==
/// 0`).
const STATE_IN_CONSTRUCTOR: &[&str] = &["Adagrad"];

/// Whether an optimizer class builds its state in its first `step()`.
fn builds_state_lazily(class: &str) -> bool {
    !STATE_IN_CONSTRUCTOR.contains(&class)
}

/// Optimizer state the trace shows existing before it (a profiler schedule
/// left out the first steps) was made by the job's first `step()` unless its
/// class builds it in the constructor: its setup blocks move to the start of
/// the first simulated optimizer step's update (after the closure the step
/// ran, if any), where the job's first iteration made them, so a job
/// recorded with a schedule is simulated as the same job recorded from its
/// first step.
pub(super) fn place_lazy_optimizer_state(
    analysis: &Analysis,
    windows: &[PhaseWindow],
    items: &mut [Item],
) {
    let lazy = analysis
        .optimizer
        .class_name
        .as_deref()
        .is_some_and(builds_state_lazily);
    let first_step = windows_of(windows, Phase::OptimizerStep).min_by_key(|w| w.start);
    let (true, Some(step)) = (lazy, first_step) else {
        return;
    };
    for item in items
        .iter_mut()
        .filter(|i| i.phase == Phase::Setup && i.category == Category::OptimizerState)
    {
        item.alloc = Key::before_trace(update_start(windows, step), item.alloc.rank);
        item.phase = Phase::OptimizerStep;
        item.iteration = Some(step.iteration);
    }
}

/// A setup item for one resident tensor.
fn setup_item(
    analysis: &Analysis,
    s: &StateItem,
    category: Category,
    op: &str,
    rank: usize,
) -> Item {
    Item {
        size: s.bytes,
        category,
        iteration: None,
        phase: Phase::Setup,
        op: Some(op.to_owned()),
        layer: name_of(analysis, s.layer),
        alloc: Key::setup(rank as u64),
        free: None,
        source: None,
        rule: None,
        on: crate::kernels::ArchSet::ALL,
        per_gpu: None,
    }
}

/// Every parameter to allocate at setup: the trainable ones in
/// `AccumulateGrad` order (the model's order), then the frozen ones in the
/// order the forward reads them; parameters whose block the trace allocated
/// (a model built in the profiled region) are not added again. The user's
/// figures replace the trace's: the frozen part is scaled to the given
/// frozen bytes (or to the given total less the trainable bytes).
fn parameters(
    analysis: &Analysis,
    overrides: ParameterOverride,
    warnings: &mut Vec<Warning>,
) -> Result<(Vec<Param>, Bytes), OrchestrateError> {
    let state = &analysis.state;
    // A trainable parameter whose block the trace allocated (a model built
    // inside the profiled region) is that block: not added again.
    let mut built_in_trace: BTreeMap<Bytes, usize> = BTreeMap::new();
    for p in state
        .of(StateKind::Parameter)
        .filter(|p| p.trainable && p.block.is_some())
    {
        *built_in_trace.entry(p.bytes).or_default() += 1;
    }
    let mut params: Vec<Param> = analysis
        .parameters
        .iter()
        .filter(|p| match built_in_trace.get_mut(&p.bytes) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .map(|p| Param {
            bytes: p.bytes,
            layer: name_of(analysis, p.layer),
            frozen: false,
        })
        .collect();
    let in_trace: Bytes = state
        .of(StateKind::Parameter)
        .filter(|p| p.block.is_some())
        .map(|p| p.bytes)
        .sum();
    let frozen: Vec<Param> = state
        .of(StateKind::Parameter)
        .filter(|p| !p.trainable && p.block.is_none())
        .map(|p| Param {
            bytes: p.bytes,
            layer: name_of(analysis, p.layer),
            frozen: true,
        })
        .collect();
    let trainable: Bytes = params.iter().map(|p| p.bytes).sum();
    if !overrides.is_set() {
        if params.is_empty() && frozen.is_empty() && in_trace == Bytes::ZERO && state.shapes_missing
        {
            return Err(OrchestrateError::ParametersUnknown);
        }
        params.extend(frozen);
        return Ok((params, in_trace));
    }
    let found_frozen: Bytes = frozen.iter().map(|p| p.bytes).sum();
    let wanted_frozen = match (overrides.total, overrides.frozen) {
        (Some(total), Some(frozen)) => {
            if frozen > total {
                return Err(OrchestrateError::ParameterOverrideInconsistent {
                    total: total.get(),
                    frozen: frozen.get(),
                });
            }
            if total.saturating_sub(frozen) != trainable.saturating_add(in_trace) {
                warnings.push(Warning::new(
                    "parameters_trainable_differs",
                    format!(
                        "the parameter bytes given leave {} trainable bytes, the trace's gradients show {}: the gradients and optimizer state follow the trace",
                        total.saturating_sub(frozen).get(),
                        trainable.get()
                    ),
                ));
            }
            frozen
        }
        (Some(total), None) => total.saturating_sub(trainable).saturating_sub(in_trace),
        (None, Some(frozen)) => frozen,
        (None, None) => found_frozen,
    };
    params.extend(scaled(&frozen, wanted_frozen));
    let total: Bytes = params.iter().map(|p| p.bytes).sum::<Bytes>() + in_trace;
    warnings.push(Warning::new(
        "parameters_from_user",
        format!(
            "the parameter bytes were given: {} bytes of parameters ({} trainable from the trace's gradients, {} frozen) are allocated before the first iteration instead of the {} the trace shows",
            total.get(),
            trainable.get(),
            wanted_frozen.get(),
            (trainable + found_frozen + in_trace).get()
        ),
    ));
    Ok((params, in_trace))
}

/// `frozen` resized to `bytes` in total, each in proportion (one block when
/// the trace showed none); the rounding goes to the last one.
fn scaled(frozen: &[Param], bytes: Bytes) -> Vec<Param> {
    let found = frozen
        .iter()
        .map(|p| p.bytes.get())
        .fold(0, u64::saturating_add);
    if found == 0 {
        return if bytes > Bytes::ZERO {
            vec![Param {
                bytes,
                layer: None,
                frozen: true,
            }]
        } else {
            Vec::new()
        };
    }
    let mut out: Vec<Param> = frozen
        .iter()
        .map(|p| Param {
            bytes: Bytes(
                u64::try_from(
                    u128::from(p.bytes.get()) * u128::from(bytes.get()) / u128::from(found),
                )
                .unwrap_or(u64::MAX),
            ),
            layer: p.layer.clone(),
            frozen: true,
        })
        .collect();
    let sum: Bytes = out.iter().map(|p| p.bytes).sum();
    if let Some(last) = out.last_mut() {
        last.bytes = last.bytes.saturating_add(bytes.saturating_sub(sum));
    }
    out.retain(|p| p.bytes > Bytes::ZERO);
    out
}

/// The class part of a module path's last component: `A_0/BatchNorm2d_3` → `BatchNorm2d`.
pub(super) fn module_class(layer: &str) -> &str {
    let last = layer.rsplit('/').next().unwrap_or(layer);
    match last.rsplit_once('_') {
        Some((class, index)) if !index.is_empty() && index.chars().all(|c| c.is_ascii_digit()) => {
            class
        }
        _ => last,
    }
}

/// Rule `parameters` (with `batchnorm_buffers` interleaved): the model's
/// parameters and BatchNorm buffers, allocated at setup in module order.
/// `model.to(device)` copies each module's parameters and then its buffers,
/// so each BatchNorm layer's buffers follow its last parameter.
fn rule_parameters(params: &[Param]) -> Vec<Item> {
    let buffers = rule_batchnorm_buffers(params);
    let mut items = Vec::with_capacity(params.len() + buffers.len());
    for (position, parameter) in params.iter().enumerate() {
        items.push(Item {
            size: parameter.bytes,
            category: Category::Parameter,
            iteration: None,
            phase: Phase::Setup,
            op: Some(
                if parameter.frozen {
                    "model.to(device) frozen"
                } else {
                    "model.to(device)"
                }
                .to_owned(),
            ),
            layer: parameter.layer.clone(),
            alloc: Key::setup(items.len() as u64),
            free: None,
            source: None,
            rule: None,
            on: crate::kernels::ArchSet::ALL,
            per_gpu: None,
        });
        if let Some(after) = buffers.get(&position) {
            for buffer in after {
                let mut buffer = buffer.clone();
                buffer.alloc = Key::setup(items.len() as u64);
                items.push(buffer);
            }
        }
    }
    items
}

/// Rule `batchnorm_buffers`: BatchNorm layers (`BatchNorm1d/2d/3d`,
/// `SyncBatchNorm`) carry `running_mean` and `running_var` shaped like their
/// weight and an int64 `num_batches_tracked` (which eval-mode forwards do not
/// read). Keyed by the position of the layer's last parameter.
fn rule_batchnorm_buffers(params: &[Param]) -> BTreeMap<usize, Vec<Item>> {
    const BATCHNORM: &[&str] = &["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"];
    // layer → (first parameter size, last parameter position)
    let mut layers: BTreeMap<String, (Bytes, usize)> = BTreeMap::new();
    for (position, parameter) in params.iter().enumerate() {
        let Some(layer) = parameter.layer.clone() else {
            continue;
        };
        if !BATCHNORM.contains(&module_class(&layer)) {
            continue;
        }
        layers
            .entry(layer)
            .and_modify(|entry| entry.1 = position)
            .or_insert((parameter.bytes, position));
    }
    let mut out: BTreeMap<usize, Vec<Item>> = BTreeMap::new();
    for (layer, (weight_bytes, last)) in layers {
        for (size, name) in [
            (weight_bytes, "running_mean"),
            (weight_bytes, "running_var"),
            (Bytes(8), "num_batches_tracked"),
        ] {
            out.entry(last).or_default().push(Item {
                size,
                category: Category::Buffer,
                iteration: None,
                phase: Phase::Setup,
                op: Some(format!("model.to(device) buffer {name}")),
                layer: Some(layer.clone()),
                alloc: Key::setup(0),
                free: None,
                source: None,
                rule: None,
                on: crate::kernels::ArchSet::ALL,
                per_gpu: None,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_parameters_scale_to_the_given_bytes() {
        let p = |bytes: u64| Param {
            bytes: Bytes(bytes),
            layer: None,
            frozen: true,
        };
        let out = scaled(&[p(100), p(300)], Bytes(1000));
        assert_eq!(
            out.iter().map(|p| p.bytes.get()).collect::<Vec<_>>(),
            vec![250, 750]
        );
        let out = scaled(&[p(1), p(1), p(1)], Bytes(10));
        assert_eq!(out.iter().map(|p| p.bytes.get()).sum::<u64>(), 10);
        assert_eq!(scaled(&[], Bytes(64)).len(), 1);
        assert!(scaled(&[], Bytes::ZERO).is_empty());
    }
}
