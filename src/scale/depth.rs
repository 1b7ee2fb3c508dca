//! `--layers N`: the trace of a job with N repeated blocks, rebuilt from a
//! trace of fewer.
//!
//! The rule, from how PyTorch runs a stack of identical blocks:
//! - The last traced block of each stack (the *template*) is copied `N - n`
//!   times: its forward call (the module frame) right after itself, its
//!   backward (the autograd nodes of its forward ops, up to the first node of
//!   the block before it) right before itself, since backward runs the
//!   blocks in reverse. Everything later moves by the copies' duration.
//! - Every `[memory]` event of a copied segment is copied with a fresh
//!   address, and the tensors that cross blocks are re-linked by comparing
//!   the template with the block before it (the *predecessor*), aligned event
//!   by event: a tensor the template allocates and the next block frees
//!   (the residual stream in forward, a saved input in backward) becomes a
//!   chain through the copies, the last copy's freed where the template's
//!   was; a tensor the template frees that came from the block above it in
//!   backward (the gradient of its output) comes from the copy above; a
//!   tensor every block keeps (a KV-cache entry, a gradient, a cast weight)
//!   is kept by every copy and freed where the template's is.
//! - Module frames are renumbered as the profiler numbers a deeper model's
//!   (per class, in call order), autograd sequence numbers follow call
//!   order, so the analyzer finds each copy's parameters (its `AccumulateGrad`
//!   nodes, its forward reads) as new parameters.
//! - An optimizer step that updates one parameter at a time has its loop
//!   over the template's parameters copied after itself, as a forward call
//!   is ([`super::step`]): the copies' state and temporaries are then in the
//!   trace. A step without such a loop (the foreach or fused path: one op
//!   for all parameters) has the state its first step made left out of the
//!   rebuilt trace: the analyzer then sizes the state from the parameters
//!   and the optimizer class and the orchestrator makes it in the first
//!   step, as for a trace recorded after the first step
//!   (`analyzer::resident::optimizer`); the foreach lists are remodelled
//!   over every parameter.
//!
//! Limits (refused with a reason, or said in a warning): the template and its
//! predecessor must align (the same allocations in the same order, the
//! predecessor possibly with more, as T5's first block with the position
//! bias); a stack with fewer than two traced blocks has no predecessor;
//! a smaller depth than traced is refused.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::align::align;
use super::events::{base_total, pair, retotal, strip_first_step_state};
use super::frames::{self, ModuleFrame, Stack};
use super::names::{renumber_sequences, Interner, Renumber};
use super::{DepthFacts, ScaleError, StackFacts};
use crate::diag::Warning;
use crate::trace::{MemoryEvent, OpEvent, Trace};
use crate::units::{Bytes, Nanos};

/// An inclusive time interval of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seg {
    pub start: i64,
    pub end: i64,
}

impl Seg {
    pub(super) fn holds(self, t: i64) -> bool {
        self.start <= t && t <= self.end
    }
    fn holds_span(self, start: i64, end: i64) -> bool {
        self.start <= start && end <= self.end
    }
    fn len(self) -> i64 {
        self.end.saturating_sub(self.start).saturating_add(1)
    }
}

/// Forward or backward part of one call of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Kind {
    Forward,
    Backward,
    /// The optimizer step's loop over the block's parameters
    /// ([`super::step`]), copied after itself like a forward call.
    Step,
}

/// One copied segment of the template, with the predecessor's matching part.
#[derive(Debug, Clone)]
pub(super) struct Part {
    pub stack: usize,
    pub kind: Kind,
    pub seg: Seg,
    /// The template's `[memory]` events in it (indices into `Trace::memory`).
    events: Vec<usize>,
    /// The predecessor's events of the same part.
    pred: Vec<usize>,
    /// Alignment: template position → predecessor position, and back.
    pub t2p: Vec<Option<usize>>,
    p2t: Vec<Option<usize>>,
}

/// Where a `[memory]` event lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loc {
    Outside,
    /// Part index, position in it.
    Template(usize, usize),
    Predecessor(usize, usize),
}

