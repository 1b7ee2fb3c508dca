//! The orchestration rules, one function each.
//!
//! A CPU trace is evidence of tensor sizes and lifetimes, not of what a CUDA
//! run holds: parameters, buffers and constructor-built optimizer state were
//! allocated before profiling; oneDNN scratch, the data loader's work and the
//! optimizer's step counters live in host memory on a CUDA run; and CUDA runs
//! the multi-tensor optimizer path. Each rule below turns one of these
//! differences into blocks of the schedule; [`RULES`] lists them by name.

use std::collections::BTreeMap;

use super::schedule::{
    BlockId, Category, EventKind, IterationSpan, Phase, PhaseWindow, Schedule, ScheduleEvent,
    ScheduledBlock,
};
use super::{OptimizerPath, OrchestrationFacts, OrchestratorConfig, RuleCount};
use crate::analyzer::{self, Analysis, Block, BlockRole};
use crate::diag::Warning;
use crate::units::{Bytes, Nanos};

/// A rule's name and what it does, for documentation and the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub name: &'static str,
    pub summary: &'static str,
}

/// Every rule, in the order they apply.
pub const RULES: &[Rule] = &[
    Rule {
        name: "parameters",
        summary: "one persistent block per parameter inferred from AccumulateGrad shapes, allocated first, in module order, as model.to(device) does",
    },
    Rule {
        name: "batchnorm_buffers",
        summary: "running_mean, running_var (the BatchNorm weight's shape and dtype) and num_batches_tracked (8 bytes) of every BatchNorm layer, allocated after its parameters",
    },
    Rule {
        name: "constructor_optimizer_state",
        summary: "state built in the optimizer constructor before profiling (Adagrad's sum, one block per parameter) added by calculation",
    },
    Rule {
        name: "other_device",
        summary: "only blocks of the profiled device are kept: CPU blocks of a CPU trace, CUDA blocks of a CUDA trace (its CPU blocks are host memory)",
    },
    Rule {
        name: "cpu_scratch",
        summary: "operator-internal blocks of CPU-only kernels (oneDNN/mkldnn weight reorders, flagged by the analyzer) are dropped",
    },
    Rule {
        name: "host_data_loading",
        summary: "blocks the DataLoader allocates and frees inside __next__ live in host memory on a CUDA run and are dropped; the batch tensors are kept",
    },
    Rule {
        name: "host_step_counters",
        summary: "scalar optimizer step counters (at most 8 bytes) of torch.optim optimizers stay on the host unless capturable or fused, and are dropped",
    },
    Rule {
        name: "activations",
        summary: "other forward and backward blocks keep their CPU lifetimes; blocks freed inside the op or optimizer step that made them are temporaries",
    },
    Rule {
        name: "gradients",
        summary: "a gradient lives until the zero_grad that frees it: a captured free outside zero_grad is moved to the next zero_grad; with set_to_none=False gradients are never freed",
    },
    Rule {
        name: "batch_handover",
        summary: "a batch lives until just after the next batch is loaded, so both are briefly alive, and never past the next iteration's data loading",
    },
    Rule {
        name: "foreach_optimizer",
        summary: "torch.optim optimizers left at their default run the foreach path on CUDA: the captured per-tensor step temporaries are replaced by whole lists of parameter-sized temporaries alive until the step ends",
    },
    Rule {
        name: "iterations",
        summary: "simulate the requested number of iterations (default 3): later iterations repeat the last captured one, which is in steady state",
    },
    Rule {
        name: "cublas_workspaces",
        summary: "one cuBLAS workspace per thread and stream, allocated through the caching allocator at the first forward (main thread) and backward (autograd thread) of the run",
    },
];

/// Optimizers whose state builds in the constructor, so the trace has none of it.
const CONSTRUCTOR_STATE_OPTIMIZERS: &[&str] = &["Adagrad"];

/// torch.optim optimizers whose step counter is a host scalar by default.
const HOST_STEP_OPTIMIZERS: &[&str] = &[
    "Adam",
    "AdamW",
    "Adagrad",
    "RMSprop",
    "NAdam",
    "RAdam",
    "Adamax",
    "ASGD",
    "Adadelta",
    "Adafactor",
    "Rprop",
];

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

/// Orders events that share a time: setup and moved frees first (group 0),
/// then trace events in trace order (group 1), then synthetic blocks (group 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub time: Nanos,
    pub group: u8,
    pub rank: u64,
}

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
}

/// Maps the analyzer's phase to the schedule's.
pub(crate) fn phase_of(phase: analyzer::Phase) -> Phase {
    match phase {
        analyzer::Phase::DataLoading => Phase::DataLoading,
        analyzer::Phase::ZeroGrad => Phase::ZeroGrad,
        analyzer::Phase::Forward => Phase::Forward,
        analyzer::Phase::Backward => Phase::Backward,
        analyzer::Phase::OptimizerStep => Phase::OptimizerStep,
        analyzer::Phase::Other => Phase::Other,
    }
}

fn setup_key(rank: u64) -> Key {
    Key {
        time: Nanos::ZERO,
        group: 0,
        rank,
    }
}

fn name_of(analysis: &Analysis, id: Option<crate::trace::NameId>) -> Option<String> {
    id.map(|id| analysis.name(id).to_owned())
        .filter(|name| !name.is_empty())
}

/// The class part of a module path's last component: `A_0/BatchNorm2d_3` → `BatchNorm2d`.
fn module_class(layer: &str) -> &str {
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
pub(crate) fn rule_parameters(analysis: &Analysis) -> Vec<Item> {
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
            alloc: setup_key(items.len() as u64),
            free: None,
            source: None,
        });
        if let Some(after) = buffers.get(&position) {
            for buffer in after {
                let mut buffer = buffer.clone();
                buffer.alloc = setup_key(items.len() as u64);
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
pub(crate) fn rule_batchnorm_buffers(analysis: &Analysis) -> BTreeMap<usize, Vec<Item>> {
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
                alloc: setup_key(0),
                free: None,
                source: None,
            });
        }
    }
    out
}

/// Rule `constructor_optimizer_state`: Adagrad builds `sum` (one tensor per
/// parameter, its shape and dtype) in its constructor, before profiling, so the
/// trace has no persistent block in the first step. Its `step` is a host scalar.
pub(crate) fn rule_constructor_state(analysis: &Analysis, first_rank: u64) -> Vec<Item> {
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
            alloc: setup_key(first_rank + i as u64),
            free: None,
            source: None,
        })
        .collect()
}

/// Rule `other_device`: a GPU trace's CPU blocks are host memory; a CPU
/// trace's blocks stand for the GPU run's. GPU blocks are CUDA or HIP (ROCm
/// builds use the same caching allocator).
pub(crate) fn rule_other_device(analysis: &Analysis, block: &Block) -> bool {
    if analysis.devices.recorded_on_cuda {
        !block.device.is_gpu()
    } else {
        block.device != crate::trace::Device::Cpu
    }
}

/// Rule `cpu_scratch`: oneDNN/mkldnn operator-internal blocks have no CUDA
/// counterpart (the analyzer flags them by op-name prefix).
pub(crate) fn rule_cpu_scratch(block: &Block) -> bool {
    block.cpu_scratch
}

