//! Leaves that get a gradient but are no parameters.
//!
//! Autograd runs `AccumulateGrad` for every leaf tensor that requires grad,
//! not only for parameters: a tensor the forward makes a leaf with
//! `requires_grad_(True)` gets one too. The Hugging Face `Trainer` does this
//! whenever gradient checkpointing is on and the input embeddings are frozen
//! (LoRA, adapters): `enable_input_require_grads` hooks the embedding layer
//! and calls `output.requires_grad_(True)` so that gradients reach the
//! checkpointed blocks. That leaf is an activation (`[batch, seq, hidden]`),
//! made anew by every forward pass, and its `.grad` lives as long as it does:
//! both die when Python drops the graph after `backward()` returns.
//!
//! A parameter's `.grad` cannot die that early: the optimizer holds every
//! parameter in its `param_groups`, and `.grad` is dropped only by
//! `zero_grad(set_to_none=True)` or `p.grad = None`, after the step has read
//! it (or, before a later backward, the previous step's). So a gradient
//! `AccumulateGrad` kept past its backward pass that is freed before the
//! optimizer step of its iteration has ended belonged to a leaf the optimizer
//! does not hold: that leaf is no parameter, and its gradient is an
//! activation's.
//!
//! Reentrant checkpointing makes such leaves too, but their gradient never
//! shows as a block that outlives backward, so the rule above cannot see
//! them: the inputs `CheckpointFunction.backward` detaches to recompute its
//! block ([`crate::trace::reentrant_checkpoint_inputs`]). Their
//! `AccumulateGrad` calls are dropped the same way.

use std::collections::{BTreeMap, BTreeSet};

use super::lifecycle::Life;
use super::{BlockRole, Iteration, Phase};
use crate::diag::Warning;
use crate::units::Nanos;

/// The parameter indices (of the first backward pass's `AccumulateGrad`
/// calls) that are leaves of the forward, not parameters: every gradient
/// block linked to one whose iteration runs an optimizer step after it was
/// freed before that step ended, and there is at least one such block.
/// Gradients in an iteration without a later optimizer step (a trace cut
/// before the step, a loop without one) say nothing either way.
fn not_parameters(life: &Life, iterations: &[Iteration]) -> BTreeSet<usize> {
    // Per parameter: (gradient blocks judged, of them freed before the step).
    let mut judged: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for block in &life.blocks {
        let BlockRole::Gradient { param } = block.role else {
            continue;
        };
        let Some(step_end) = block
            .alloc_iteration
            .and_then(|i| iterations.get(i))
            .and_then(|it| step_end_after(it, block.alloc_ts))
        else {
            continue;
        };
        let slot = judged.entry(param).or_default();
        slot.0 += 1;
        if block.free_ts.is_some_and(|f| f < step_end) {
            slot.1 += 1;
        }
    }
    judged
        .into_iter()
        .filter(|&(_, (n, early))| n > 0 && early == n)
        .map(|(param, _)| param)
        .collect()
}

/// The end of the first optimizer step of `it` that ends after `t`.
fn step_end_after(it: &Iteration, t: Nanos) -> Option<Nanos> {
    it.phases
        .iter()
        .filter(|p| p.phase == Phase::OptimizerStep && p.end > t)
        .map(|p| p.end)
        .min()
}

/// Finds the leaves among the `n_params` parameters of the first backward
/// pass — those whose gradient dies before the step ([`not_parameters`]) and
/// a reentrant checkpoint's detached inputs (`checkpoint_inputs`, from
/// [`crate::trace::reentrant_checkpoint_inputs`]) — and drops them ([`drop_parameters`]),
/// with a warning for each kind. Returns each old index's new one (`None`
/// for a leaf).
pub(super) fn drop_leaves(
    life: &mut Life,
    iterations: &[Iteration],
    n_params: usize,
    checkpoint_inputs: BTreeSet<usize>,
    warnings: &mut Vec<Warning>,
) -> Vec<Option<usize>> {
    let mut leaves = not_parameters(life, iterations);
    leaves.retain(|p| !checkpoint_inputs.contains(p));
    if !leaves.is_empty() {
        // Each leaf's size: its largest gradient block.
        let mut sizes: BTreeMap<usize, u64> = BTreeMap::new();
        for block in &life.blocks {
            if let BlockRole::Gradient { param } = block.role {
                if leaves.contains(&param) {
                    let size = sizes.entry(param).or_default();
                    *size = (*size).max(block.size.get());
                }
            }
        }
        let bytes = sizes.values().fold(0, |s: u64, &b| s.saturating_add(b));
        warnings.push(Warning::new(
            "gradient_of_a_leaf_activation",
            format!("{} tensor(s) of {bytes} bytes got a gradient in backward that died before the optimizer step, so they are leaves the forward made (an input set to require grad, as the Hugging Face Trainer does for frozen input embeddings under gradient checkpointing), not parameters: their gradients are counted as activations, and they get no optimizer state", leaves.len()),
        ));
    }
    if !checkpoint_inputs.is_empty() {
        warnings.push(Warning::new(
            "reentrant_checkpoint_inputs",
            format!("{} tensor(s) got a gradient inside a reentrant checkpoint's backward as the inputs it detached to recompute its block (torch.utils.checkpoint with use_reentrant=True): they are the blocks' input activations, not parameters, and get no optimizer state", checkpoint_inputs.len()),
        ));
    }
    leaves.extend(checkpoint_inputs);
    drop_parameters(life, &leaves, n_params)
}