/// The rebuilt trace and what was done.
pub(super) fn deepen(
    trace: &Trace,
    layers: u32,
    warnings: &mut Vec<Warning>,
) -> Result<(Trace, DepthFacts), ScaleError> {
    let frames = frames::module_frames(trace);
    if frames.is_empty() {
        return Err(ScaleError::NoModuleFrames);
    }
    let stacks = frames::find_stacks(trace, &frames);
    let Some(first) = stacks.first() else {
        return Err(ScaleError::NoRepeatedBlock);
    };
    let traced = u32::try_from(first.instances.len()).unwrap_or(u32::MAX);
    if let Some(other) = stacks
        .iter()
        .find(|s| s.instances.len() != first.instances.len())
    {
        return Err(ScaleError::StacksDiffer {
            first: first.class.clone(),
            first_count: first.instances.len(),
            other: other.class.clone(),
            other_count: other.instances.len(),
        });
    }
    if layers < traced {
        return Err(ScaleError::FewerLayers { traced, layers });
    }
    let copies = layers - traced;
    let mut facts = DepthFacts {
        traced,
        estimated: layers,
        stacks: Vec::new(),
    };
    let mut parts = Vec::new();
    for (s, stack) in stacks.iter().enumerate() {
        let found = stack_parts(trace, &frames, stack, s)?;
        facts.stacks.push(StackFacts {
            block: stack.class.clone(),
            parent: stack.parent.clone(),
            template: format!("{}_{}", stack.class, last(stack)),
            bytes_per_call: Bytes(
                found
                    .iter()
                    .filter(|p| p.kind == Kind::Forward)
                    .take(1)
                    .flat_map(|p| p.events.iter())
                    .filter_map(|&e| trace.memory.get(e))
                    .map(|m| u64::try_from(m.bytes.max(0)).unwrap_or(0))
                    .sum(),
            ),
        });
        parts.extend(found);
    }
    if copies == 0 {
        return Ok((trace.clone(), facts));
    }
    let strip = super::step::step_parts(trace, first, stacks.len(), traced, &mut parts, warnings);
    let unaligned: usize = parts
        .iter()
        .map(|p| p.t2p.iter().filter(|x| x.is_none()).count())
        .sum();
    if unaligned > 0 {
        warnings.push(Warning::new(
            "layers_unaligned",
            format!("{unaligned} allocations of the repeated block have no counterpart in the block before it; they are copied as the block's own"),
        ));
    }
    let mut rebuild = Rebuild::new(trace, &frames, &stacks, parts, copies);
    rebuild.strip = strip;
    let rebuilt = rebuild.build();
    Ok((rebuilt, facts))
}

pub(super) fn last(stack: &Stack) -> u32 {
    stack.instances.last().copied().unwrap_or(0)
}

/// The template's forward and backward parts in every call, with the
/// predecessor's, aligned.
pub(super) fn stack_parts(
    trace: &Trace,
    frames: &[ModuleFrame],
    stack: &Stack,
    index: usize,
) -> Result<Vec<Part>, ScaleError> {
    let n = stack.instances.len();
    let (Some(&t), Some(&p)) = (
        stack.instances.last(),
        stack.instances.get(n.wrapping_sub(2)),
    ) else {
        return Err(ScaleError::NoRepeatedBlock);
    };
    // A block's call reaches to whatever starts next: the loop around the
    // blocks drops the block's input when the call returns (`hidden_states =
    // block(hidden_states)`), before the next block starts.
    let mut starts: Vec<i64> = trace
        .ops
        .iter()
        .map(|o| o.start.get())
        .chain(trace.python.iter().map(|p| p.start.get()))
        .collect();
    starts.sort_unstable();
    let reach = |end: i64| -> i64 {
        let i = starts.partition_point(|&x| x <= end);
        starts.get(i).map_or(end, |&next| (next - 1).max(end))
    };
    let calls = |k: u32| -> Vec<Seg> {
        let mut v: Vec<Seg> = frames::block_calls(trace, frames, &stack.class, k)
            .into_iter()
            .map(|(start, end)| Seg {
                start,
                end: reach(end),
            })
            .collect();
        v.sort_by_key(|s| (s.start, s.end));
        v
    };
    let (tc, pc) = (calls(t), calls(p));
    if tc.len() != pc.len() || tc.is_empty() {
        return Err(ScaleError::BlocksDiffer {
            block: stack.class.clone(),
            reason: format!(
                "{}_{t} ran {} times and {}_{p} {} times",
                stack.class,
                tc.len(),
                stack.class,
                pc.len()
            ),
        });
    }
    let ts: Vec<i64> = trace.memory.iter().map(|m| m.ts.get()).collect();
    let in_seg = |seg: Seg| events_in(&ts, seg);
    let mut parts = Vec::new();
    for (tf, pf) in tc.iter().zip(&pc) {
        parts.push(part(
            trace,
            stack,
            index,
            Kind::Forward,
            *tf,
            in_seg(*tf),
            in_seg(*pf),
        )?);
        let (Some(tb), Some(pb)) = (backward_start(trace, *tf), backward_start(trace, *pf)) else {
            continue;
        };
        if tb >= pb {
            return Err(ScaleError::BlocksDiffer {
                block: stack.class.clone(),
                reason: "the last block's backward does not run before the one before it"
                    .to_owned(),
            });
        }
        let seg = Seg {
            start: tb,
            end: pb - 1,
        };
        let events = in_seg(seg);
        let lo = ts.partition_point(|&x| x < pb);
        let hi = lo
            .saturating_add(events.len().saturating_mul(2))
            .min(ts.len());
        parts.push(part(
            trace,
            stack,
            index,
            Kind::Backward,
            seg,
            events,
            (lo..hi).collect(),
        )?);
    }
    Ok(parts)
}