/// Rule `host_data_loading`: everything the DataLoader's `__next__` allocates
/// except the batch is host memory on a CUDA run.
pub(crate) fn rule_host_data_loading(block: &Block) -> bool {
    block.alloc_phase == analyzer::Phase::DataLoading && block.role != BlockRole::Batch
}

/// Rule `host_step_counters`: `torch.optim` optimizers keep `state["step"]`
/// as a host scalar unless `capturable` or `fused` is set.
pub(crate) fn rule_host_step_counters(analysis: &Analysis, block: &Block) -> bool {
    let torch_optim = analysis.optimizer.torch_optim != Some(false);
    let host_step = analysis
        .optimizer
        .class_name
        .as_deref()
        .is_some_and(|class| HOST_STEP_OPTIMIZERS.contains(&class));
    torch_optim && host_step && block.role == BlockRole::OptimizerState && block.size <= Bytes(8)
}

/// Rule `activations` (and the categories of captured blocks): roles from the
/// analyzer; other blocks are temporaries when freed inside the op or the
/// optimizer step that made them, activations otherwise.
pub(crate) fn category_of(block: &Block) -> Category {
    match block.role {
        BlockRole::Gradient { .. } => Category::Gradient,
        BlockRole::OptimizerState => Category::OptimizerState,
        BlockRole::Batch => Category::Batch,
        BlockRole::Other => {
            let step_temporary = block.alloc_phase == analyzer::Phase::OptimizerStep
                && block.free_phase == Some(analyzer::Phase::OptimizerStep)
                && block.free_iteration == block.alloc_iteration;
            if block.op_internal || step_temporary {
                Category::Temporary
            } else {
                Category::Activation
            }
        }
    }
}

/// The simulated iterations: which captured iteration each repeats, and the
/// time shift of the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IterationPlan {
    /// `(simulated index, captured index, offset)`.
    pub copies: Vec<(u32, usize, Nanos)>,
    /// Blocks allocated at or after this time are not simulated (fewer
    /// iterations than captured).
    pub cut: Option<Nanos>,
    /// The captured iteration that is repeated and its period.
    pub repeated: Option<(usize, Nanos)>,
}

/// Rule `iterations`: plans `wanted` iterations from the captured ones.
/// Repeating needs two captured steady-state iterations (the last two) with
/// the same allocation sizes in the same order; otherwise only the captured
/// iterations are simulated.
pub(crate) fn plan_iterations(
    analysis: &Analysis,
    wanted: u32,
    warnings: &mut Vec<Warning>,
) -> IterationPlan {
    let captured = analysis.iterations.len();
    let wanted_usize = wanted as usize;
    let mut copies: Vec<(u32, usize, Nanos)> = (0..captured.min(wanted_usize))
        .map(|i| (i as u32, i, Nanos::ZERO))
        .collect();
    if wanted_usize <= captured {
        let cut = analysis.iterations.get(wanted_usize).map(|it| it.start);
        return IterationPlan {
            copies,
            cut,
            repeated: None,
        };
    }
    let steady = captured
        .checked_sub(1)
        .zip(captured.checked_sub(2))
        .filter(|&(last, previous)| previous >= 1 && same_allocations(analysis, previous, last));
    let Some((last, previous)) = steady else {
        if captured > 0 {
            warnings.push(Warning::new(
                "iterations_not_repeated",
                format!(
                    "{wanted} iterations were asked for but the trace has {captured} and no two steady-state iterations that match, so only the captured ones are simulated; profile at least 3 iterations"
                ),
            ));
        }
        return IterationPlan {
            copies,
            cut: None,
            repeated: None,
        };
    };
    let (Some(last_it), Some(previous_it)) = (
        analysis.iterations.get(last),
        analysis.iterations.get(previous),
    ) else {
        return IterationPlan {
            copies,
            cut: None,
            repeated: None,
        };
    };
    // Copies follow each other without overlap: the repeated iteration's
    // length plus the gap that separated it from the one before.
    let gap = last_it.start.saturating_sub(previous_it.end).max(Nanos(1));
    let period = last_it
        .end
        .saturating_sub(last_it.start)
        .saturating_add(gap);
    for k in 1..=(wanted_usize - captured) {
        let offset = Nanos(period.get().saturating_mul(k as i64));
        copies.push(((last + k) as u32, last, offset));
    }
    warnings.push(Warning::new(
        "iterations_repeated",
        format!(
            "{captured} iterations were captured; iterations {captured} to {} repeat captured iteration {last}",
            wanted - 1
        ),
    ));
    IterationPlan {
        copies,
        cut: None,
        repeated: Some((last, period)),
    }
}

fn allocations_of(analysis: &Analysis, iteration: usize) -> Vec<&Block> {
    analysis
        .blocks
        .iter()
        .filter(|b| b.alloc_iteration == Some(iteration))
        .collect()
}

fn same_allocations(analysis: &Analysis, a: usize, b: usize) -> bool {
    let first = allocations_of(analysis, a);
    let second = allocations_of(analysis, b);
    first.len() == second.len()
        && !first.is_empty()
        && first.iter().zip(&second).all(|(x, y)| x.size == y.size)
}

/// A phase interval of a simulated iteration, shifted to the schedule clock.
fn spans(analysis: &Analysis, plan: &IterationPlan) -> Vec<(u32, Phase, Nanos, Nanos)> {
    let mut out = Vec::new();
    for &(sim, source, offset) in &plan.copies {
        let Some(iteration) = analysis.iterations.get(source) else {
            continue;
        };
        for span in &iteration.phases {
            out.push((
                sim,
                phase_of(span.phase),
                span.start.saturating_add(offset),
                span.end.saturating_add(offset),
            ));
        }
    }
    out.sort_by_key(|&(sim, _, start, _)| (start, sim));
    out
}

