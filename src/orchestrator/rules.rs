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
    BlockId, Category, EventKind, IterationSpan, Phase, Schedule, ScheduleEvent, ScheduledBlock,
};
use super::{OptimizerPath, OrchestrationFacts, OrchestratorConfig};
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
                    "{wanted} iterations were asked for but only {captured} were captured and no two steady-state iterations match, so {captured} are simulated; profile at least 3 iterations"
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
    let period = last_it.start.saturating_sub(previous_it.start);
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
        let rule = if rule_cpu_scratch(block) {
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
        {
            let free = block.free_ts.zip(block.free_event).and_then(|(ts, event)| {
                plan.cut.is_none_or(|cut| ts < cut).then_some(Key {
                    time: ts,
                    group: 1,
                    rank: event as u64,
                })
            });
            items.push(item_of(analysis, block, None, Nanos::ZERO, 0, free));
        }
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
/// loaded, so it never outlives the data loading of the next iteration: a
/// later (or missing) free is moved to the end of that data loading.
/// `loads` are `(iteration, end of data loading)`. Returns how many moved.
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

/// Rule `cublas_workspaces`: workspace blocks (sized per GPU at simulation
/// time) at the first forward and the first backward of the run.
pub(crate) fn rule_cublas_workspaces(forward: Option<Nanos>, backward: Option<Nanos>) -> Vec<Item> {
    let mut items = Vec::new();
    for (index, (time, phase)) in [(forward, Phase::Forward), (backward, Phase::Backward)]
        .into_iter()
        .enumerate()
    {
        let Some(time) = time.or(forward) else {
            continue;
        };
        items.push(Item {
            size: Bytes::ZERO,
            category: Category::Workspace,
            iteration: Some(0),
            phase,
            op: Some("cuBLAS workspace".to_owned()),
            layer: None,
            alloc: Key {
                time,
                group: 0,
                rank: index as u64,
            },
            free: None,
            source: None,
        });
    }
    items
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
            loads.push((sim, end));
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
    let workspaces = rule_cublas_workspaces(
        first(Phase::Forward).or_else(|| {
            plan.copies
                .first()
                .and_then(|c| analysis.iterations.get(c.1))
                .map(|it| it.start)
        }),
        first(Phase::Backward),
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
            .filter_map(|rule| counts.get(rule.name).map(|&n| (rule.name.to_owned(), n)))
            .collect(),
    };
    (into_schedule(items, iterations), facts)
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