/// The `[memory]` events (sorted times `ts`) inside `seg`.
pub(super) fn events_in(ts: &[i64], seg: Seg) -> Vec<usize> {
    let lo = ts.partition_point(|&x| x < seg.start);
    let hi = ts.partition_point(|&x| x <= seg.end);
    (lo..hi).collect()
}

/// Aligns a template part with the predecessor's (the same allocation and
/// free sizes in the same order; the predecessor may have more).
pub(super) fn part(
    trace: &Trace,
    stack: &Stack,
    index: usize,
    kind: Kind,
    seg: Seg,
    events: Vec<usize>,
    pred: Vec<usize>,
) -> Result<Part, ScaleError> {
    let token = |e: &usize| trace.memory.get(*e).map(|m| m.bytes);
    let a: Vec<Option<i64>> = events.iter().map(token).collect();
    let b: Vec<Option<i64>> = pred.iter().map(token).collect();
    let (t2p, p2t) = align(&a, &b).ok_or_else(|| ScaleError::BlocksDiffer {
        block: stack.class.clone(),
        reason: format!(
            "its calls are too large to compare ({} and {} allocations)",
            a.len(),
            b.len()
        ),
    })?;
    let matched = t2p.iter().filter(|x| x.is_some()).count();
    if kind == Kind::Forward && matched * 10 < a.len() * 9 {
        return Err(ScaleError::BlocksDiffer {
            block: stack.class.clone(),
            reason: format!(
                "only {matched} of the last block's {} allocations match the block before it (alternating layer kinds repeat with a period, which memcast does not rebuild yet)",
                a.len()
            ),
        });
    }
    Ok(Part {
        stack: index,
        kind,
        seg,
        events,
        pred,
        t2p,
        p2t,
    })
}

/// The earliest backward node made by a forward op inside `seg` (linked by
/// sequence number), if backward ran.
fn backward_start(trace: &Trace, seg: Seg) -> Option<i64> {
    let forward = |o: &OpEvent| o.fwd_thread_id.is_none_or(|t| t <= 0);
    let seqs: BTreeSet<i64> = trace
        .ops
        .iter()
        .filter(|o| forward(o) && seg.holds_span(o.start.get(), o.start.get() + o.dur.get()))
        .filter_map(|o| o.sequence_number)
        .collect();
    trace
        .ops
        .iter()
        .filter(|o| !forward(o))
        .filter(|o| o.sequence_number.is_some_and(|s| seqs.contains(&s)))
        .map(|o| o.start.get())
        .min()
}

/// The addresses each copy gives a template event (`None`: not emitted).
type Plan = HashMap<(usize, u32), Option<u64>>;

struct Rebuild<'a> {
    trace: &'a Trace,
    frames: &'a [ModuleFrame],
    stacks: &'a [Stack],
    parts: Vec<Part>,
    copies: u32,
    loc: Vec<Loc>,
    partner: Vec<Option<usize>>,
    next_addr: u64,
    /// Leave out the state the first optimizer step made ([`strip_first_step_state`]).
    strip: bool,
}