/// Drops the parameters in `dropped` out of `0..n_params`: their gradient
/// blocks become ordinary blocks (an activation's gradient), and the others'
/// gradient blocks are renumbered. Returns each old index's new one (`None`
/// for a dropped one), so that the parameter list stays numbered by position.
fn drop_parameters(
    life: &mut Life,
    dropped: &BTreeSet<usize>,
    n_params: usize,
) -> Vec<Option<usize>> {
    let mut next = 0_usize;
    let new_index: Vec<Option<usize>> = (0..n_params)
        .map(|old| {
            (!dropped.contains(&old)).then(|| {
                next += 1;
                next - 1
            })
        })
        .collect();
    if dropped.is_empty() {
        return new_index;
    }
    for block in &mut life.blocks {
        if let BlockRole::Gradient { param } = block.role {
            block.role = match new_index.get(param).copied().flatten() {
                Some(param) => BlockRole::Gradient { param },
                None => BlockRole::Other,
            };
        }
    }
    new_index
}

#[cfg(test)]
mod tests {
    use crate::analyzer::{analyze, AnalyzerConfig, BlockRole};

    /// One step of `forward; backward; step`: a weight's gradient (64
    /// bytes, kept past the step) and a leaf activation's (32 bytes, freed
    /// once backward returns, before the step). The leaf runs its
    /// `AccumulateGrad` last, as the input embeddings do.
    const TRACE: &str = r#"{"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 2000},
        {"ph": "X", "cat": "python_function", "name": "nn.Module: Net_0", "pid": 1, "tid": 1, "ts": 100, "dur": 150, "args": {"Python id": 1, "Python module id": 0}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 110, "dur": 130, "args": {"Sequence number": 0, "Fwd thread id": 0}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 120, "args": {"Bytes": 32, "Addr": 9, "Device Type": 0, "Device Id": -1}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 200, "args": {"Bytes": 400, "Addr": 10, "Device Type": 0, "Device Id": -1}},
        {"ph": "X", "cat": "python_function", "name": "torch/_tensor.py(566): backward", "pid": 1, "tid": 1, "ts": 300, "dur": 300, "args": {"Python id": 2}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: AddmmBackward0", "pid": 1, "tid": 1, "ts": 310, "dur": 100, "args": {"Sequence number": 0, "Fwd thread id": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 320, "dur": 80},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 330, "args": {"Bytes": 64, "Addr": 20, "Device Type": 0, "Device Id": -1}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 340, "args": {"Bytes": 32, "Addr": 21, "Device Type": 0, "Device Id": -1}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 420, "dur": 30},
        {"ph": "X", "cat": "cpu_op", "name": "torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 422, "dur": 26, "args": {"Input Dims": [[4, 4]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 460, "dur": 30},
        {"ph": "X", "cat": "cpu_op", "name": "torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 462, "dur": 26, "args": {"Input Dims": [[2, 4]], "Input type": ["float"]}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 650, "args": {"Bytes": -400, "Addr": 10, "Device Type": 0, "Device Id": -1}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 660, "args": {"Bytes": -32, "Addr": 21, "Device Type": 0, "Device Id": -1}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 670, "args": {"Bytes": -32, "Addr": 9, "Device Type": 0, "Device Id": -1}},
        {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1, "ts": 800, "dur": 200},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add_", "pid": 1, "tid": 1, "ts": 810, "dur": 20},
        {"ph": "X", "cat": "user_annotation", "name": "Optimizer.zero_grad#SGD.zero_grad", "pid": 1, "tid": 1, "ts": 1100, "dur": 10},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1105, "args": {"Bytes": -64, "Addr": 20, "Device Type": 0, "Device Id": -1}}
    ]}"#;

    fn roles_by_size(blocks: &[crate::analyzer::Block]) -> Vec<(u64, BlockRole)> {
        blocks.iter().map(|b| (b.size.get(), b.role)).collect()
    }

    #[test]
    fn a_gradient_freed_before_the_step_is_a_leaf_activations() {
        let trace = crate::trace::parse(TRACE.as_bytes()).unwrap().value;
        let warned = analyze(&trace, &AnalyzerConfig::standard()).unwrap();
        let analysis = warned.value;
        // Only the weight is a parameter, numbered from 0.
        let params: Vec<(usize, Vec<i64>, u64)> = analysis
            .parameters
            .iter()
            .map(|p| (p.index, p.shape.clone(), p.bytes.get()))
            .collect();
        assert_eq!(params, [(0, vec![4, 4], 64)]);
        assert_eq!(
            roles_by_size(&analysis.blocks),
            [
                (32, BlockRole::Other),
                (400, BlockRole::Other),
                (64, BlockRole::Gradient { param: 0 }),
                (32, BlockRole::Other),
            ]
        );
        assert!(warned
            .warnings
            .iter()
            .any(|w| w.code == "gradient_of_a_leaf_activation"));
    }

    /// The same leaf's gradient kept past the step (set_to_none=False, or a
    /// tensor the job keeps) is a parameter's, as before.
    #[test]
    fn a_gradient_kept_past_the_step_stays_a_parameters() {
        let kept = TRACE.replace(
            r#""ts": 660, "args": {"Bytes": -32, "Addr": 21"#,
            r#""ts": 1106, "args": {"Bytes": -32, "Addr": 21"#,
        );
        let trace = crate::trace::parse(kept.as_bytes()).unwrap().value;
        let analysis = analyze(&trace, &AnalyzerConfig::standard()).unwrap().value;
        let shapes: Vec<Vec<i64>> = analysis
            .parameters
            .iter()
            .map(|p| p.shape.clone())
            .collect();
        assert_eq!(shapes, [vec![2, 4], vec![4, 4]]);
    }
}
