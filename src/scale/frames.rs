//! The repeated blocks of a trace: `nn.Module: Class_k` frames of one class
//! that are siblings under one parent module (`LlamaDecoderLayer_0`,
//! `LlamaDecoderLayer_1` under `LlamaModel_0`), the outermost such group, and
//! the time each instance ran.

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};

use crate::trace::{PythonEvent, Trace};

/// `nn.Module: Class_k` split into its class and instance number.
pub(crate) fn module_name(name: &str) -> Option<(&str, u32)> {
    let rest = name.strip_prefix("nn.Module: ")?;
    let (class, k) = rest.rsplit_once('_')?;
    let k = k.parse().ok()?;
    (!class.is_empty()).then_some((class, k))
}

/// One module frame of the trace.
#[derive(Debug, Clone)]
pub(crate) struct ModuleFrame {
    /// Index in [`Trace::python`].
    pub python: usize,
    pub class: String,
    pub k: u32,
    pub tid: i64,
    pub start: i64,
    pub end: i64,
    /// The module frames around it, innermost first, as (class, k).
    pub ancestors: Vec<(String, u32)>,
    /// A call made while an autograd node runs: activation checkpointing
    /// recomputing the block's forward inside backward (the reentrant
    /// `CheckpointFunctionBackward`, or a non-reentrant checkpoint's
    /// saved-tensor unpack hook). It is part of that backward, not another
    /// call of the block: it neither makes a stack nor counts as a call.
    /// (torch 2.11 records module frames for these calls, with no module
    /// around them; torch 2.15 records none.)
    pub recomputed: bool,
}

/// A group of sibling instances of one module class: a stack of blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stack {
    pub class: String,
    /// The parent module (`Class_k`), empty at the top.
    pub parent: String,
    /// Instance numbers in order.
    pub instances: Vec<u32>,
    /// `[memory]` events inside the first call of each instance.
    pub events: usize,
}

impl Stack {
    /// The last traced block's instance number: the template a rebuild
    /// copies.
    pub(crate) fn last(&self) -> u32 {
        self.instances.last().copied().unwrap_or(0)
    }
}

/// The calls of instance `k` of a stack's `class` (not its recomputations),
/// each the (start, end) of its module frame — widened to an op that wraps
/// only this call of the class: a block called through an autograd Function
/// around it (the reentrant `CheckpointFunction` when the checkpoint is taken
/// around the module's `__call__`, as transformers 5.17 does) starts with
/// that Function's op, whose sequence number links the block's backward.
pub(crate) fn block_calls(
    trace: &Trace,
    frames: &[ModuleFrame],
    class: &str,
    k: u32,
) -> Vec<(i64, i64)> {
    let blocks: Vec<&ModuleFrame> = frames
        .iter()
        .filter(|f| f.class == class && !f.recomputed)
        .collect();
    blocks
        .iter()
        .filter(|f| f.k == k)
        .map(|f| {
            trace
                .ops
                .iter()
                .filter(|o| o.tid == f.tid)
                .map(|o| (o.start.get(), o.start.get().saturating_add(o.dur.get())))
                .filter(|&(s, e)| s <= f.start && f.end <= e)
                .filter(|&(s, e)| {
                    blocks
                        .iter()
                        .filter(|b| b.tid == f.tid && s <= b.start && b.start <= e)
                        .count()
                        == 1
                })
                .fold((f.start, f.end), |(s0, e0), (s, e)| (s0.min(s), e0.max(e)))
        })
        .collect()
}

/// The prefix of the op the autograd engine records around each node it runs.
pub(super) const AUTOGRAD_NODE: &str = "autograd::engine::evaluate_function: ";

/// Every module frame, with its module ancestors.
pub(crate) fn module_frames(trace: &Trace) -> Vec<ModuleFrame> {
    let by_id: FxHashMap<i64, usize> = trace
        .python
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.id.map(|id| (id, i)))
        .collect();
    let in_backward = BackwardSpans::new(trace);
    let mut out = Vec::new();
    for (i, p) in trace.python.iter().enumerate() {
        let Some((class, k)) = module_name(trace.name(p.name)) else {
            continue;
        };
        out.push(ModuleFrame {
            python: i,
            class: class.to_owned(),
            k,
            tid: p.tid,
            start: p.start.get(),
            end: p.start.get().saturating_add(p.dur.get()),
            ancestors: ancestors(trace, p, &by_id),
            recomputed: in_backward.holds(p.tid, p.start.get()),
        });
    }
    out
}

/// The spans of the autograd nodes run, per thread: sorted by start, each
/// with the latest end of it and every node before it, so that "is `t`
/// inside a node" is one binary search.
struct BackwardSpans {
    per_thread: BTreeMap<i64, Vec<(i64, i64)>>,
}

impl BackwardSpans {
    fn new(trace: &Trace) -> BackwardSpans {
        let mut per_thread: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
        for o in &trace.ops {
            if trace.name(o.name).starts_with(AUTOGRAD_NODE) {
                per_thread
                    .entry(o.tid)
                    .or_default()
                    .push((o.start.get(), o.start.get().saturating_add(o.dur.get())));
            }
        }
        for spans in per_thread.values_mut() {
            spans.sort_unstable();
            let mut reach = i64::MIN;
            for span in spans.iter_mut() {
                reach = reach.max(span.1);
                span.1 = reach;
            }
        }
        BackwardSpans { per_thread }
    }

    fn holds(&self, tid: i64, t: i64) -> bool {
        let Some(spans) = self.per_thread.get(&tid) else {
            return false;
        };
        let n = spans.partition_point(|&(start, _)| start <= t);
        n.checked_sub(1)
            .and_then(|i| spans.get(i))
            .is_some_and(|&(_, reach)| reach >= t)
    }
}

