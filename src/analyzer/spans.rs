//! The span hierarchy and its interval index.
//!
//! `cpu_op` and `python_function` spans are sorted per thread by start time
//! (longer first on ties, so parents precede children) and linked to their
//! enclosing span by a stack sweep. "Which span is innermost at time t" is
//! then a binary search for the last span starting at or before t followed
//! by a walk up the parent chain until a span still running at t: with
//! properly nested spans that is exactly the innermost one, in
//! O(log n + depth) per query.

use std::collections::BTreeMap;

use super::{Names, OpSpan};
use crate::diag::Warning;
use crate::trace::{NameId, Trace};
use crate::units::Nanos;

/// Something with a closed time interval and a parent link.
pub(crate) trait Interval {
    fn start(&self) -> Nanos;
    fn end(&self) -> Nanos;
    fn parent(&self) -> Option<usize>;
}

impl Interval for OpSpan {
    fn start(&self) -> Nanos {
        self.start
    }
    fn end(&self) -> Nanos {
        self.end
    }
    fn parent(&self) -> Option<usize> {
        self.parent
    }
}

/// One Python frame.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub name: NameId,
    pub start: Nanos,
    pub end: Nanos,
    pub parent: Option<usize>,
    /// The `nn.Module` path of the innermost module frame at or above this one.
    pub layer: Option<NameId>,
    /// An `nn.Module: ...` frame with no module frame above it.
    pub top_module: bool,
}

impl Interval for Frame {
    fn start(&self) -> Nanos {
        self.start
    }
    fn end(&self) -> Nanos {
        self.end
    }
    fn parent(&self) -> Option<usize> {
        self.parent
    }
}

/// A `user_annotation` span.
#[derive(Debug, Clone)]
pub(crate) struct Annotation {
    pub name: NameId,
    pub start: Nanos,
    pub end: Nanos,
}

/// Spans of one kind, sorted by thread, with each thread's index range.
#[derive(Debug)]
pub(crate) struct Forest<T> {
    pub spans: Vec<T>,
    /// For each span, the index of the event it came from in the trace.
    pub source: Vec<usize>,
    threads: Vec<(i64, usize, usize)>,
}

impl<T: Interval> Forest<T> {
    /// The innermost span of thread `tid` whose closed interval holds `t`.
    pub fn innermost(&self, tid: i64, t: Nanos) -> Option<usize> {
        let &(_, lo, hi) = self.threads.iter().find(|(id, _, _)| *id == tid)?;
        let slice = self.spans.get(lo..hi)?;
        let n_started = slice.partition_point(|s| s.start() <= t);
        let mut idx = lo + n_started.checked_sub(1)?;
        loop {
            let span = self.spans.get(idx)?;
            if span.end() >= t {
                return Some(idx);
            }
            idx = span.parent()?;
        }
    }

    /// The thread of span `idx`.
    pub fn tid_of(&self, idx: usize) -> i64 {
        self.threads
            .iter()
            .find(|&&(_, lo, hi)| lo <= idx && idx < hi)
            .map_or(-1, |&(tid, _, _)| tid)
    }

    /// The spans of thread `tid` (sorted by start, parents first).
    pub fn of_thread(&self, tid: i64) -> &[T] {
        self.threads
            .iter()
            .find(|(id, _, _)| *id == tid)
            .and_then(|&(_, lo, hi)| self.spans.get(lo..hi))
            .unwrap_or(&[])
    }

    /// The trace event span `idx` came from, in `events` (the trace's list
    /// of that kind).
    pub fn source_in<'e, E>(&self, idx: usize, events: &'e [E]) -> Option<&'e E> {
        self.source.get(idx).and_then(|&s| events.get(s))
    }

    /// Ancestors of `idx`, itself first.
    pub fn chain(&self, idx: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(idx), move |&i| {
            self.spans.get(i).and_then(|s| s.parent())
        })
    }
}

/// Sorts `(tid, start, end, payload)` rows and links parents by containment.
fn build_forest<P, T>(
    mut rows: Vec<(i64, Nanos, Nanos, usize, P)>,
    mut make: impl FnMut(P, Nanos, Nanos, Option<usize>, usize) -> T,
) -> Forest<T> {
    // Thread, start, longer first, then file order: parents precede children.
    rows.sort_by(|a, b| {
        (a.0, a.1, std::cmp::Reverse(a.2), a.3).cmp(&(b.0, b.1, std::cmp::Reverse(b.2), b.3))
    });
    let mut spans = Vec::with_capacity(rows.len());
    let mut source = Vec::with_capacity(rows.len());
    let mut threads: Vec<(i64, usize, usize)> = Vec::new();
    let mut stack: Vec<(usize, Nanos)> = Vec::new();
    for (idx, (tid, start, end, source_idx, payload)) in rows.into_iter().enumerate() {
        source.push(source_idx);
        match threads.last_mut() {
            Some(last) if last.0 == tid => last.2 = idx + 1,
            _ => {
                threads.push((tid, idx, idx + 1));
                stack.clear();
            }
        }
        while let Some(&(_, top_end)) = stack.last() {
            if top_end < start || (top_end == start && end > start) {
                stack.pop();
            } else {
                break;
            }
        }
        let parent = stack.last().map(|&(i, _)| i);
        spans.push(make(payload, start, end, parent, idx));
        stack.push((idx, end));
    }
    Forest {
        spans,
        source,
        threads,
    }
}

