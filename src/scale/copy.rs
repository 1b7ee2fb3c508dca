//! The one copy engine of the rebuilds: segments of a trace repeated k
//! times, each copy placed on the trace's clock and given its own
//! addresses, sizes, ops, Python frames, annotations and flows.
//!
//! `--layers` (a block's forward call, its backward, its loop in a
//! per-parameter optimizer step: [`super::depth`], [`super::step`]) and
//! `--new-tokens` (the last decode step: [`super::tokens`]) differ only in
//! what they repeat and how each copy links and grows, which they say in a
//! [`Copies`]:
//!
//! - the segments ([`Repeat`]): an inclusive interval of the clock, and
//!   where its copies go ([`Place`]);
//! - the address of every `[memory]` event of a segment in every copy
//!   ([`Copies::addr`]; a copy emits only the events given one), which is
//!   how a tensor crossing copies is chained through them, kept by each or
//!   made anew by each;
//! - the size of an event in a copy, where it grows ([`Copies::bytes`]);
//! - frees added for what copies keep ([`Extra`]);
//! - how module frames of the copies are named ([`Renumber`]) and which
//!   ops lose their recorded shapes (grown past them).
//!
//! The rest is the same for every kind ([`apply`]): everything after an
//! insertion point moves by the copies' duration, and a span around one
//! (the model's forward around its blocks, `generate` around its steps)
//! stretches over them; an op, Python frame or annotation whose whole span
//! lies in a segment, and a flow whose point does, is copied; copies'
//! external ids, Python ids and flow ids are numbered past the trace's,
//! autograd sequence numbers are renumbered in call order, and `Total
//! Allocated` is written again.

use rustc_hash::FxHashMap;
use std::collections::BTreeSet;

use super::events::{base_total, retotal};
use super::names::{python_id_stride, renumber_sequences, Interner, Renumber};
use crate::trace::{AnnotationEvent, FlowEvent, MemoryEvent, OpEvent, Span, Trace};
use crate::units::Nanos;

/// An inclusive time interval of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seg {
    pub start: i64,
    pub end: i64,
}

impl Seg {
    pub(crate) fn holds(self, t: i64) -> bool {
        self.start <= t && t <= self.end
    }
    pub(crate) fn holds_span(self, start: i64, end: i64) -> bool {
        self.start <= start && end <= self.end
    }
    pub(crate) fn len(self) -> i64 {
        self.end.saturating_sub(self.start).saturating_add(1)
    }
}

/// Where the copies of a segment go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// Copy `c` follows the segment, `c` lengths after it (copy 1 right
    /// after it): a block's forward call, its optimizer loop.
    After,
    /// Copy `c` precedes the segment, `c` lengths before it (copy 1 right
    /// before it): a block's backward, which runs the blocks in reverse.
    Before,
    /// The copies precede the segment in their order (copy 1 first, copy
    /// `k` right before it): the decode steps before the last.
    BeforeInOrder,
}

/// One segment to repeat.
#[derive(Debug, Clone)]
pub(super) struct Repeat {
    pub seg: Seg,
    pub place: Place,
    /// The stack whose block the segment is a call of: its copies' module
    /// frames are named as the new blocks'; `None` keeps the names.
    pub stack: Option<usize>,
    /// Its `[memory]` events (indices into [`Trace::memory`]).
    pub events: Vec<usize>,
}

/// Where an added event goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum When {
    /// Right after the trace's event (at its time).
    After(usize),
    /// At time `ts` of repeat `repeat` as copy `copy` has it (copy 0: the
    /// segment itself).
    In { repeat: usize, copy: u32, ts: i64 },
}

/// A `[memory]` event the copies add: a free of what a copy keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Extra {
    pub when: When,
    /// The event it is made like (thread, device).
    pub like: usize,
    pub addr: u64,
    pub bytes: i64,
}

/// What to copy and how: see the module docs.
#[derive(Debug, Default)]
pub(super) struct Copies {
    /// Copies of every segment.
    pub count: u32,
    pub repeats: Vec<Repeat>,
    /// The address of event `e` in copy `c` (0: the event itself, which
    /// keeps its own when absent; `None`: not emitted). A copy emits only
    /// the events given an address.
    pub addr: FxHashMap<(usize, u32), Option<u64>>,
    /// The size of event `e` in copy `c` where it is not its own.
    pub bytes: FxHashMap<(usize, u32), i64>,
    pub extra: Vec<Extra>,
    /// Ops (indices into [`Trace::ops`]) whose recorded shapes no longer
    /// fit (grown sizes); their copies lose them too.
    pub shapeless: BTreeSet<usize>,
    /// Module frames of the deeper model, when blocks are copied.
    pub names: Option<Renumber>,
    /// The next fresh address.
    next_addr: u64,
}