/// The module frames above `frame`, innermost first (a bounded walk: a
/// broken parent chain ends it).
fn ancestors(
    trace: &Trace,
    frame: &PythonEvent,
    by_id: &FxHashMap<i64, usize>,
) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let mut parent = frame.parent_id;
    let mut steps = 0;
    while let Some(id) = parent {
        steps += 1;
        if steps > 4096 {
            break;
        }
        let Some(p) = by_id.get(&id).and_then(|&i| trace.python.get(i)) else {
            break;
        };
        if let Some((class, k)) = module_name(trace.name(p.name)) {
            out.push((class.to_owned(), k));
        }
        if p.parent_id == Some(id) {
            break;
        }
        parent = p.parent_id;
    }
    out
}

/// The stacks to repeat: sibling groups of one class with two or more
/// instances, not inside an instance of another group; the one whose first
/// calls hold the most `[memory]` events, and every other group with as
/// many instances and at least half its events (T5's encoder and decoder).
pub(crate) fn find_stacks(trace: &Trace, frames: &[ModuleFrame]) -> Vec<Stack> {
    let frames: Vec<&ModuleFrame> = frames.iter().filter(|f| !f.recomputed).collect();
    let mut groups: BTreeMap<(String, String), BTreeSet<u32>> = BTreeMap::new();
    for f in &frames {
        let parent = f
            .ancestors
            .first()
            .map(|(c, k)| format!("{c}_{k}"))
            .unwrap_or_default();
        groups
            .entry((f.class.clone(), parent))
            .or_default()
            .insert(f.k);
    }
    let ts: Vec<i64> = trace.memory.iter().map(|m| m.ts.get()).collect();
    // The first call of each instance (frames are in file order).
    let mut first: FxHashMap<(&str, u32), &ModuleFrame> = FxHashMap::default();
    for f in frames.iter().copied() {
        let e = first.entry((f.class.as_str(), f.k)).or_insert(f);
        if f.start < e.start {
            *e = f;
        }
    }
    let first_call = |class: &str, k: u32| -> Vec<i64> {
        let Some(f) = first.get(&(class, k)) else {
            return Vec::new();
        };
        let lo = ts.partition_point(|&t| t < f.start);
        let hi = ts.partition_point(|&t| t <= f.end);
        trace
            .memory
            .get(lo..hi)
            .unwrap_or_default()
            .iter()
            .map(|m| m.bytes)
            .collect()
    };
    // Blocks of a stack are alike: the last two make the same allocations
    // (9 in 10 of the last one's match the one before it, which may have
    // more: T5's first block computes the position bias). A group of unlike
    // siblings (T5's encoder and decoder stacks) is no stack; the blocks
    // inside them may be.
    let alike = |class: &str, ks: &BTreeSet<u32>| -> bool {
        let mut it = ks.iter().rev();
        let (Some(&t), Some(&p)) = (it.next(), it.next()) else {
            return false;
        };
        let (a, b) = (first_call(class, t), first_call(class, p));
        if a.is_empty() {
            return false;
        }
        super::align::align(&a, &b)
            .is_some_and(|(t2p, _)| t2p.iter().filter(|x| x.is_some()).count() * 10 >= a.len() * 9)
    };
    let candidates: Vec<((String, String), BTreeSet<u32>)> = groups
        .into_iter()
        .filter(|((class, _), ks)| ks.len() >= 2 && alike(class, ks))
        .collect();
    let members: FxHashSet<(&str, u32)> = candidates
        .iter()
        .flat_map(|((c, _), ks)| ks.iter().map(move |&k| (c.as_str(), k)))
        .collect();
    // Instances called inside an instance of a candidate group.
    let nested: FxHashSet<(&str, u32)> = frames
        .iter()
        .filter(|f| members.contains(&(f.class.as_str(), f.k)))
        .filter(|f| {
            f.ancestors
                .iter()
                .any(|(c, k)| members.contains(&(c.as_str(), *k)))
        })
        .map(|f| (f.class.as_str(), f.k))
        .collect();
    let mut stacks: Vec<Stack> = Vec::new();
    for ((class, parent), ks) in &candidates {
        if ks.iter().any(|&k| nested.contains(&(class.as_str(), k))) {
            continue;
        }
        let events = ks
            .iter()
            .filter_map(|&k| first.get(&(class.as_str(), k)))
            .map(|f| {
                let lo = ts.partition_point(|&t| t < f.start);
                let hi = ts.partition_point(|&t| t <= f.end);
                hi.saturating_sub(lo)
            })
            .sum();
        stacks.push(Stack {
            class: class.clone(),
            parent: parent.clone(),
            instances: ks.iter().copied().collect(),
            events,
        });
    }
    let Some(best) = stacks
        .iter()
        .max_by_key(|s| (s.events, s.instances.len()))
        .cloned()
    else {
        return Vec::new();
    };
    if best.events == 0 {
        return Vec::new();
    }
    stacks.retain(|s| {
        s == &best || (s.instances.len() == best.instances.len() && s.events * 2 >= best.events)
    });
    stacks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_split_at_the_last_underscore() {
        assert_eq!(
            module_name("nn.Module: LlamaDecoderLayer_12"),
            Some(("LlamaDecoderLayer", 12))
        );
        assert_eq!(module_name("nn.Module: My_Block_3"), Some(("My_Block", 3)));
        assert_eq!(module_name("nn.Module: Linear"), None);
        assert_eq!(module_name("forward"), None);
        assert_eq!(module_name("nn.Module: _3"), None);
    }
}