/// Builds the trace-derived items for every simulated iteration, applying the
/// drop rules, the categories and the iteration plan. Returns the items and
/// per-rule drop counts.
pub(crate) fn captured_items(
    analysis: &Analysis,
    plan: &IterationPlan,
) -> (Vec<Item>, BTreeMap<&'static str, u32>) {
    let mut dropped: BTreeMap<&'static str, u32> = BTreeMap::new();
    let keep = |block: &Block, dropped: &mut BTreeMap<&'static str, u32>| {
        let rule = if rule_other_device(analysis, block) {
            Some("other_device")
        } else if rule_cpu_scratch(block) {
            Some("cpu_scratch")
        } else if rule_host_data_loading(block) {
            Some("host_data_loading")
        } else if rule_host_step_counters(analysis, block) {
            Some("host_step_counters")
        } else {
            None
        };
        if let Some(rule) = rule {
            *dropped.entry(rule).or_default() += 1;
            false
        } else {
            true
        }
    };
    // Correspondence of the repeated iteration's blocks with the previous
    // iteration's, for the frees that happen one iteration later.
    let mut next_free: BTreeMap<usize, (Nanos, usize)> = BTreeMap::new();
    if let Some((last, _)) = plan.repeated {
        let previous = allocations_of(analysis, last.saturating_sub(1));
        let current = allocations_of(analysis, last);
        for (p, c) in previous.iter().zip(&current) {
            if let (Some(ts), Some(event)) = (p.free_ts, p.free_event) {
                if c.free_ts.is_none() {
                    next_free.insert(c.id, (ts, event));
                }
            }
        }
    }
    let copies_of_last = plan
        .copies
        .iter()
        .filter(|(_, source, _)| Some(*source) == plan.repeated.map(|r| r.0))
        .count();
    let mut items = Vec::new();
    for &(sim, source, offset) in &plan.copies {
        let copy = plan
            .repeated
            .filter(|&(last, _)| last == source)
            .map_or(0, |(_, period)| {
                if period.get() > 0 {
                    (offset.get() / period.get()) as u64
                } else {
                    0
                }
            });
        let rank_base = copy << 32;
        for block in analysis
            .blocks
            .iter()
            .filter(|b| b.alloc_iteration == Some(source))
        {
            if !keep(block, &mut dropped) {
                continue;
            }
            let own_free = block.free_ts.zip(block.free_event).and_then(|(ts, event)| {
                if plan.cut.is_some_and(|cut| ts >= cut) {
                    None
                } else {
                    Some(Key {
                        time: ts.saturating_add(offset),
                        group: 1,
                        rank: rank_base | event as u64,
                    })
                }
            });
            let free = own_free.or_else(|| {
                let (ts, event) = next_free.get(&block.id)?;
                let next_copy = copy + 1;
                if next_copy as usize >= copies_of_last {
                    return None;
                }
                let (_, period) = plan.repeated?;
                Some(Key {
                    time: ts.saturating_add(Nanos(period.get().saturating_mul(next_copy as i64))),
                    group: 1,
                    rank: (next_copy << 32) | *event as u64,
                })
            });
            items.push(item_of(analysis, block, Some(sim), offset, rank_base, free));
        }
    }
    // Blocks outside every iteration keep their captured times; when the last
    // iteration is repeated, those after it would collide with the copies and
    // are left out.
    let last_end = analysis.iterations.last().map(|it| it.end);
    for block in analysis
        .blocks
        .iter()
        .filter(|b| b.alloc_iteration.is_none())
    {
        let after_last =
            plan.repeated.is_some() && last_end.is_some_and(|end| block.alloc_ts > end);
        if after_last
            || plan.cut.is_some_and(|cut| block.alloc_ts >= cut)
            || !keep(block, &mut dropped)
        {
            continue;
        }
        let free = block.free_ts.zip(block.free_event).and_then(|(ts, event)| {
            plan.cut.is_none_or(|cut| ts < cut).then_some(Key {
                time: ts,
                group: 1,
                rank: event as u64,
            })
        });
        items.push(item_of(analysis, block, None, Nanos::ZERO, 0, free));
    }
    (items, dropped)
}

fn item_of(
    analysis: &Analysis,
    block: &Block,
    iteration: Option<u32>,
    offset: Nanos,
    rank_base: u64,
    free: Option<Key>,
) -> Item {
    Item {
        size: block.size,
        category: category_of(block),
        iteration,
        phase: phase_of(block.alloc_phase),
        op: name_of(analysis, block.alloc_op_name),
        layer: name_of(analysis, block.layer),
        alloc: Key {
            time: block.alloc_ts.saturating_add(offset),
            group: 1,
            rank: rank_base | block.alloc_event as u64,
        },
        free,
        source: Some(block.id),
    }
}

/// Rule `gradients`: a gradient lives until the `zero_grad` that frees it. A
/// captured free that is not inside a `zero_grad` span is moved to the start of
/// the next `zero_grad` after the allocation (never freed when there is none).
/// Returns how many frees moved.
pub(crate) fn rule_gradients(items: &mut [Item], zero_grads: &[(Nanos, Nanos)]) -> u32 {
    let mut moved = 0;
    for item in items
        .iter_mut()
        .filter(|i| i.category == Category::Gradient)
    {
        let Some(free) = item.free else {
            continue;
        };
        let inside = zero_grads
            .iter()
            .any(|&(start, end)| start <= free.time && free.time <= end);
        if inside {
            continue;
        }
        let next = zero_grads
            .iter()
            .map(|&(start, _)| start)
            .find(|&start| start > item.alloc.time);
        item.free = next.map(|time| Key {
            time,
            group: 0,
            rank: item.alloc.rank,
        });
        moved += 1;
    }
    moved
}

/// Rule `batch_handover`: a batch is freed just after the next batch is
/// loaded (the loop rebinds its variables), so both are alive at the
/// hand-over, and it never outlives that point: a free after the next
/// iteration's first phase after data loading (or a missing free) is moved
/// there. `loads` are `(iteration, deadline)`. Returns how many moved.
pub(crate) fn rule_batch_handover(items: &mut [Item], loads: &[(u32, Nanos)]) -> u32 {
    let mut moved = 0;
    for item in items.iter_mut().filter(|i| i.category == Category::Batch) {
        let Some(iteration) = item.iteration else {
            continue;
        };
        let Some(&(_, end)) = loads.iter().find(|(i, _)| *i == iteration + 1) else {
            continue;
        };
        if item.free.is_none_or(|free| free.time > end) {
            item.free = Some(Key {
                time: end,
                group: 2,
                rank: item.alloc.rank,
            });
            moved += 1;
        }
    }
    moved
}

/// Rule `foreach_optimizer`: in each optimizer step, drops the captured
/// per-tensor temporaries and adds the foreach path's lists: one block per
/// parameter per list, allocated after the step's state creation and freed
/// when the step ends. `steps` are `(iteration, start, end)`. Returns
/// `(dropped, added)`.
pub(crate) fn rule_foreach(
    items: &mut Vec<Item>,
    steps: &[(u32, Nanos, Nanos)],
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
    for &(iteration, start, end) in steps {
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
                let alloc = Key {
                    time: state_done,
                    group: 2,
                    rank,
                };
                let free = Key {
                    time: end.max(state_done),
                    group: 2,
                    rank: (1 << 40) | rank,
                };
                items.push(Item {
                    size: *size,
                    category: Category::Temporary,
                    iteration: Some(iteration),
                    phase: Phase::OptimizerStep,
                    op: Some((*op).to_owned()),
                    layer: layer.clone(),
                    alloc,
                    free: Some(free),
                    source: None,
                });
                rank += 1;
                added += 1;
            }
        }
    }
    (dropped, added)
}

/// CPU ops whose CUDA counterparts call cuBLAS (matrix products). The
/// allocation of their output marks the first cuBLAS call of a thread.
pub const CUBLAS_OPS: &[&str] = &[
    "aten::addmm",
    "aten::mm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::addbmm",
    "aten::addmv",
    "aten::mv",
    "aten::dot",
    "aten::_addmm_activation",
];

