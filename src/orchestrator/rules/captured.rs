//! Rule `activations` and the captured blocks: every block of the trace that
//! a CUDA run also makes, over the planned iterations, with its category.

use std::collections::BTreeMap;

use super::autocast::{AddedBlock, Plan};
use super::dropped::dropped_by;
use super::iterations::{allocations_of, IterationPlan};
use super::order::{captured_rank, Key};
use super::{name_of, Item, RuleCounts};
use crate::analyzer::{self, Analysis, Block, BlockRole};
use crate::orchestrator::schedule::Category;
use crate::units::Nanos;

/// Rule `activations` (and the categories of captured blocks): roles from the
/// analyzer; other blocks are temporaries when freed inside the op or the
/// optimizer step that made them, optimizer state when an optimizer step
/// made them and a later one frees them or none does (an optimizer that
/// makes its moments anew each step, `state["m"] = m_t`, keeps them from one
/// step to the next), activations otherwise.
pub(super) fn category_of(block: &Block) -> Category {
    match block.role {
        BlockRole::Gradient { .. } => Category::Gradient,
        BlockRole::OptimizerState => Category::OptimizerState,
        BlockRole::Batch => Category::Batch,
        BlockRole::Parameter => Category::Parameter,
        BlockRole::Buffer => Category::Buffer,
        BlockRole::Bucket => Category::Bucket,
        BlockRole::KvCache => Category::KvCache,
        // dropped by `bnb_cuda_kernels`
        BlockRole::CpuRepack => Category::Temporary,
        BlockRole::Other => {
            let step_temporary = block.alloc_phase == analyzer::Phase::OptimizerStep
                && block.free_phase == Some(analyzer::Phase::OptimizerStep)
                && block.free_iteration == block.alloc_iteration;
            let carried = block.alloc_phase == analyzer::Phase::OptimizerStep
                && match block.free_phase {
                    None => block.free_ts.is_none(),
                    Some(phase) => {
                        phase == analyzer::Phase::OptimizerStep
                            && block.free_iteration > block.alloc_iteration
                    }
                };
            if block.op_internal || step_temporary {
                Category::Temporary
            } else if carried {
                Category::OptimizerState
            } else {
                Category::Activation
            }
        }
    }
}

