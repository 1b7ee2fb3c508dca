//! `[memory]` events of a rebuilt trace: allocations paired with their
//! frees, `Total Allocated` written again after sizes or events changed, and
//! the first step's optimizer state left out.

use rustc_hash::FxHashMap;
use std::collections::BTreeSet;

use crate::trace::{MemoryEvent, Trace};

/// What was allocated before the trace's first event (its `Total Allocated`
/// less its own size), if the trace records totals.
pub(super) fn base_total(memory: &[MemoryEvent]) -> Option<i64> {
    memory
        .first()
        .and_then(|m| m.total_allocated.map(|t| t - m.bytes))
}

/// Writes `Total Allocated` again from `base`, event by event (events that
/// record none keep none).
pub(super) fn retotal(memory: &mut [MemoryEvent], base: Option<i64>) {
    let mut total = base.unwrap_or(0);
    for m in memory {
        total = total.saturating_add(m.bytes);
        if m.total_allocated.is_some() {
            m.total_allocated = Some(total);
        }
    }
}

/// Pairs each allocation with the next free of its address (and back).
pub(super) fn pair(memory: &[MemoryEvent]) -> Vec<Option<usize>> {
    let mut out = vec![None; memory.len()];
    let mut open: FxHashMap<(u64, crate::trace::Device), usize> = FxHashMap::default();
    for (i, m) in memory.iter().enumerate() {
        let key = (m.addr, m.device);
        if m.bytes > 0 {
            open.insert(key, i);
        } else if m.bytes < 0 {
            if let Some(a) = open.remove(&key) {
                if let Some(slot) = out.get_mut(a) {
                    *slot = Some(i);
                }
                if let Some(slot) = out.get_mut(i) {
                    *slot = Some(a);
                }
            }
        }
    }
    out
}

/// Leaves out the optimizer state made in the first `Optimizer.step`
/// (allocations there never freed): the state of the copies' parameters is
/// not in the trace, so all of it is sized from the parameters instead.
pub(super) fn strip_first_step_state(trace: &mut Trace) {
    let Some(step) = trace
        .annotations
        .iter()
        .filter(|a| trace.name(a.name).starts_with("Optimizer.step#"))
        .min_by_key(|a| a.start)
    else {
        return;
    };
    let (s, e) = (step.start.get(), step.start.get() + step.dur.get());
    let partner = pair(&trace.memory);
    let drop: BTreeSet<usize> = trace
        .memory
        .iter()
        .enumerate()
        .filter(|(i, m)| {
            m.bytes > 0
                && s <= m.ts.get()
                && m.ts.get() <= e
                && partner.get(*i).is_some_and(Option::is_none)
        })
        .map(|(i, _)| i)
        .collect();
    if drop.is_empty() {
        return;
    }
    let base = base_total(&trace.memory);
    let mut kept: Vec<MemoryEvent> = trace
        .memory
        .iter()
        .enumerate()
        .filter(|(i, _)| !drop.contains(i))
        .map(|(_, m)| m.clone())
        .collect();
    retotal(&mut kept, base);
    trace.memory = kept;
}
