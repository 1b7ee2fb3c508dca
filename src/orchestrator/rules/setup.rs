//! Rules `parameters`, `batchnorm_buffers` and `constructor_optimizer_state`:
//! the blocks a training process holds before its first profiled step, which
//! a CPU trace does not show.

use std::collections::BTreeMap;

use super::order::Key;
use super::{count, name_of, Item, RuleCounts, RuleId};
use crate::analyzer::Analysis;
use crate::diag::Warning;
use crate::orchestrator::schedule::{Category, Phase};
use crate::units::Bytes;

/// Optimizers whose state builds in the constructor, so the trace has none of it.
const CONSTRUCTOR_STATE_OPTIMIZERS: &[&str] = &["Adagrad"];

/// The setup blocks (parameters with their BatchNorm buffers, then
/// constructor-built optimizer state), their counts and their warnings.
pub(super) fn setup_items(
    analysis: &Analysis,
    counts: &mut RuleCounts,
    warnings: &mut Vec<Warning>,
) -> Vec<Item> {
    let mut items = rule_parameters(analysis);
    let n_parameters = analysis.parameters.len();
    let parameter_bytes: Bytes = analysis.parameters.iter().map(|p| p.bytes).sum();
    let buffer_items: Vec<&Item> = items
        .iter()
        .filter(|i| i.category == Category::Buffer)
        .collect();
    let buffer_bytes: Bytes = buffer_items.iter().map(|i| i.size).sum();
    counts.insert(RuleId::Parameters, count(n_parameters));
    counts.insert(RuleId::BatchnormBuffers, count(buffer_items.len()));
    if n_parameters == 0 {
        warnings.push(Warning::new(
            "no_parameters",
            "no AccumulateGrad op with a shape was found, so parameters could not be inferred and are missing from the estimate; profile with record_shapes=True",
        ));
    } else {
        warnings.push(Warning::new(
            "parameters_inferred",
            format!(
                "{n_parameters} parameters ({} bytes) were inferred from AccumulateGrad shapes and allocated before the first iteration",
                parameter_bytes.get()
            ),
        ));
    }
    warnings.push(Warning::new(
        "buffers_partial",
        format!(
            "model buffers are not in a CPU trace: {} bytes of BatchNorm running statistics were added from the BatchNorm parameter shapes, other buffers are not counted",
            buffer_bytes.get()
        ),
    ));
    let constructor = rule_constructor_state(analysis, items.len() as u64);
    if !constructor.is_empty() {
        let bytes: Bytes = constructor.iter().map(|i| i.size).sum();
        warnings.push(Warning::new(
            "constructor_state_added",
            format!(
                "{} builds its state in the constructor, before profiling: {} bytes of state were added by calculation",
                analysis.optimizer.class_name.as_deref().unwrap_or("the optimizer"),
                bytes.get()
            ),
        ));
    }
    counts.insert(RuleId::ConstructorOptimizerState, count(constructor.len()));
    items.extend(constructor);
    items
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
/// parameters and recoverable buffers, allocated at setup in module order.
/// `model.to(device)` copies each module's parameters and then its buffers,
/// so each BatchNorm layer's buffers follow its last parameter.
fn rule_parameters(analysis: &Analysis) -> Vec<Item> {
    let buffers = rule_batchnorm_buffers(analysis);
    let mut items = Vec::with_capacity(analysis.parameters.len() + buffers.len());
    for (position, parameter) in analysis.parameters.iter().enumerate() {
        items.push(Item {
            size: parameter.bytes,
            category: Category::Parameter,
            iteration: None,
            phase: Phase::Setup,
            op: Some("model.to(device)".to_owned()),
            layer: name_of(analysis, parameter.layer),
            alloc: Key::setup(items.len() as u64),
            free: None,
            source: None,
            rule: None,
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
/// weight and an int64 `num_batches_tracked`. Keyed by the position of the
/// layer's last parameter. Other buffers are not in the trace.
fn rule_batchnorm_buffers(analysis: &Analysis) -> BTreeMap<usize, Vec<Item>> {
    const BATCHNORM: &[&str] = &["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"];
    // layer → (first parameter size, last parameter position)
    let mut layers: BTreeMap<String, (Bytes, usize)> = BTreeMap::new();
    for (position, parameter) in analysis.parameters.iter().enumerate() {
        let Some(layer) = name_of(analysis, parameter.layer) else {
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
            });
        }
    }
    out
}

/// Rule `constructor_optimizer_state`: Adagrad builds `sum` (one tensor per
/// parameter, its shape and dtype) in its constructor, before profiling, so the
/// trace has no persistent block in the first step. Its `step` is a host scalar.
pub(super) fn rule_constructor_state(analysis: &Analysis, first_rank: u64) -> Vec<Item> {
    let Some(class) = analysis.optimizer.class_name.as_deref() else {
        return Vec::new();
    };
    if !CONSTRUCTOR_STATE_OPTIMIZERS.contains(&class) || analysis.optimizer.n_state_blocks > 0 {
        return Vec::new();
    }
    analysis
        .parameters
        .iter()
        .enumerate()
        .map(|(i, parameter)| Item {
            size: parameter.bytes,
            category: Category::OptimizerState,
            iteration: None,
            phase: Phase::Setup,
            op: Some(format!("{class}.__init__ state sum")),
            layer: name_of(analysis, parameter.layer),
            alloc: Key::setup(first_rank + i as u64),
            free: None,
            source: None,
            rule: None,
        })
        .collect()
}