/// Builds the trace-derived items for every simulated iteration, applying the
/// drop rules ([`dropped_by`]), the categories and the iteration plan:
/// blocks of a repeated iteration are copied with their times shifted, and a
/// block the repeated iteration leaves live is freed where its counterpart
/// of the iteration before was freed, one period later. Blocks outside every
/// iteration keep their times. The autocast rules' `changes` apply to every
/// copy: blocks dropped, resized or freed elsewhere, blocks added. Returns
/// the items and how many each rule dropped, changed or added.
pub(super) fn captured_items(
    analysis: &Analysis,
    plan: &IterationPlan,
    changes: &Plan,
) -> (Vec<Item>, RuleCounts) {
    let mut dropped = RuleCounts::new();
    let mut keep = |block: &Block| match dropped_by(analysis, block)
        .or_else(|| changes.dropped.get(&block.id).copied())
    {
        Some(rule) => {
            *dropped.entry(rule).or_default() += 1;
            false
        }
        None => true,
    };
    // Correspondence of the repeated iteration's blocks with the previous
    // iteration's, for the frees that happen one iteration later.
    let mut next_free: BTreeMap<usize, (Nanos, usize)> = BTreeMap::new();
    if let Some(repeated) = plan.repeated {
        let last = repeated.source;
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
    let repeated_source = plan.repeated.map(|r| r.source);
    let copies_of_last = plan
        .copies
        .iter()
        .filter(|copy| Some(copy.source) == repeated_source)
        .count();
    let mut items = Vec::new();
    for copy in &plan.copies {
        let (sim, source, offset) = (copy.simulated, copy.source, copy.offset);
        // Which copy of the repeated iteration this is (0: a captured one).
        let copy_index = plan
            .repeated
            .filter(|repeated| repeated.source == source)
            .map_or(0, |repeated| {
                if repeated.period.get() > 0 {
                    (offset.get() / repeated.period.get()) as u64
                } else {
                    0
                }
            });
        for block in analysis
            .blocks
            .iter()
            .filter(|b| b.alloc_iteration == Some(source))
        {
            if !keep(block) {
                continue;
            }
            let own_free = block.free_ts.zip(block.free_event).and_then(|(ts, event)| {
                if plan.cut.is_some_and(|cut| ts >= cut) {
                    None
                } else if let Some(&(moved, _)) = changes.freed.get(&block.id) {
                    let rank = captured_rank(copy_index, event);
                    Some(Key::after_trace(moved.saturating_add(offset), rank))
                } else {
                    Some(Key::captured(ts.saturating_add(offset), copy_index, event))
                }
            });
            let free = own_free.or_else(|| {
                let (ts, event) = next_free.get(&block.id)?;
                let next_copy = copy_index + 1;
                if next_copy as usize >= copies_of_last {
                    return None;
                }
                let period = plan.repeated?.period;
                let time = ts.saturating_add(Nanos(period.get().saturating_mul(next_copy as i64)));
                Some(Key::captured(time, next_copy, *event))
            });
            items.push(item_of(
                analysis,
                block,
                Some(sim),
                offset,
                copy_index,
                free,
            ));
        }
        for (k, added) in changes.added.iter().enumerate() {
            let (iteration, _) = analyzer::locate(&analysis.iterations, added.alloc);
            if iteration != Some(source) || plan.cut.is_some_and(|cut| added.alloc >= cut) {
                continue;
            }
            items.push(added_item(
                analysis,
                added,
                Some(sim),
                offset,
                copy_index,
                k,
                plan.cut,
            ));
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
        if after_last || plan.cut.is_some_and(|cut| block.alloc_ts >= cut) || !keep(block) {
            continue;
        }
        let free = block.free_ts.zip(block.free_event).and_then(|(ts, event)| {
            plan.cut
                .is_none_or(|cut| ts < cut)
                .then_some(Key::captured(ts, 0, event))
        });
        items.push(item_of(analysis, block, None, Nanos::ZERO, 0, free));
    }
    // The new sizes, counted per simulated copy like the drops.
    for item in &mut items {
        let Some(b) = item.source else {
            continue;
        };
        if let Some(&(size, rule)) = changes.resized.get(&b) {
            item.size = size;
            *dropped.entry(rule).or_default() += 1;
        }
        if let Some(&(_, rule)) = changes.freed.get(&b) {
            *dropped.entry(rule).or_default() += 1;
        }
        if let Some(&(on, rule)) = changes.kept_on.get(&b) {
            item.on = on;
            *dropped.entry(rule).or_default() += 1;
        }
    }
    for item in items.iter().filter(|i| i.source.is_none()) {
        if let Some(rule) = item.rule {
            *dropped.entry(rule).or_default() += 1;
        }
    }
    (items, dropped)
}

/// The item of an added block in `copy` of its iteration, shifted by
/// `offset`: a temporary when freed by the time the op that made it
/// returns, an activation otherwise.
fn added_item(
    analysis: &Analysis,
    added: &AddedBlock,
    iteration: Option<u32>,
    offset: Nanos,
    copy: u64,
    k: usize,
    cut: Option<Nanos>,
) -> Item {
    let op = analysis.ops.get(added.op);
    let rank = captured_rank(copy, (1 << 31) | (k & 0x7fff_ffff));
    let temporary = match (added.free, op) {
        (Some(free), Some(op)) => free <= op.end,
        _ => false,
    };
    let free = added
        .free
        .filter(|&f| cut.is_none_or(|cut| f < cut))
        .map(|f| Key::after_trace(f.saturating_add(offset), rank));
    Item {
        size: added.size,
        category: if temporary {
            Category::Temporary
        } else {
            Category::Activation
        },
        iteration,
        phase: analyzer::locate(&analysis.iterations, added.alloc).1,
        op: op.and_then(|o| name_of(analysis, Some(o.name))),
        layer: op.and_then(|o| name_of(analysis, o.layer)),
        alloc: Key::after_trace(added.alloc.saturating_add(offset), rank),
        free,
        source: None,
        rule: Some(added.rule),
        on: added.on,
        per_gpu: added.per_gpu,
    }
}

/// The item of a captured block in copy `copy` of its iteration, shifted by
/// `offset`.
fn item_of(
    analysis: &Analysis,
    block: &Block,
    iteration: Option<u32>,
    offset: Nanos,
    copy: u64,
    free: Option<Key>,
) -> Item {
    Item {
        size: block.size,
        category: category_of(block),
        iteration,
        phase: block.alloc_phase,
        // DDP's buckets go by one op name, so the distributed what-if can
        // find them.
        op: if block.role == BlockRole::Bucket {
            Some(crate::orchestrator::BUCKET_OP.to_owned())
        } else {
            name_of(analysis, block.alloc_op_name)
        },
        layer: name_of(analysis, block.layer),
        alloc: Key::captured(
            block.alloc_ts.saturating_add(offset),
            copy,
            block.alloc_event,
        ),
        free,
        source: Some(block.id),
        rule: None,
        on: crate::kernels::ArchSet::ALL,
        per_gpu: None,
    }
}