/// The span hierarchy of a trace, times relative to the analysis origin.
#[derive(Debug)]
pub(crate) struct SpanIndex {
    pub ops: Forest<OpSpan>,
    pub frames: Forest<Frame>,
    /// Annotations sorted by start (all threads), longer first on ties.
    pub annotations: Vec<Annotation>,
}

/// The prefix of an `nn.Module` frame name.
const MODULE_PREFIX: &str = "nn.Module: ";

impl SpanIndex {
    /// The tensor argument at `position` (not a list element) of op span
    /// `op`, as the trace records it.
    pub fn tensor_arg<'t>(
        &self,
        trace: &'t Trace,
        op: usize,
        position: u16,
    ) -> Option<&'t crate::trace::TensorArg> {
        let source = self.ops.source_in(op, &trace.ops)?;
        trace
            .tensor_args(source)
            .iter()
            .find(|a| a.position == position && a.list_index.is_none())
    }

    /// Indexes the trace's spans once for every later lookup: ops, Python
    /// frames and annotations per thread sorted by start, the `nn.Module`
    /// frame stack of each op (its layer), forward↔backward links from
    /// `fwdbwd` flows and sequence numbers, and the interned names the
    /// analysis keeps. Long because the per-thread stacks are built in one
    /// pass over each kind of span.
    pub fn build(
        trace: &Trace,
        origin: Nanos,
        names: &mut Names,
        warnings: &mut Vec<Warning>,
    ) -> SpanIndex {
        // Python frames and their layer paths.
        let rows = trace
            .python
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let start = p.start.saturating_sub(origin);
                (p.tid, start, start.saturating_add(p.dur), i, p.name)
            })
            .collect();
        let mut frames: Forest<Frame> = build_forest(rows, |name, start, end, parent, _| Frame {
            name,
            start,
            end,
            parent,
            layer: None,
            top_module: false,
        });
        for idx in 0..frames.spans.len() {
            let Some(frame) = frames.spans.get(idx) else {
                continue;
            };
            let parent_layer = frame
                .parent
                .and_then(|p| frames.spans.get(p))
                .and_then(|p| p.layer);
            let (layer, top_module) = match names.get(frame.name).strip_prefix(MODULE_PREFIX) {
                Some(module) => {
                    let module = module.to_owned();
                    let path = match parent_layer {
                        Some(parent) => format!("{}/{module}", names.get(parent)),
                        None => module,
                    };
                    (Some(names.intern(&path)), parent_layer.is_none())
                }
                None => (parent_layer, false),
            };
            if let Some(frame) = frames.spans.get_mut(idx) {
                frame.layer = layer;
                frame.top_module = top_module;
            }
        }

        // Ops, their backward flag, forward links and layers.
        let rows = trace
            .ops
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let start = o.start.saturating_sub(origin);
                (o.tid, start, start.saturating_add(o.dur), i, i)
            })
            .collect();
        let mut ops: Forest<OpSpan> = build_forest(rows, |i: usize, start, end, parent, _| {
            let op = trace.ops.get(i);
            let name = op.map_or(NameId(0), |o| o.name);
            let own_backward = op.is_some_and(|o| {
                o.fwd_thread_id.is_some_and(|t| t > 0)
                    || names
                        .get(name)
                        .starts_with("autograd::engine::evaluate_function")
            });
            OpSpan {
                name,
                tid: op.map_or(-1, |o| o.tid),
                start,
                end,
                parent,
                sequence_number: op.and_then(|o| o.sequence_number),
                backward: own_backward,
                forward_op: None,
                layer: None,
                inputs: op.map(|o| o.tensor_args.clone()).unwrap_or(0..0),
            }
        });

        // Forward ops by sequence number (the outermost op carrying it).
        let mut forward_by_seq: BTreeMap<i64, usize> = BTreeMap::new();
        for (idx, op) in ops.spans.iter().enumerate() {
            let parent_backward = op
                .parent
                .and_then(|p| ops.spans.get(p))
                .is_some_and(|p| p.backward);
            if op.backward || parent_backward {
                continue;
            }
            if let Some(seq) = op.sequence_number {
                forward_by_seq.entry(seq).or_insert(idx);
            }
        }
        // Flow links: a flow's start is at the forward op's start, its end at
        // the backward node's start, on the same thread.
        let mut flow_forward: BTreeMap<i64, usize> = BTreeMap::new();
        for flow in trace.flows.iter().filter(|f| f.is_start) {
            let ts = flow.ts.saturating_sub(origin);
            if let Some(op) = ops.innermost(flow.tid, ts) {
                flow_forward.entry(flow.id).or_insert(op);
            }
        }
        let mut flow_links: BTreeMap<usize, usize> = BTreeMap::new();
        for flow in trace.flows.iter().filter(|f| !f.is_start) {
            let ts = flow.ts.saturating_sub(origin);
            if let (Some(&fwd), Some(bwd)) =
                (flow_forward.get(&flow.id), ops.innermost(flow.tid, ts))
            {
                flow_links.entry(bwd).or_insert(fwd);
            }
        }

        let mut n_unlinked = 0_usize;
        for idx in 0..ops.spans.len() {
            let Some(op) = ops.spans.get(idx) else {
                continue;
            };
            let parent = op.parent.and_then(|p| ops.spans.get(p));
            let backward = op.backward || parent.is_some_and(|p| p.backward);
            let (forward_op, layer) = if backward {
                let own = flow_links.get(&idx).copied().or_else(|| {
                    op.sequence_number
                        .and_then(|seq| forward_by_seq.get(&seq).copied())
                });
                let forward_op = own.or_else(|| parent.and_then(|p| p.forward_op));
                if op.backward && op.sequence_number.is_some() && forward_op.is_none() {
                    n_unlinked += 1;
                }
                let layer = forward_op
                    .and_then(|f| ops.spans.get(f))
                    .and_then(|f| f.layer);
                (forward_op, layer)
            } else {
                let layer = frames
                    .innermost(op.tid, op.start)
                    .and_then(|f| frames.spans.get(f))
                    .and_then(|f| f.layer);
                (None, layer)
            };
            if let Some(op) = ops.spans.get_mut(idx) {
                op.backward = backward;
                op.forward_op = forward_op;
                op.layer = layer;
            }
        }
        if n_unlinked > 0 {
            warnings.push(Warning::new(
                "backward_op_without_forward",
                format!("{n_unlinked} backward ops carry a sequence number that no forward op has; their blocks get no layer"),
            ));
        }

        let mut annotations: Vec<Annotation> = trace
            .annotations
            .iter()
            .map(|a| {
                let start = a.start.saturating_sub(origin);
                Annotation {
                    name: a.name,
                    start,
                    end: start.saturating_add(a.dur),
                }
            })
            .collect();
        annotations.sort_by_key(|a| (a.start, std::cmp::Reverse(a.end)));

        SpanIndex {
            ops,
            frames,
            annotations,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forest(rows: &[(i64, i64, i64)]) -> Forest<OpSpan> {
        let rows = rows
            .iter()
            .enumerate()
            .map(|(i, &(tid, s, e))| (tid, Nanos(s), Nanos(e), i, i))
            .collect();
        build_forest(rows, |i, start, end, parent, _| OpSpan {
            name: NameId(u32::try_from(i).unwrap()),
            tid: 0,
            start,
            end,
            parent,
            sequence_number: None,
            backward: false,
            forward_op: None,
            layer: None,
            inputs: 0..0,
        })
    }

    #[test]
    fn innermost_walks_up_from_a_finished_sibling() {
        // parent [0,100] with children [10,20] and [30,40]; another thread.
        let f = forest(&[(1, 0, 100), (1, 10, 20), (1, 30, 40), (2, 0, 5)]);
        let name = |idx: Option<usize>| idx.map(|i| f.spans[i].name.0);
        assert_eq!(name(f.innermost(1, Nanos(15))), Some(1));
        assert_eq!(name(f.innermost(1, Nanos(25))), Some(0));
        assert_eq!(name(f.innermost(1, Nanos(35))), Some(2));
        assert_eq!(name(f.innermost(1, Nanos(100))), Some(0));
        assert_eq!(name(f.innermost(1, Nanos(101))), None);
        assert_eq!(name(f.innermost(1, Nanos(-1))), None);
        assert_eq!(name(f.innermost(2, Nanos(3))), Some(3));
        assert_eq!(name(f.innermost(3, Nanos(3))), None);
    }

    #[test]
    fn a_span_starting_where_its_sibling_ends_is_not_its_child() {
        let f = forest(&[(1, 0, 100), (1, 10, 20), (1, 20, 30)]);
        assert_eq!(f.spans[2].parent, Some(0));
        // Equal starts: the longer one is the parent.
        let f = forest(&[(1, 0, 10), (1, 0, 100)]);
        assert_eq!(f.spans[0].end, Nanos(100));
        assert_eq!(f.spans[1].parent, Some(0));
    }
}