impl Copies {
    /// An empty request for `count` copies of segments of `trace`.
    pub(super) fn new(trace: &Trace, count: u32) -> Copies {
        let max_addr = trace.memory.iter().map(|m| m.addr).max().unwrap_or(0);
        Copies {
            count,
            next_addr: (max_addr | 0xFFFF).saturating_add(1),
            ..Copies::default()
        }
    }

    /// An address no event of the trace or of an earlier copy has.
    pub(super) fn fresh(&mut self) -> u64 {
        let a = self.next_addr;
        self.next_addr = self.next_addr.saturating_add(64);
        a
    }
}

/// The clock of the rebuilt trace.
struct Clock {
    /// (insertion point, after it (`>`) rather than at it (`>=`), length).
    insertions: Vec<(i64, bool, i64)>,
    /// Per repeat: its segment, placement and length.
    repeats: Vec<(Seg, Place)>,
    count: i64,
}

impl Clock {
    fn new(copies: &Copies) -> Clock {
        let count = i64::from(copies.count);
        let insertions = copies
            .repeats
            .iter()
            .map(|r| {
                let len = r.seg.len().saturating_mul(count);
                match r.place {
                    Place::After => (r.seg.end, true, len),
                    Place::Before | Place::BeforeInOrder => (r.seg.start, false, len),
                }
            })
            .collect();
        Clock {
            insertions,
            repeats: copies.repeats.iter().map(|r| (r.seg, r.place)).collect(),
            count,
        }
    }

    /// How far a time of the trace moves.
    fn shift(&self, t: i64) -> i64 {
        self.insertions
            .iter()
            .filter(|&&(at, after, _)| if after { t > at } else { t >= at })
            .map(|&(_, _, len)| len)
            .fold(0, i64::saturating_add)
    }

    fn moved(&self, t: i64) -> i64 {
        t.saturating_add(self.shift(t))
    }

    /// The time of copy `c` (0: the segment itself) of an event at `t` of
    /// repeat `r`.
    fn copy(&self, r: usize, t: i64, c: u32) -> i64 {
        let moved = self.moved(t);
        let Some(&(seg, place)) = self.repeats.get(r) else {
            return moved;
        };
        if c == 0 {
            return moved;
        }
        let c = i64::from(c);
        let len = seg.len();
        match place {
            Place::After => moved.saturating_add(len.saturating_mul(c)),
            Place::Before => moved.saturating_sub(len.saturating_mul(c)),
            Place::BeforeInOrder => moved.saturating_sub(len.saturating_mul(self.count - c + 1)),
        }
    }

    /// A span `(start, dur)` moved: stretched over the copies inserted
    /// inside it.
    fn span(&self, start: i64, dur: i64) -> (i64, i64) {
        let s = self.moved(start);
        let e = self.moved(start.saturating_add(dur));
        (s, e.saturating_sub(s))
    }

    /// The repeat whose segment holds the whole span.
    fn copied(&self, start: i64, dur: i64) -> Option<usize> {
        let end = start.saturating_add(dur);
        self.repeats
            .iter()
            .position(|(seg, _)| seg.holds_span(start, end))
    }
}