/// Rule `cublas_workspaces`: one workspace block (sized per GPU at simulation
/// time) for the main thread, at the first allocation of a matrix-product op in
/// the forward pass of the first iteration, and one for the autograd thread at
/// the first one in its backward pass. Without a matrix product in a pass, the
/// workspace goes to the pass's start (cuBLAS is still loaded by the first
/// `Linear` or `matmul` of most models). Items sort after the op's output
/// allocation at the same key.
pub(crate) fn rule_cublas_workspaces(items: &[Item], passes: [Option<Nanos>; 2]) -> Vec<Item> {
    let mut out = Vec::new();
    for (index, (phase, start)) in [Phase::Forward, Phase::Backward]
        .into_iter()
        .zip(passes)
        .enumerate()
    {
        let first_product = items
            .iter()
            .filter(|i| {
                i.iteration == Some(0)
                    && i.phase == phase
                    && i.source.is_some()
                    && i.op.as_deref().is_some_and(|op| CUBLAS_OPS.contains(&op))
            })
            .map(|i| i.alloc)
            .min();
        let fallback = start.map(|time| Key {
            time,
            group: 0,
            rank: index as u64,
        });
        let Some(alloc) = first_product.or(fallback) else {
            continue;
        };
        out.push(Item {
            size: Bytes::ZERO,
            category: Category::Workspace,
            iteration: Some(0),
            phase,
            op: Some("cuBLAS workspace".to_owned()),
            layer: None,
            alloc,
            free: None,
            source: None,
        });
    }
    out
}

/// Turns items into a schedule: blocks in allocation order, events sorted by
/// key (an allocation before its own free when they tie).
pub(crate) fn into_schedule(mut items: Vec<Item>, iterations: Vec<IterationSpan>) -> Schedule {
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
        });
    }
    events.sort_by_key(|&(key, kind, event)| (key, kind, event.block));
    Schedule {
        blocks,
        events: events.into_iter().map(|(_, _, event)| event).collect(),
        iterations,
        phases: Vec::new(),
    }
}

/// Applies every rule in [`RULES`] order.
pub(crate) fn apply_all(
    analysis: &Analysis,
    config: &OrchestratorConfig,
    warnings: &mut Vec<Warning>,
) -> (Schedule, OrchestrationFacts) {
    let mut counts: BTreeMap<&'static str, u32> = BTreeMap::new();

    // Setup: parameters, buffers, constructor-built optimizer state.
    let mut items = rule_parameters(analysis);
    let n_parameters = analysis.parameters.len();
    let parameter_bytes: Bytes = analysis.parameters.iter().map(|p| p.bytes).sum();
    let buffer_items: Vec<&Item> = items
        .iter()
        .filter(|i| i.category == Category::Buffer)
        .collect();
    let buffer_bytes: Bytes = buffer_items.iter().map(|i| i.size).sum();
    counts.insert("parameters", n_parameters as u32);
    counts.insert("batchnorm_buffers", buffer_items.len() as u32);
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
    counts.insert("constructor_optimizer_state", constructor.len() as u32);
    items.extend(constructor);

    // Captured blocks over the planned iterations.
    let plan = plan_iterations(analysis, config.iterations, warnings);
    let (captured, dropped) = captured_items(analysis, &plan);
    for (rule, count) in dropped {
        counts.insert(rule, count);
    }
    items.extend(captured);
    let phase_spans = spans(analysis, &plan);

    let zero_grads: Vec<(Nanos, Nanos)> = phase_spans
        .iter()
        .filter(|s| s.1 == Phase::ZeroGrad)
        .map(|s| (s.2, s.3))
        .collect();
    counts.insert("gradients", rule_gradients(&mut items, &zero_grads));
    if analysis.zero_grad.set_to_none == Some(false) {
        warnings.push(Warning::new(
            "gradients_kept",
            "zero_grad(set_to_none=False) was captured: gradients stay allocated across iterations",
        ));
    }

    let mut loads: Vec<(u32, Nanos)> = Vec::new();
    for &(sim, phase, _, end) in &phase_spans {
        if phase == Phase::DataLoading && !loads.iter().any(|(i, _)| *i == sim) {
            // The deadline: the start of the iteration's next phase.
            let next = phase_spans
                .iter()
                .filter(|s| s.0 == sim && s.1 != Phase::DataLoading && s.2 >= end)
                .map(|s| s.2)
                .min()
                .unwrap_or(end);
            loads.push((sim, next));
        }
    }
    counts.insert("batch_handover", rule_batch_handover(&mut items, &loads));

    let foreach_modelled = apply_foreach(
        analysis,
        config,
        &phase_spans,
        &mut items,
        &mut counts,
        warnings,
    );

    let first = |phase: Phase| {
        phase_spans
            .iter()
            .filter(|s| s.1 == phase)
            .map(|s| s.2)
            .min()
    };
    let start_of_first_iteration = plan
        .copies
        .first()
        .and_then(|c| analysis.iterations.get(c.1))
        .map(|it| it.start);
    let workspaces = rule_cublas_workspaces(
        &items,
        [
            first(Phase::Forward).or(start_of_first_iteration),
            first(Phase::Backward),
        ],
    );
    counts.insert("cublas_workspaces", workspaces.len() as u32);
    items.extend(workspaces);
    warnings.push(Warning::new(
        "cudnn_workspace_not_modelled",
        "cuDNN convolution workspaces are transient and depend on the algorithm cuDNN picks on the GPU; they are not in a CPU trace and are not modelled",
    ));

    let iterations: Vec<IterationSpan> = plan
        .copies
        .iter()
        .filter_map(|&(sim, source, offset)| {
            let it = analysis.iterations.get(source)?;
            Some(IterationSpan {
                index: sim,
                source: source as u32,
                start: it.start.saturating_add(offset),
                end: it.end.saturating_add(offset),
            })
        })
        .collect();
    let facts = OrchestrationFacts {
        iterations_captured: analysis.iterations.len() as u32,
        iterations_simulated: plan.copies.len() as u32,
        foreach_modelled,
        rule_counts: RULES
            .iter()
            .filter_map(|rule| {
                counts.get(rule.name).map(|&blocks| RuleCount {
                    rule: rule.name.to_owned(),
                    blocks,
                })
            })
            .collect(),
    };
    let mut schedule = into_schedule(items, iterations);
    schedule.phases = phase_spans
        .iter()
        .map(|&(iteration, phase, start, end)| PhaseWindow {
            iteration,
            phase,
            start,
            end,
        })
        .collect();
    (schedule, facts)
}

