//! Rule `foreach_optimizer`: CUDA runs `torch.optim` optimizers left at
//! their default on the multi-tensor (`foreach`) path, whose temporaries are
//! whole lists of parameter-sized tensors instead of one tensor at a time.

use super::order::{Key, FOREACH_FREE_RANK};
use super::{name_of, update_start, windows_of, Item, RuleCounts, RuleId};
use crate::analyzer::Analysis;
use crate::diag::Warning;
use crate::orchestrator::schedule::{Category, Phase, PhaseWindow};
use crate::orchestrator::OptimizerPath;
use crate::units::Bytes;

/// The parameter-sized temporary lists the foreach step of a `torch.optim`
/// optimizer holds at once with default hyper-parameters (weight decay 0
/// or decoupled, no amsgrad, no nesterov, not maximize), with the op that
/// makes each list. From `torch/optim/<name>.py` `_multi_tensor_*`:
/// SGD updates in place; Adam and AdamW keep `exp_avg_sq_sqrt`
/// (`_foreach_sqrt`); RMSprop keeps `avg` (`_foreach_sqrt`); Adagrad keeps
/// `std` (`_foreach_sqrt`) and `numerator` (`_foreach_mul`).
pub fn foreach_temporary_lists(optimizer: &str) -> Option<&'static [&'static str]> {
    match optimizer {
        "SGD" => Some(&[]),
        "Adam" | "AdamW" | "RMSprop" => Some(&["aten::_foreach_sqrt"]),
        "Adagrad" => Some(&["aten::_foreach_sqrt", "aten::_foreach_mul"]),
        _ => None,
    }
}

/// Decides whether the foreach rule applies (a `torch.optim` optimizer whose
/// foreach lists are known, captured on the per-tensor path, and the CUDA
/// default path asked for), applies it and says so in a warning either way.
/// Returns whether it was applied.
pub(super) fn apply_foreach(
    analysis: &Analysis,
    path: OptimizerPath,
    remodel_foreach: bool,
    windows: &[PhaseWindow],
    items: &mut Vec<Item>,
    counts: &mut RuleCounts,
    warnings: &mut Vec<Warning>,
) -> bool {
    let optimizer = &analysis.optimizer;
    let Some(class) = optimizer.class_name.as_deref() else {
        return false;
    };
    if path == OptimizerPath::Captured {
        warnings.push(Warning::new(
            "optimizer_as_captured",
            format!("the {class} step is simulated as captured, as asked"),
        ));
        return false;
    }
    if optimizer.uses_foreach && !remodel_foreach {
        warnings.push(Warning::new(
            "optimizer_foreach_captured",
            format!("the {class} step was captured with the foreach path, which CUDA uses too; it is kept as captured"),
        ));
        return false;
    }
    if optimizer.torch_optim != Some(true) {
        warnings.push(Warning::new(
            "optimizer_custom",
            format!("the {class} step does not come from torch.optim (or its source was not found), so it is simulated as captured"),
        ));
        return false;
    }
    let Some(lists) = foreach_temporary_lists(class) else {
        warnings.push(Warning::new(
            "optimizer_foreach_unknown",
            format!("the foreach temporaries of {class} are not modelled, so its step is simulated as captured (per-tensor); the CUDA run may need more"),
        ));
        return false;
    };
    let parameters: Vec<(Bytes, Option<String>)> = analysis
        .parameters
        .iter()
        .map(|p| (p.bytes, name_of(analysis, p.layer)))
        .collect();
    let (dropped, added) = rule_foreach(items, windows, lists, &parameters);
    counts.insert(RuleId::ForeachOptimizer, added);
    warnings.push(Warning::new(
        "optimizer_foreach_modelled",
        format!(
            "CUDA runs torch.optim.{class} with foreach=True by default: {dropped} captured per-tensor step temporaries were replaced by {} parameter-sized temporary list(s) per step; use the captured-optimizer option to keep the captured step",
            lists.len()
        ),
    ));
    true
}

/// Rule `foreach_optimizer`: in each optimizer step, drops the captured
/// per-tensor temporaries and adds the foreach path's lists: one block per
/// parameter per list, allocated after the step's state creation (and after
/// the closure the step ran, [`update_start`]) and freed when the step ends.
/// Returns `(dropped, added)`.
fn rule_foreach(
    items: &mut Vec<Item>,
    windows: &[PhaseWindow],
    lists: &[&str],
    parameters: &[(Bytes, Option<String>)],
) -> (u32, u32) {
    let before = items.len();
    items.retain(|item| {
        !(item.category == Category::Temporary
            && item.phase == Phase::OptimizerStep
            && item.source.is_some())
    });
    let dropped = (before - items.len()) as u32;
    let mut added = 0u32;
    for step in windows_of(windows, Phase::OptimizerStep) {
        let (start, end) = (update_start(windows, step), step.end);
        let state_done = items
            .iter()
            .filter(|i| {
                i.category == Category::OptimizerState
                    && i.alloc.time >= start
                    && i.alloc.time <= end
            })
            .map(|i| i.alloc.time)
            .max()
            .unwrap_or(start);
        let mut rank = 0u64;
        for op in lists {
            for (size, layer) in parameters {
                items.push(Item {
                    size: *size,
                    category: Category::Temporary,
                    iteration: Some(step.iteration),
                    phase: Phase::OptimizerStep,
                    op: Some((*op).to_owned()),
                    layer: layer.clone(),
                    alloc: Key::after_trace(state_done, rank),
                    free: Some(Key::after_trace(
                        end.max(state_done),
                        FOREACH_FREE_RANK | rank,
                    )),
                    source: None,
                    rule: None,
                    on: crate::kernels::ArchSet::ALL,
                    per_gpu: None,
                });
                rank += 1;
                added += 1;
            }
        }
    }
    (dropped, added)
}