/// The rebuilt trace: every event of `trace` moved by the copies inserted
/// before it, and each segment's events emitted once per copy. One function
/// because every kind of event takes the same clock.
pub(super) fn apply(trace: &Trace, copies: &Copies) -> Trace {
    let clock = Clock::new(copies);
    let k = copies.count;
    // Every list of events is made anew (not cloned to be replaced): the
    // memory events and ops here, the rest below.
    let mut memory = memory(trace, copies, &clock);
    retotal(&mut memory, base_total(&trace.memory));
    let mut out = Trace {
        header: trace.header.clone(),
        names: trace.names.clone(),
        memory,
        ops: ops(trace, copies, &clock),
        annotations: Vec::new(),
        python: Vec::new(),
        flows: Vec::new(),
        tensor_args: trace.tensor_args.clone(),
        op_args: trace.op_args.clone(),
        n_gpu_events: trace.n_gpu_events,
        n_events: trace.n_events,
    };

    // Python frames: copies get new ids; module frames are renamed.
    let mut interner = Interner::new(trace);
    let py_span = python_id_stride(trace);
    let copied_ids: BTreeSet<i64> = trace
        .python
        .iter()
        .filter(|p| clock.copied(p.start.get(), p.dur.get()).is_some())
        .filter_map(|p| p.id)
        .collect();
    let mut python = Vec::with_capacity(trace.python.len());
    for (i, p) in trace.python.iter().enumerate() {
        let (s, d) = clock.span(p.start.get(), p.dur.get());
        let mut moved = p.clone();
        moved.start = Nanos(s);
        moved.dur = Nanos(d);
        if let Some((name, module_id)) = copies.names.as_ref().and_then(|n| n.original(i)) {
            moved.name = interner.id(&mut out, &name);
            moved.module_id = module_id.or(moved.module_id);
        }
        python.push(moved);
        let Some(r) = clock.copied(p.start.get(), p.dur.get()) else {
            continue;
        };
        let stack = copies.repeats.get(r).and_then(|rep| rep.stack);
        for c in 1..=k {
            let stride = py_span.saturating_mul(i64::from(c));
            let mut copy = p.clone();
            copy.start = Nanos(clock.copy(r, p.start.get(), c));
            copy.id = p.id.map(|x| x.saturating_add(stride));
            copy.parent_id = p.parent_id.map(|x| {
                if copied_ids.contains(&x) {
                    x.saturating_add(stride)
                } else {
                    x
                }
            });
            let renamed = copies
                .names
                .as_ref()
                .zip(stack)
                .and_then(|(n, s)| n.copy(i, s, c));
            if let Some((name, module_id)) = renamed {
                copy.name = interner.id(&mut out, &name);
                copy.module_id = module_id.or(copy.module_id);
            }
            python.push(copy);
        }
    }
    python.sort_by_key(|p| (p.start, std::cmp::Reverse(p.dur)));
    out.python = python;

    let mut annotations = Vec::with_capacity(trace.annotations.len());
    for a in &trace.annotations {
        let (s, d) = clock.span(a.start.get(), a.dur.get());
        annotations.push(AnnotationEvent {
            start: Nanos(s),
            dur: Nanos(d),
            ..a.clone()
        });
        if let Some(r) = clock.copied(a.start.get(), a.dur.get()) {
            for c in 1..=k {
                annotations.push(AnnotationEvent {
                    start: Nanos(clock.copy(r, a.start.get(), c)),
                    ..a.clone()
                });
            }
        }
    }
    annotations.sort_by_key(|a| (a.start, std::cmp::Reverse(a.dur)));
    out.annotations = annotations;

    let flow_span = trace
        .flows
        .iter()
        .map(|f| f.id)
        .max()
        .unwrap_or(0)
        .max(0)
        .saturating_add(1);
    let mut flows = Vec::with_capacity(trace.flows.len());
    for f in &trace.flows {
        let t = f.ts.get();
        flows.push(FlowEvent {
            ts: Nanos(clock.moved(t)),
            ..f.clone()
        });
        if let Some(r) = clock.repeats.iter().position(|(seg, _)| seg.holds(t)) {
            for c in 1..=k {
                flows.push(FlowEvent {
                    id: f.id.saturating_add(flow_span.saturating_mul(i64::from(c))),
                    ts: Nanos(clock.copy(r, t, c)),
                    ..f.clone()
                });
            }
        }
    }
    flows.sort_by_key(|f| f.ts);
    out.flows = flows;
    out
}