/// Decides whether the foreach rule applies and applies it.
fn apply_foreach(
    analysis: &Analysis,
    config: &OrchestratorConfig,
    phase_spans: &[(u32, Phase, Nanos, Nanos)],
    items: &mut Vec<Item>,
    counts: &mut BTreeMap<&'static str, u32>,
    warnings: &mut Vec<Warning>,
) -> bool {
    let optimizer = &analysis.optimizer;
    let Some(class) = optimizer.class_name.as_deref() else {
        return false;
    };
    if config.optimizer_path == OptimizerPath::Captured {
        warnings.push(Warning::new(
            "optimizer_as_captured",
            format!("the {class} step is simulated as captured, as asked"),
        ));
        return false;
    }
    if optimizer.uses_foreach {
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
    let steps: Vec<(u32, Nanos, Nanos)> = phase_spans
        .iter()
        .filter(|s| s.1 == Phase::OptimizerStep)
        .map(|s| (s.0, s.2, s.3))
        .collect();
    let parameters: Vec<(Bytes, Option<String>)> = analysis
        .parameters
        .iter()
        .map(|p| (p.bytes, name_of(analysis, p.layer)))
        .collect();
    let (dropped, added) = rule_foreach(items, &steps, lists, &parameters);
    counts.insert("foreach_optimizer", added);
    warnings.push(Warning::new(
        "optimizer_foreach_modelled",
        format!(
            "CUDA runs torch.optim.{class} with foreach=True by default: {dropped} captured per-tensor step temporaries were replaced by {} parameter-sized temporary list(s) per step; use the captured-optimizer option to keep the captured step",
            lists.len()
        ),
    ));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyzer::{
        DeviceSummary, Iteration, OptimizerFacts, Parameter, PhaseSpan, ZeroGradFacts,
    };
    use crate::orchestrator::{orchestrate, OptimizerPath};
    use crate::trace::{Device, NameId};
    use analyzer::Phase as P;

    /// A hand-built analysis of a tiny training loop: two parameters (a
    /// Linear weight of 4,000 bytes and a BatchNorm weight and bias of 40
    /// bytes each), three iterations of 1,000 ns:
    /// data loading [0,100) → zero_grad [100,150) → forward [150,400) →
    /// backward [400,700) → optimizer step [700,900).
    struct Loop {
        analysis: Analysis,
        next_event: usize,
    }

    const PERIOD: i64 = 1_000;

    impl Loop {
        fn new(optimizer: &str) -> Loop {
            let names = vec![
                "M_0/Linear_0".to_owned(),
                "M_0/BatchNorm2d_0".to_owned(),
                "aten::mkldnn_convolution".to_owned(),
                "aten::mul".to_owned(),
            ];
            let parameter = |index: usize, bytes: u64, layer: u32| Parameter {
                index,
                shape: vec![(bytes / 4) as i64],
                numel: bytes / 4,
                dtype: Some("float".to_owned()),
                bytes: Bytes(bytes),
                layer: Some(NameId(layer)),
            };
            let iterations = (0..3)
                .map(|i| {
                    let base = i * PERIOD;
                    let span = |phase, start: i64, end: i64| PhaseSpan {
                        phase,
                        start: Nanos(base + start),
                        end: Nanos(base + end),
                    };
                    Iteration {
                        index: i as usize,
                        label: Some(format!("ProfilerStep#{i}")),
                        start: Nanos(base),
                        end: Nanos(base + 999),
                        phases: vec![
                            span(P::DataLoading, 0, 100),
                            span(P::ZeroGrad, 100, 150),
                            span(P::Forward, 150, 400),
                            span(P::Backward, 400, 700),
                            span(P::OptimizerStep, 700, 900),
                        ],
                        zero_grad: None,
                        allocated_by_phase: BTreeMap::new(),
                        n_allocs: 0,
                        n_frees: 0,
                        peak: Bytes::ZERO,
                    }
                })
                .collect();
            Loop {
                analysis: Analysis {
                    origin: Nanos::ZERO,
                    names,
                    events: Vec::new(),
                    blocks: Vec::new(),
                    unmatched_frees: Vec::new(),
                    ops: Vec::new(),
                    iterations,
                    parameters: vec![
                        parameter(0, 4_000, 0),
                        parameter(1, 40, 1),
                        parameter(2, 40, 1),
                    ],
                    parameter_totals: Default::default(),
                    zero_grad: ZeroGradFacts {
                        n_calls: 3,
                        placement: None,
                        set_to_none: Some(true),
                    },
                    optimizer: OptimizerFacts {
                        class_name: Some(optimizer.to_owned()),
                        n_steps: 3,
                        uses_foreach: false,
                        torch_optim: Some(true),
                        n_state_blocks: 0,
                        state_bytes: Bytes::ZERO,
                    },
                    devices: DeviceSummary::default(),
                    peak: Default::default(),
                    layers_at_peak: Vec::new(),
                    batch_size: None,
                },
                next_event: 0,
            }
        }

        /// Adds a block allocated at `iteration`'s `alloc` offset and freed at
        /// the absolute time `free`.
        fn block(
            &mut self,
            iteration: usize,
            alloc: i64,
            free: Option<i64>,
            size: u64,
            phase: P,
            role: BlockRole,
        ) -> usize {
            let id = self.analysis.blocks.len();
            let alloc_ts = Nanos(iteration as i64 * PERIOD + alloc);
            let alloc_event = self.next_event;
            self.next_event += 2;
            let free_phase = free.map(|t| {
                let offset = t.rem_euclid(PERIOD);
                match offset {
                    0..100 => P::DataLoading,
                    100..150 => P::ZeroGrad,
                    150..400 => P::Forward,
                    400..700 => P::Backward,
                    700..900 => P::OptimizerStep,
                    _ => P::Other,
                }
            });
            self.analysis.blocks.push(Block {
                id,
                addr: 4096 * id as u64,
                size: Bytes(size),
                device: Device::Cpu,
                alloc_ts,
                free_ts: free.map(Nanos),
                alloc_event,
                free_event: free.map(|_| alloc_event + 1),
                alloc_op: None,
                alloc_op_name: Some(NameId(3)),
                free_op: None,
                free_op_name: None,
                layer: Some(NameId(0)),
                alloc_iteration: Some(iteration),
                alloc_phase: phase,
                free_iteration: free.map(|t| (t / PERIOD) as usize),
                free_phase,
                op_internal: false,
                internal_to: None,
                cpu_scratch: false,
                role,
            });
            id
        }

        /// A steady loop: per iteration a batch (freed after the next
        /// load), an activation, a CPU scratch block, a gradient per
        /// parameter (freed in the next zero_grad) and one step temporary
        /// per parameter; the optimizer state (one block per parameter plus
        /// a 4-byte step counter) in the first step.
        fn training(optimizer: &str) -> Loop {
            let mut lp = Loop::new(optimizer);
            for i in 0..3usize {
                let next = |offset: i64| (i < 2).then_some((i as i64 + 1) * PERIOD + offset);
                lp.block(i, 50, next(60), 64, P::DataLoading, BlockRole::Batch);
                lp.block(
                    i,
                    60,
                    Some(i as i64 * PERIOD + 70),
                    32,
                    P::DataLoading,
                    BlockRole::Other,
                );
                lp.block(
                    i,
                    200,
                    Some(i as i64 * PERIOD + 600),
                    10_000,
                    P::Forward,
                    BlockRole::Other,
                );
                let scratch = lp.block(
                    i,
                    210,
                    Some(i as i64 * PERIOD + 220),
                    777,
                    P::Forward,
                    BlockRole::Other,
                );
                lp.analysis.blocks[scratch].cpu_scratch = true;
                lp.analysis.blocks[scratch].op_internal = true;
                for (param, size) in [(0usize, 4_000u64), (1, 40), (2, 40)] {
                    lp.block(
                        i,
                        500 + param as i64,
                        next(120),
                        size,
                        P::Backward,
                        BlockRole::Gradient { param },
                    );
                }
                if i == 0 {
                    for size in [4_000u64, 40, 40] {
                        lp.block(
                            0,
                            710,
                            None,
                            size,
                            P::OptimizerStep,
                            BlockRole::OptimizerState,
                        );
                        lp.block(0, 711, None, 4, P::OptimizerStep, BlockRole::OptimizerState);
                    }
                    lp.analysis.optimizer.n_state_blocks = 6;
                }
                // Per-tensor step: one parameter's temporary at a time.
                for (j, size) in [4_000u64, 40, 40].into_iter().enumerate() {
                    let at = 800 + 2 * j as i64;
                    let free = Some(i as i64 * PERIOD + at + 1);
                    lp.block(i, at, free, size, P::OptimizerStep, BlockRole::Other);
                }
            }
            lp
        }
    }

    fn run(analysis: &Analysis, iterations: u32, path: OptimizerPath) -> (Schedule, Vec<Warning>) {
        let config = OrchestratorConfig {
            iterations,
            optimizer_path: path,
        };
        let out = orchestrate(analysis, &config).unwrap();
        out.value.schedule.check().unwrap();
        (out.value.schedule, out.warnings)
    }

    fn blocks_of(schedule: &Schedule, category: Category) -> Vec<(usize, &ScheduledBlock)> {
        schedule
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.category == category)
            .collect()
    }

    fn free_time(schedule: &Schedule, block: usize) -> Option<Nanos> {
        schedule
            .events
            .iter()
            .find(|e| e.kind == EventKind::Free && e.block.index() == block)
            .map(|e| e.time)
    }

    fn live_bytes_at(schedule: &Schedule, time: i64, category: Category) -> u64 {
        let mut live = BTreeMap::new();
        for event in schedule.events.iter().take_while(|e| e.time.get() <= time) {
            match event.kind {
                EventKind::Alloc => {
                    live.insert(event.block, ());
                }
                EventKind::Free => {
                    live.remove(&event.block);
                }
            }
        }
        live.keys()
            .filter_map(|id| schedule.block(*id))
            .filter(|b| b.category == category)
            .map(|b| b.size.get())
            .sum()
    }

    #[test]
    fn parameters_come_first_in_module_order_and_stay() {
        let lp = Loop::training("SGD");
        let (schedule, warnings) = run(&lp.analysis, 3, OptimizerPath::Captured);
        let first: Vec<(Category, u64)> = schedule
            .events
            .iter()
            .take(6)
            .filter_map(|e| schedule.block(e.block))
            .map(|b| (b.category, b.size.get()))
            .collect();
        assert_eq!(
            first,
            vec![
                (Category::Parameter, 4_000),
                (Category::Parameter, 40),
                (Category::Parameter, 40),
                (Category::Buffer, 40),
                (Category::Buffer, 40),
                (Category::Buffer, 8),
            ]
        );
        for (id, _) in blocks_of(&schedule, Category::Parameter) {
            assert_eq!(free_time(&schedule, id), None);
        }
        assert!(warnings.iter().any(|w| w.code == "parameters_inferred"));
    }

    #[test]
    fn module_class_strips_the_instance_counter() {
        assert_eq!(module_class("A_0/Seq_1/BatchNorm2d_13"), "BatchNorm2d");
        assert_eq!(module_class("BatchNorm1d"), "BatchNorm1d");
        assert_eq!(module_class("A_0/my_layer"), "my_layer");
        assert_eq!(module_class("A_0/layer_"), "layer_");
    }

    #[test]
    fn adagrad_state_is_added_only_when_the_trace_lacks_it() {
        let mut lp = Loop::new("Adagrad");
        lp.block(
            0,
            500,
            None,
            4_000,
            P::Backward,
            BlockRole::Gradient { param: 0 },
        );
        let added = rule_constructor_state(&lp.analysis, 10);
        assert_eq!(
            added.iter().map(|i| i.size.get()).collect::<Vec<_>>(),
            vec![4_000, 40, 40]
        );
        assert!(added
            .iter()
            .all(|i| i.category == Category::OptimizerState && i.free.is_none()));
        lp.analysis.optimizer.n_state_blocks = 3;
        assert!(rule_constructor_state(&lp.analysis, 10).is_empty());
        let sgd = Loop::new("SGD");
        assert!(rule_constructor_state(&sgd.analysis, 10).is_empty());
    }

    #[test]
    fn host_and_cpu_only_blocks_are_dropped() {
        let lp = Loop::training("Adam");
        let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
        let sizes: Vec<u64> = schedule.blocks.iter().map(|b| b.size.get()).collect();
        assert!(!sizes.contains(&777), "cpu scratch kept");
        assert!(!sizes.contains(&32), "data loader work kept");
        assert!(!sizes.contains(&4), "host step counters kept");
        // A custom optimizer keeps its small state.
        let mut custom = Loop::training("MyOptimizer");
        custom.analysis.optimizer.torch_optim = Some(false);
        let (schedule, _) = run(&custom.analysis, 3, OptimizerPath::Captured);
        assert_eq!(
            schedule
                .blocks
                .iter()
                .filter(|b| b.size == Bytes(4))
                .count(),
            3
        );
    }

    #[test]
    fn a_cuda_trace_keeps_only_its_cuda_blocks() {
        let mut lp = Loop::training("SGD");
        lp.analysis.devices.recorded_on_cuda = true;
        for block in lp
            .analysis
            .blocks
            .iter_mut()
            .filter(|b| b.size == Bytes(10_000))
        {
            block.device = Device::Cuda;
        }
        let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
        assert_eq!(blocks_of(&schedule, Category::Activation).len(), 3);
        assert!(blocks_of(&schedule, Category::Gradient).is_empty());
    }

    #[test]
    fn a_rocm_trace_keeps_its_hip_blocks() {
        let mut lp = Loop::training("SGD");
        lp.analysis.devices.recorded_on_cuda = true;
        for block in &mut lp.analysis.blocks {
            block.device = Device::Hip;
        }
        let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
        assert_eq!(blocks_of(&schedule, Category::Activation).len(), 3);
        assert_eq!(blocks_of(&schedule, Category::Gradient).len(), 9);
    }

    #[test]
    fn categories_follow_roles_and_lifetimes() {
        let lp = Loop::training("SGD");
        let b = &lp.analysis.blocks;
        assert_eq!(category_of(&b[0]), Category::Batch);
        assert_eq!(category_of(&b[2]), Category::Activation);
        assert_eq!(category_of(&b[3]), Category::Temporary);
        assert_eq!(category_of(&b[4]), Category::Gradient);
        let step_temporary = b
            .iter()
            .find(|x| x.alloc_phase == P::OptimizerStep && x.free_ts.is_some())
            .unwrap();
        assert_eq!(category_of(step_temporary), Category::Temporary);
        let state = b
            .iter()
            .find(|x| x.role == BlockRole::OptimizerState)
            .unwrap();
        assert_eq!(category_of(state), Category::OptimizerState);
    }

    #[test]
    fn gradients_live_until_the_next_zero_grad() {
        let key = |time| Key {
            time: Nanos(time),
            group: 1,
            rank: 0,
        };
        let gradient = |free: Option<i64>| Item {
            size: Bytes(8),
            category: Category::Gradient,
            iteration: Some(0),
            phase: Phase::Backward,
            op: None,
            layer: None,
            alloc: key(500),
            free: free.map(key),
            source: Some(0),
        };
        let zero_grads = [(Nanos(100), Nanos(150)), (Nanos(1_100), Nanos(1_150))];
        // Freed inside zero_grad: kept. Freed early (a CPU-only release): moved
        // to the next zero_grad. Never freed: stays.
        let mut items = vec![gradient(Some(1_120)), gradient(Some(600)), gradient(None)];
        assert_eq!(rule_gradients(&mut items, &zero_grads), 1);
        assert_eq!(items[0].free.map(|k| k.time), Some(Nanos(1_120)));
        assert_eq!(items[1].free.map(|k| k.time), Some(Nanos(1_100)));
        assert_eq!(items[2].free, None);
        // No later zero_grad: the gradient is never freed.
        let mut late = vec![gradient(Some(600))];
        rule_gradients(&mut late, &zero_grads[..1]);
        assert_eq!(late[0].free, None);
    }

    #[test]
    fn set_to_none_false_keeps_gradients_across_iterations() {
        let mut lp = Loop::training("SGD");
        lp.analysis.zero_grad.set_to_none = Some(false);
        // The gradients of the first iteration are never freed, later
        // iterations add into them through temporaries.
        let gradient_blocks: Vec<usize> = lp
            .analysis
            .blocks
            .iter()
            .filter(|b| matches!(b.role, BlockRole::Gradient { .. }))
            .map(|b| b.id)
            .collect();
        for (n, id) in gradient_blocks.into_iter().enumerate() {
            let block = &mut lp.analysis.blocks[id];
            if n < 3 {
                block.free_ts = None;
                block.free_event = None;
            } else {
                block.role = BlockRole::Other;
                block.op_internal = true;
                block.free_ts = Some(block.alloc_ts.saturating_add(Nanos(5)));
                block.free_event = Some(block.alloc_event + 1);
            }
        }
        let (schedule, warnings) = run(&lp.analysis, 3, OptimizerPath::Captured);
        assert!(warnings.iter().any(|w| w.code == "gradients_kept"));
        for iteration in 1..3 {
            // During the forward of iterations 1 and 2 all gradients are live.
            let time = iteration * PERIOD + 300;
            assert_eq!(live_bytes_at(&schedule, time, Category::Gradient), 4_080);
        }
        let set_to_none = Loop::training("SGD");
        let (schedule, _) = run(&set_to_none.analysis, 3, OptimizerPath::Captured);
        // With set_to_none, iteration 1's forward runs without gradients.
        assert_eq!(
            live_bytes_at(&schedule, PERIOD + 300, Category::Gradient),
            0
        );
        assert_eq!(
            live_bytes_at(&schedule, PERIOD + 650, Category::Gradient),
            4_080
        );
    }

    #[test]
    fn a_batch_is_freed_after_the_next_load_at_the_latest() {
        let item = |free: Option<i64>| Item {
            size: Bytes(64),
            category: Category::Batch,
            iteration: Some(0),
            phase: Phase::DataLoading,
            op: None,
            layer: None,
            alloc: Key {
                time: Nanos(50),
                group: 1,
                rank: 0,
            },
            free: free.map(|t| Key {
                time: Nanos(t),
                group: 1,
                rank: 1,
            }),
            source: Some(0),
        };
        let loads = [(0, Nanos(100)), (1, Nanos(1_100))];
        let mut items = vec![item(Some(1_101)), item(None), item(Some(1_050))];
        assert_eq!(rule_batch_handover(&mut items, &loads), 2);
        assert_eq!(items[0].free.map(|k| k.time), Some(Nanos(1_100)));
        assert_eq!(items[1].free.map(|k| k.time), Some(Nanos(1_100)));
        assert_eq!(items[2].free.map(|k| k.time), Some(Nanos(1_050)));
        // Both batches are alive at the hand-over in the orchestrated loop.
        let lp = Loop::training("SGD");
        let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
        assert_eq!(live_bytes_at(&schedule, PERIOD + 55, Category::Batch), 128);
        assert_eq!(live_bytes_at(&schedule, PERIOD + 65, Category::Batch), 64);
    }

    #[test]
    fn foreach_replaces_per_tensor_step_temporaries_with_lists() {
        let lp = Loop::training("Adam");
        let (captured, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
        let (foreach, warnings) = run(&lp.analysis, 3, OptimizerPath::CudaDefault);
        assert!(warnings
            .iter()
            .any(|w| w.code == "optimizer_foreach_modelled"));
        let step = |schedule: &Schedule| -> Vec<(Option<u32>, u64, Option<String>)> {
            blocks_of(schedule, Category::Temporary)
                .into_iter()
                .filter(|(_, b)| b.phase == Phase::OptimizerStep)
                .map(|(_, b)| (b.iteration, b.size.get(), b.op.clone()))
                .collect()
        };
        assert_eq!(step(&captured).len(), 9);
        let lists = step(&foreach);
        assert_eq!(lists.len(), 9);
        assert!(lists
            .iter()
            .all(|(_, _, op)| op.as_deref() == Some("aten::_foreach_sqrt")));
        // The whole list is live at once: all parameters' worth, after the
        // first step has built its state.
        assert_eq!(live_bytes_at(&foreach, 712, Category::Temporary), 4_080);
        assert_eq!(live_bytes_at(&captured, 805, Category::Temporary), 0);
        assert_eq!(live_bytes_at(&foreach, 899, Category::Temporary), 4_080);
        assert_eq!(live_bytes_at(&foreach, 901, Category::Temporary), 0);
        // Adagrad holds two lists.
        assert_eq!(foreach_temporary_lists("Adagrad").map(<[_]>::len), Some(2));
        assert_eq!(foreach_temporary_lists("SGD").map(<[_]>::len), Some(0));
        assert_eq!(foreach_temporary_lists("Lion"), None);
    }

    #[test]
    fn foreach_is_not_modelled_for_custom_or_foreach_captured_optimizers() {
        let mut custom = Loop::training("Adam");
        custom.analysis.optimizer.torch_optim = Some(false);
        let (_, warnings) = run(&custom.analysis, 3, OptimizerPath::CudaDefault);
        assert!(warnings.iter().any(|w| w.code == "optimizer_custom"));
        let mut captured = Loop::training("Adam");
        captured.analysis.optimizer.uses_foreach = true;
        let (schedule, warnings) = run(&captured.analysis, 3, OptimizerPath::CudaDefault);
        assert!(warnings
            .iter()
            .any(|w| w.code == "optimizer_foreach_captured"));
        assert!(!schedule
            .blocks
            .iter()
            .any(|b| b.op.as_deref() == Some("aten::_foreach_sqrt")));
        let unknown = Loop::training("Lion");
        let (_, warnings) = run(&unknown.analysis, 3, OptimizerPath::CudaDefault);
        assert!(warnings
            .iter()
            .any(|w| w.code == "optimizer_foreach_unknown"));
    }

    #[test]
    fn more_iterations_repeat_the_last_one_and_chain_its_frees() {
        let lp = Loop::training("SGD");
        let (three, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
        let (five, warnings) = run(&lp.analysis, 5, OptimizerPath::Captured);
        assert!(warnings.iter().any(|w| w.code == "iterations_repeated"));
        assert_eq!(five.iterations.len(), 5);
        assert_eq!(five.iterations[4].source, 2);
        assert_eq!(five.iterations[4].start, Nanos(4 * PERIOD));
        let gradients = blocks_of(&five, Category::Gradient);
        assert_eq!(gradients.len(), 15);
        // Every iteration's gradients are freed in the next zero_grad; the
        // last ones stay.
        let freed = gradients
            .iter()
            .filter(|(id, _)| free_time(&five, *id).is_some())
            .count();
        assert_eq!(freed, 12);
        for iteration in 1..5 {
            assert_eq!(
                live_bytes_at(&five, iteration * PERIOD + 300, Category::Gradient),
                0
            );
            assert_eq!(
                live_bytes_at(&five, iteration * PERIOD + 650, Category::Gradient),
                4_080
            );
            assert_eq!(
                live_bytes_at(&five, iteration * PERIOD + 55, Category::Batch),
                128
            );
        }
        // The first three iterations are the same as with three.
        let cut = |s: &Schedule| -> Vec<(Nanos, EventKind, u64)> {
            s.events
                .iter()
                .filter(|e| e.time < Nanos(3 * PERIOD - 1))
                .filter_map(|e| Some((e.time, e.kind, s.block(e.block)?.size.get())))
                .collect()
        };
        assert_eq!(cut(&three), cut(&five));
    }

    #[test]
    fn repeated_iterations_never_overlap_a_long_last_iteration() {
        // Captured step times vary: the last iteration here lasts 1,600 ns
        // although iterations start 1,000 ns apart.
        let mut lp = Loop::training("SGD");
        lp.analysis.iterations[2].end = Nanos(2 * PERIOD + 1_600);
        let (five, _) = run(&lp.analysis, 5, OptimizerPath::Captured);
        let spans = &five.iterations;
        for pair in spans.windows(2) {
            assert!(pair[1].start > pair[0].end, "{pair:?}");
        }
        assert_eq!(spans[3].start, Nanos(2 * PERIOD + 1_600 + 1));
        for event in &five.events {
            let block = five.block(event.block).unwrap();
            if event.kind == EventKind::Alloc {
                if let Some(iteration) = block.iteration {
                    let span = spans[iteration as usize];
                    assert!(
                        span.start <= event.time && event.time <= span.end,
                        "{block:?} at {:?} outside {span:?}",
                        event.time
                    );
                }
            }
        }
        // Steady state: iterations 1 to 4 hold the same gradients mid-backward.
        for span in &spans[1..] {
            let mid_backward = span.start.get() + 650;
            assert_eq!(
                live_bytes_at(&five, mid_backward, Category::Gradient),
                4_080
            );
        }
    }

    #[test]
    fn fewer_iterations_cut_the_trace() {
        let lp = Loop::training("SGD");
        let (one, _) = run(&lp.analysis, 1, OptimizerPath::Captured);
        assert_eq!(one.iterations.len(), 1);
        assert!(one.events.iter().all(|e| e.time < Nanos(PERIOD)));
        // The first iteration's gradients are freed by the second, not simulated.
        assert_eq!(live_bytes_at(&one, PERIOD, Category::Gradient), 4_080);
    }

    #[test]
    fn iterations_are_not_repeated_without_two_matching_ones() {
        let mut lp = Loop::training("SGD");
        // Make iteration 2 allocate something iteration 1 does not.
        lp.block(
            2,
            300,
            Some(2 * PERIOD + 310),
            5,
            P::Forward,
            BlockRole::Other,
        );
        let (schedule, warnings) = run(&lp.analysis, 5, OptimizerPath::Captured);
        assert!(warnings.iter().any(|w| w.code == "iterations_not_repeated"));
        assert_eq!(schedule.iterations.len(), 3);
    }

    #[test]
    fn workspaces_go_to_the_first_forward_and_backward() {
        let lp = Loop::training("SGD");
        let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
        let workspaces: Vec<(Nanos, Phase)> = schedule
            .events
            .iter()
            .filter_map(|e| {
                let b = schedule.block(e.block)?;
                (b.category == Category::Workspace).then_some((e.time, b.phase))
            })
            .collect();
        assert_eq!(
            workspaces,
            vec![(Nanos(150), Phase::Forward), (Nanos(400), Phase::Backward)]
        );
    }

    #[test]
    fn workspaces_follow_the_first_matrix_product_of_each_pass() {
        let mut lp = Loop::training("SGD");
        lp.analysis.names[3] = "aten::addmm".to_owned();
        let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
        let mut previous: Option<&ScheduledBlock> = None;
        let mut found = Vec::new();
        for event in &schedule.events {
            let block = schedule.block(event.block).unwrap();
            if block.category == Category::Workspace {
                // Right after the output of the product that needs it.
                let before = previous.unwrap();
                assert_eq!(before.op.as_deref(), Some("aten::addmm"));
                found.push((event.time, block.phase));
            }
            previous = Some(block);
        }
        assert_eq!(
            found,
            vec![(Nanos(200), Phase::Forward), (Nanos(500), Phase::Backward)]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]
        /// Any mix of blocks, roles and lifetimes gives a consistent schedule
        /// (every block allocated once, freed at most once, never before its
        /// allocation, events in time order), for any iteration count.
        #[test]
        fn any_analysis_gives_a_consistent_schedule(
            blocks in proptest::collection::vec(
                (0usize..3, 0i64..999, proptest::option::of(0i64..3_000), 1u64..100_000, 0usize..6, 0usize..4),
                1..60,
            ),
            iterations in 1u32..7,
            foreach in proptest::bool::ANY,
        ) {
            let phases = [P::DataLoading, P::ZeroGrad, P::Forward, P::Backward, P::OptimizerStep, P::Other];
            let mut lp = Loop::new("Adam");
            for (iteration, alloc, free, size, phase, role) in blocks {
                let start = iteration as i64 * PERIOD + alloc;
                let free = free.map(|f| start + f).filter(|&f| f < 3 * PERIOD);
                let role = match role {
                    0 => BlockRole::Gradient { param: 0 },
                    1 => BlockRole::OptimizerState,
                    2 => BlockRole::Batch,
                    _ => BlockRole::Other,
                };
                lp.block(iteration, alloc, free, size, phases[phase], role);
            }
            let config = OrchestratorConfig {
                iterations,
                optimizer_path: if foreach { OptimizerPath::CudaDefault } else { OptimizerPath::Captured },
            };
            let first = orchestrate(&lp.analysis, &config).unwrap();
            proptest::prop_assert_eq!(first.value.schedule.check(), Ok(()));
            let again = orchestrate(&lp.analysis, &config).unwrap();
            proptest::prop_assert_eq!(first, again);
        }
    }

    #[test]
    fn orchestration_is_deterministic_and_rejects_bad_input() {
        let lp = Loop::training("Adam");
        let a = run(&lp.analysis, 4, OptimizerPath::CudaDefault);
        let b = run(&lp.analysis, 4, OptimizerPath::CudaDefault);
        assert_eq!(a, b);
        let config = OrchestratorConfig {
            iterations: 0,
            optimizer_path: OptimizerPath::CudaDefault,
        };
        assert!(matches!(
            orchestrate(&lp.analysis, &config),
            Err(super::super::OrchestrateError::NoIterations(0))
        ));
        let config = OrchestratorConfig {
            iterations: u32::MAX,
            optimizer_path: OptimizerPath::CudaDefault,
        };
        assert!(matches!(
            orchestrate(&lp.analysis, &config),
            Err(super::super::OrchestrateError::TooManyIterations(u32::MAX))
        ));
        let empty = Loop::new("SGD");
        assert!(matches!(
            orchestrate(&empty.analysis, &OrchestratorConfig::standard()),
            Err(super::super::OrchestrateError::NoBlocks)
        ));
    }
}