impl<'a> Rebuild<'a> {
    fn new(
        trace: &'a Trace,
        frames: &'a [ModuleFrame],
        stacks: &'a [Stack],
        parts: Vec<Part>,
        copies: u32,
    ) -> Rebuild<'a> {
        let mut loc = vec![Loc::Outside; trace.memory.len()];
        for (pi, part) in parts.iter().enumerate() {
            for (pos, &e) in part.pred.iter().enumerate() {
                if let Some(slot) = loc.get_mut(e) {
                    *slot = Loc::Predecessor(pi, pos);
                }
            }
        }
        for (pi, part) in parts.iter().enumerate() {
            for (pos, &e) in part.events.iter().enumerate() {
                if let Some(slot) = loc.get_mut(e) {
                    *slot = Loc::Template(pi, pos);
                }
            }
        }
        let max_addr = trace.memory.iter().map(|m| m.addr).max().unwrap_or(0);
        Rebuild {
            trace,
            frames,
            stacks,
            parts,
            copies,
            loc,
            partner: pair(&trace.memory),
            next_addr: (max_addr | 0xFFFF).saturating_add(1),
            strip: true,
        }
    }

    fn fresh(&mut self) -> u64 {
        let a = self.next_addr;
        self.next_addr = self.next_addr.saturating_add(64);
        a
    }

    fn loc(&self, e: usize) -> Loc {
        self.loc.get(e).copied().unwrap_or(Loc::Outside)
    }

    fn is_alloc(&self, e: usize) -> bool {
        self.trace.memory.get(e).is_some_and(|m| m.bytes > 0)
    }

    fn addr(&self, e: usize) -> u64 {
        self.trace.memory.get(e).map_or(0, |m| m.addr)
    }

    /// The template event of part `pi` at the position aligned with the
    /// predecessor's event `e`.
    fn template_twin(&self, e: usize) -> Option<usize> {
        let Loc::Predecessor(pi, pos) = self.loc(e) else {
            return None;
        };
        let part = self.parts.get(pi)?;
        let t = (*part.p2t.get(pos)?)?;
        part.events.get(t).copied()
    }

    /// The addresses of every template event in every copy, and the frees
    /// added after an event outside the template (blocks every copy keeps).
    fn plan(&mut self) -> (Plan, Vec<(usize, u64)>) {
        let k = self.copies;
        let mut plan: Plan = HashMap::new();
        let mut extra: Vec<(usize, u64)> = Vec::new();
        let template: Vec<(usize, usize, usize)> = self
            .parts
            .iter()
            .enumerate()
            .flat_map(|(pi, p)| {
                p.events
                    .iter()
                    .enumerate()
                    .map(move |(pos, &e)| (pi, pos, e))
            })
            .collect();
        for &(pi, pos, a) in &template {
            if !self.is_alloc(a) {
                continue;
            }
            let f = self.partner.get(a).copied().flatten();
            let floc = f.map(|f| self.loc(f));
            let stack = self.parts.get(pi).map_or(0, |p| p.stack);
            let same_stack = |l: Option<Loc>, parts: &[Part]| match l {
                Some(Loc::Template(q, _)) | Some(Loc::Predecessor(q, _)) => {
                    parts.get(q).is_some_and(|p| p.stack == stack)
                }
                _ => false,
            };
            match floc {
                Some(Loc::Template(..)) if same_stack(floc, &self.parts) => {
                    let f = f.unwrap_or(a);
                    for c in 1..=k {
                        let x = self.fresh();
                        plan.insert((a, c), Some(x));
                        plan.insert((f, c), Some(x));
                    }
                    continue;
                }
                Some(Loc::Predecessor(..)) if same_stack(floc, &self.parts) => {
                    // Backward chain: the block below frees what this one made.
                    if let Some(g) = f.and_then(|f| self.template_twin(f)) {
                        if !self.is_alloc(g) {
                            let original = self.addr(g);
                            for c in 1..=k {
                                let x = self.fresh();
                                plan.insert((a, c), Some(x));
                                plan.insert((g, c - 1), Some(x));
                            }
                            plan.insert((g, k), Some(original));
                            continue;
                        }
                    }
                }
                _ => {}
            }
            // Forward chain: the predecessor's twin is freed by the template.
            let twin = self
                .parts
                .get(pi)
                .and_then(|p| {
                    p.t2p
                        .get(pos)
                        .copied()
                        .flatten()
                        .and_then(|q| p.pred.get(q))
                })
                .copied();
            let chain = twin
                .filter(|&e| self.is_alloc(e))
                .and_then(|e| self.partner.get(e).copied().flatten())
                .filter(|&h| matches!(self.loc(h), Loc::Template(q, _) if self.parts.get(q).is_some_and(|p| p.stack == stack)));
            if let Some(g) = chain {
                let original = self.addr(a);
                for c in 0..k {
                    let x = self.fresh();
                    plan.insert((a, c), Some(x));
                    plan.insert((g, c + 1), Some(x));
                }
                plan.insert((a, k), Some(original));
                continue;
            }
            // Kept by every block.
            for c in 1..=k {
                let x = self.fresh();
                plan.insert((a, c), Some(x));
                if let Some(f) = f {
                    extra.push((f, x));
                }
            }
        }
        // Frees of tensors from outside the block that no rule re-linked:
        // in forward the last block frees them (their last reader), in
        // backward the template does (it runs last).
        for &(pi, _, g) in &template {
            if self.is_alloc(g) || plan.contains_key(&(g, k)) {
                continue;
            }
            if self.parts.get(pi).is_some_and(|p| p.kind == Kind::Forward) {
                let original = self.addr(g);
                plan.insert((g, 0), None);
                plan.insert((g, k), Some(original));
            }
        }
        (plan, extra)
    }

    /// The rebuilt trace: every event of the trace moved by the copies
    /// inserted before it, and each copied segment's `[memory]` events, ops,
    /// Python frames, annotations and flows emitted once per copy. One
    /// function because every kind of event takes the same time map.
    fn build(mut self) -> Trace {
        let (plan, extra) = self.plan();
        let k = self.copies;
        let trace = self.trace;
        let insertions: Vec<(i64, bool, i64)> = self
            .parts
            .iter()
            .map(|p| match p.kind {
                Kind::Forward | Kind::Step => (p.seg.end, true, p.seg.len() * i64::from(k)),
                Kind::Backward => (p.seg.start, false, p.seg.len() * i64::from(k)),
            })
            .collect();
        let shift = |t: i64| -> i64 {
            insertions
                .iter()
                .filter(|&&(at, after, _)| if after { t > at } else { t >= at })
                .map(|&(_, _, len)| len)
                .sum()
        };
        // The time of copy c of an event at t of part p.
        let copy_time = |p: &Part, t: i64, c: u32| -> i64 {
            let d = p.seg.len() * i64::from(c);
            match p.kind {
                Kind::Forward | Kind::Step => t + shift(t) + d,
                Kind::Backward => t + shift(t) - d,
            }
        };

        // [memory]
        let mut memory: Vec<(i64, usize, u32, u32, MemoryEvent)> = Vec::new();
        let mut extra_after: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for (f, x) in extra {
            extra_after.entry(f).or_default().push(x);
        }
        for (e, m) in trace.memory.iter().enumerate() {
            let t = m.ts.get();
            let t2 = t + shift(t);
            let addr = match plan.get(&(e, 0)) {
                Some(None) => None,
                Some(Some(x)) => Some(*x),
                None => Some(m.addr),
            };
            if let Some(addr) = addr {
                memory.push((
                    t2,
                    e,
                    0,
                    0,
                    MemoryEvent {
                        ts: Nanos(t2),
                        addr,
                        ..m.clone()
                    },
                ));
            }
            if let Some(xs) = extra_after.get(&e) {
                for (j, &x) in xs.iter().enumerate() {
                    let j = u32::try_from(j + 1).unwrap_or(u32::MAX);
                    memory.push((
                        t2,
                        e,
                        0,
                        j,
                        MemoryEvent {
                            ts: Nanos(t2),
                            addr: x,
                            ..m.clone()
                        },
                    ));
                }
            }
        }
        for p in &self.parts {
            for &e in &p.events {
                let Some(m) = trace.memory.get(e) else {
                    continue;
                };
                for c in 1..=k {
                    if let Some(Some(x)) = plan.get(&(e, c)) {
                        let t = copy_time(p, m.ts.get(), c);
                        memory.push((
                            t,
                            e,
                            c,
                            0,
                            MemoryEvent {
                                ts: Nanos(t),
                                addr: *x,
                                ..m.clone()
                            },
                        ));
                    }
                }
            }
        }
        memory.sort_by_key(|&(t, e, c, j, _)| (t, c, e, j));
        let mut out = trace.clone();
        out.memory = memory.into_iter().map(|(_, _, _, _, m)| m).collect();
        retotal(&mut out.memory, base_total(&trace.memory));

        let spans = |start: i64, dur: i64| -> (i64, i64) {
            let s = start + shift(start);
            let e = start + dur;
            (s, e + shift(e) - s)
        };
        let copied = |start: i64, dur: i64| -> Option<&Part> {
            self.parts
                .iter()
                .find(|p| p.seg.holds_span(start, start + dur))
        };

        // ops, with sequence numbers renumbered in call order afterwards
        let ext_span = trace
            .ops
            .iter()
            .filter_map(|o| o.external_id)
            .max()
            .unwrap_or(0)
            + 1;
        let mut ops: Vec<(OpEvent, u32, Option<i64>)> = Vec::new();
        for o in &trace.ops {
            let (s, d) = spans(o.start.get(), o.dur.get());
            ops.push((
                OpEvent {
                    start: Nanos(s),
                    dur: Nanos(d),
                    ..o.clone()
                },
                0,
                o.sequence_number,
            ));
            if let Some(p) = copied(o.start.get(), o.dur.get()) {
                for c in 1..=k {
                    let s = copy_time(p, o.start.get(), c);
                    ops.push((
                        OpEvent {
                            start: Nanos(s),
                            external_id: o.external_id.map(|x| x + ext_span * i64::from(c)),
                            ..o.clone()
                        },
                        c,
                        o.sequence_number,
                    ));
                }
            }
        }
        ops.sort_by_key(|(o, c, _)| (o.start, std::cmp::Reverse(o.dur), *c));
        renumber_sequences(&mut ops);
        out.ops = ops.into_iter().map(|(o, _, _)| o).collect();

        // Python frames: copies get new ids; module frames are renumbered.
        let names = Renumber::new(self.frames, self.stacks, k);
        let mut interner = Interner::new(trace);
        let py_span = super::names::python_id_stride(trace);
        let copied_ids: BTreeSet<i64> = trace
            .python
            .iter()
            .filter(|p| copied(p.start.get(), p.dur.get()).is_some())
            .filter_map(|p| p.id)
            .collect();
        let mut python = Vec::new();
        for (i, p) in trace.python.iter().enumerate() {
            let (s, d) = spans(p.start.get(), p.dur.get());
            let mut orig = p.clone();
            orig.start = Nanos(s);
            orig.dur = Nanos(d);
            if let Some((name, module_id)) = names.original(i) {
                orig.name = interner.id(&mut out, &name);
                orig.module_id = module_id.or(orig.module_id);
            }
            python.push(orig);
            if let Some(part) = copied(p.start.get(), p.dur.get()) {
                for c in 1..=k {
                    let mut copy = p.clone();
                    copy.start = Nanos(copy_time(part, p.start.get(), c));
                    copy.id = p.id.map(|x| x + py_span * i64::from(c));
                    copy.parent_id = p.parent_id.map(|x| {
                        if copied_ids.contains(&x) {
                            x + py_span * i64::from(c)
                        } else {
                            x
                        }
                    });
                    if let Some((name, module_id)) = names.copy(i, part.stack, c) {
                        copy.name = interner.id(&mut out, &name);
                        copy.module_id = module_id.or(copy.module_id);
                    }
                    python.push(copy);
                }
            }
        }
        python.sort_by_key(|p| (p.start, std::cmp::Reverse(p.dur)));
        out.python = python;

        let mut annotations = Vec::new();
        for a in &trace.annotations {
            let (s, d) = spans(a.start.get(), a.dur.get());
            annotations.push(crate::trace::AnnotationEvent {
                start: Nanos(s),
                dur: Nanos(d),
                ..a.clone()
            });
            if let Some(part) = copied(a.start.get(), a.dur.get()) {
                for c in 1..=k {
                    annotations.push(crate::trace::AnnotationEvent {
                        start: Nanos(copy_time(part, a.start.get(), c)),
                        ..a.clone()
                    });
                }
            }
        }
        annotations.sort_by_key(|a| (a.start, std::cmp::Reverse(a.dur)));
        out.annotations = annotations;

        let flow_span = trace.flows.iter().map(|f| f.id).max().unwrap_or(0).max(0) + 1;
        let mut flows = Vec::new();
        for f in &trace.flows {
            let t = f.ts.get();
            flows.push(crate::trace::FlowEvent {
                ts: Nanos(t + shift(t)),
                ..f.clone()
            });
            if let Some(part) = self.parts.iter().find(|p| p.seg.holds(t)) {
                for c in 1..=k {
                    flows.push(crate::trace::FlowEvent {
                        id: f.id + flow_span * i64::from(c),
                        ts: Nanos(copy_time(part, t, c)),
                        ..f.clone()
                    });
                }
            }
        }
        flows.sort_by_key(|f| f.ts);
        out.flows = flows;
        if self.strip {
            strip_first_step_state(&mut out);
        }
        out
    }
}