/// The `[memory]` events: the trace's (moved, with their addresses and
/// sizes in copy 0), the added frees, and each copy's, in time order (at
/// one time: the trace's first, each followed by the frees added after
/// it, then copy by copy).
fn memory(trace: &Trace, copies: &Copies, clock: &Clock) -> Vec<MemoryEvent> {
    let k = copies.count;
    let mut memory: Vec<(i64, u32, usize, u32, MemoryEvent)> = Vec::with_capacity(
        trace
            .memory
            .len()
            .saturating_add(copies.addr.len())
            .saturating_add(copies.extra.len()),
    );
    let event = |e: usize, c: u32, t: i64, addr: u64| -> Option<MemoryEvent> {
        let m = trace.memory.get(e)?;
        Some(MemoryEvent {
            ts: Nanos(t),
            addr,
            bytes: copies.bytes.get(&(e, c)).copied().unwrap_or(m.bytes),
            ..m.clone()
        })
    };
    for (e, m) in trace.memory.iter().enumerate() {
        let addr = match copies.addr.get(&(e, 0)) {
            Some(None) => continue,
            Some(Some(x)) => *x,
            None => m.addr,
        };
        let t = clock.moved(m.ts.get());
        if let Some(m) = event(e, 0, t, addr) {
            memory.push((t, 0, e, 0, m));
        }
    }
    for (j, x) in copies.extra.iter().enumerate() {
        let (t, c, e) = match x.when {
            When::After(f) => {
                let Some(m) = trace.memory.get(f) else {
                    continue;
                };
                (clock.moved(m.ts.get()), 0, f)
            }
            When::In { repeat, copy, ts } => (clock.copy(repeat, ts, copy), copy, x.like),
        };
        if let Some(m) = trace.memory.get(x.like) {
            let j = u32::try_from(j).unwrap_or(u32::MAX).saturating_add(1);
            memory.push((
                t,
                c,
                e,
                j,
                MemoryEvent {
                    ts: Nanos(t),
                    addr: x.addr,
                    bytes: x.bytes,
                    ..m.clone()
                },
            ));
        }
    }
    for (r, repeat) in copies.repeats.iter().enumerate() {
        for &e in &repeat.events {
            let Some(m) = trace.memory.get(e) else {
                continue;
            };
            for c in 1..=k {
                if let Some(Some(x)) = copies.addr.get(&(e, c)) {
                    let t = clock.copy(r, m.ts.get(), c);
                    if let Some(m) = event(e, c, t, *x) {
                        memory.push((t, c, e, 0, m));
                    }
                }
            }
        }
    }
    memory.sort_by_key(|&(t, c, e, j, _)| (t, c, e, j));
    memory.into_iter().map(|(_, _, _, _, m)| m).collect()
}

/// The ops: moved (stretched over the copies inside them), each copied op
/// once per copy with its external id numbered past the trace's, and every
/// autograd sequence number renumbered in call order.
fn ops(trace: &Trace, copies: &Copies, clock: &Clock) -> Vec<OpEvent> {
    let k = copies.count;
    let ext_span = trace
        .ops
        .iter()
        .filter_map(|o| o.external_id)
        .max()
        .unwrap_or(0)
        .saturating_add(1);
    let mut ops: Vec<(OpEvent, u32, Option<i64>)> = Vec::with_capacity(trace.ops.len());
    for (i, o) in trace.ops.iter().enumerate() {
        let (s, d) = clock.span(o.start.get(), o.dur.get());
        let mut moved = OpEvent {
            start: Nanos(s),
            dur: Nanos(d),
            ..o.clone()
        };
        if copies.shapeless.contains(&i) {
            moved.tensors = Span::default();
            moved.concrete = Span::default();
            moved.tensor_list_len = None;
            moved.tensor_args = 0..0;
        }
        if let Some(r) = clock.copied(o.start.get(), o.dur.get()) {
            for c in 1..=k {
                ops.push((
                    OpEvent {
                        start: Nanos(clock.copy(r, o.start.get(), c)),
                        dur: o.dur,
                        external_id: o
                            .external_id
                            .map(|x| x.saturating_add(ext_span.saturating_mul(i64::from(c)))),
                        ..moved.clone()
                    },
                    c,
                    o.sequence_number,
                ));
            }
        }
        ops.push((moved, 0, o.sequence_number));
    }
    ops.sort_by_key(|(o, c, _)| (o.start, std::cmp::Reverse(o.dur), *c));
    renumber_sequences(&mut ops);
    ops.into_iter().map(|(o, _, _)| o).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace with one segment [100, 199] (an op, a Python frame, an
    /// annotation, a flow and an allocation freed inside it) inside a
    /// frame and an annotation around it, and an op after it.
    fn trace() -> Trace {
        let text = r#"{"traceEvents": [
            {"ph": "X", "cat": "python_function", "name": "outer", "ts": 0.05, "dur": 0.3, "args": {"Python id": 1, "Python parent id": 0}},
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0.05, "dur": 0.3},
            {"ph": "X", "cat": "python_function", "name": "inner", "ts": 0.1, "dur": 0.05, "args": {"Python id": 2, "Python parent id": 1}},
            {"ph": "X", "cat": "user_annotation", "name": "step", "ts": 0.11, "dur": 0.02},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.12, "dur": 0.01, "args": {"External id": 7, "Sequence number": 3, "Fwd thread id": 0}},
            {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 5, "ts": 0.12, "pid": 1, "tid": 1},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 0.12, "args": {"Addr": 64, "Bytes": 512, "Device Type": 0}},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 0.13, "args": {"Addr": 64, "Bytes": -512, "Device Type": 0}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0.25, "dur": 0.01, "args": {"External id": 9, "Sequence number": 4, "Fwd thread id": 0}}
        ]}"#;
        crate::trace::parse(text.as_bytes()).unwrap().value
    }

    fn copies(trace: &Trace, place: Place, k: u32) -> Trace {
        let mut plan = Copies::new(trace, k);
        plan.repeats.push(Repeat {
            seg: Seg {
                start: 100,
                end: 199,
            },
            place,
            stack: None,
            events: vec![0, 1],
        });
        for c in 1..=k {
            let x = plan.fresh();
            plan.addr.insert((0, c), Some(x));
            plan.addr.insert((1, c), Some(x));
        }
        apply(trace, &plan)
    }

    fn starts(trace: &Trace, name: &str) -> Vec<i64> {
        let mut v: Vec<i64> = trace
            .ops
            .iter()
            .filter(|o| trace.name(o.name) == name)
            .map(|o| o.start.get())
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn copies_go_after_or_before_their_segment_and_later_events_move() {
        let t = trace();
        // After: the segment keeps its place, copies follow it.
        let after = copies(&t, Place::After, 2);
        assert_eq!(starts(&after, "aten::mm"), [120, 220, 320]);
        // Before: the segment moves past its copies.
        let before = copies(&t, Place::Before, 2);
        assert_eq!(starts(&before, "aten::mm"), [120, 220, 320]);
        for rebuilt in [&after, &before] {
            assert_eq!(starts(rebuilt, "aten::add"), [450]);
            let ts: Vec<i64> = rebuilt.memory.iter().map(|m| m.ts.get()).collect();
            assert_eq!(ts, [120, 130, 220, 230, 320, 330]);
        }
        // The copy numbers run the other way for `Before` (copy 1 nearest)
        // and `BeforeInOrder` (copy 1 first): the address of copy 1's block.
        let first = |r: &Trace| r.memory.first().map(|m| m.addr);
        let fresh = |n: u64| (64 | 0xFFFF) + 1 + 64 * n;
        assert_eq!(first(&copies(&t, Place::Before, 2)), Some(fresh(1)));
        assert_eq!(first(&copies(&t, Place::BeforeInOrder, 2)), Some(fresh(0)));
    }

    #[test]
    fn spans_around_a_segment_stretch_over_its_copies() {
        let t = trace();
        for place in [Place::After, Place::Before, Place::BeforeInOrder] {
            let r = copies(&t, place, 3);
            let outer: Vec<(i64, i64)> = r
                .python
                .iter()
                .filter(|p| r.name(p.name) == "outer")
                .map(|p| (p.start.get(), p.dur.get()))
                .collect();
            assert_eq!(outer, [(50, 600)], "{place:?}");
            let step: Vec<i64> = r
                .annotations
                .iter()
                .filter(|a| r.name(a.name) == "ProfilerStep#1")
                .map(|a| a.dur.get())
                .collect();
            assert_eq!(step, [600]);
            // What lies wholly in the segment is copied, with its duration.
            assert_eq!(r.python.len(), 1 + 4);
            assert_eq!(r.annotations.len(), 1 + 4);
            assert!(r
                .annotations
                .iter()
                .filter(|a| r.name(a.name) == "step")
                .all(|a| a.dur.get() == 20));
        }
    }

    #[test]
    fn copied_ids_are_numbered_past_the_traces() {
        let t = trace();
        let r = copies(&t, Place::BeforeInOrder, 2);
        let mut ext: Vec<i64> = r.ops.iter().filter_map(|o| o.external_id).collect();
        ext.sort_unstable();
        assert_eq!(ext, [7, 9, 17, 27]);
        let mut flows: Vec<i64> = r.flows.iter().map(|f| f.id).collect();
        flows.sort_unstable();
        assert_eq!(flows, [5, 11, 17]);
        // The inner frames' copies name their own parent: the outer frame
        // (not copied) keeps its id.
        let inner: Vec<(Option<i64>, Option<i64>)> = r
            .python
            .iter()
            .filter(|p| r.name(p.name) == "inner")
            .map(|p| (p.id, p.parent_id))
            .collect();
        assert_eq!(
            inner,
            [(Some(5), Some(1)), (Some(8), Some(1)), (Some(2), Some(1))]
        );
        // Sequence numbers in call order: the copies' mm, the segment's,
        // then the add.
        let seq: Vec<Option<i64>> = r.ops.iter().map(|o| o.sequence_number).collect();
        assert_eq!(seq, [Some(3), Some(4), Some(5), Some(6)]);
    }
}
