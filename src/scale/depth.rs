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
//!   is kept by every copy and freed where the template's is. The gradient
//!   of a tensor every block reads (a decoder's encoder output) is summed
//!   out of place once, by the first block backward runs, and in place by
//!   every later one (`InputBuffer::accumulate`): where the template makes
//!   such a sum and the predecessor does not, the earliest copy makes it and
//!   the others add in place, freeing their first contribution as it
//!   arrives.
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

use std::collections::BTreeSet;

use super::copy::{self, Copies, Extra, Place, Repeat, Seg, When};
use super::events::{pair, strip_first_step_state};
use super::frames::{self, ModuleFrame, Stack};
use super::names::Renumber;
use super::parts::{events_in, part, Kind, Part};
use super::{DepthFacts, ScaleError, StackFacts};
use crate::diag::Warning;
use crate::trace::{OpEvent, Trace};
use crate::units::Bytes;

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
            template: format!("{}_{}", stack.class, stack.last()),
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
    let plan = Links::new(trace, &parts).plan(trace, &frames, &stacks, copies);
    let mut rebuilt = copy::apply(trace, &plan);
    if strip {
        strip_first_step_state(&mut rebuilt);
    }
    Ok((rebuilt, facts))
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

/// Where each `[memory]` event lies among the parts, and each allocation's
/// free: what the plan links by.
struct Links<'a> {
    trace: &'a Trace,
    ops: OpsByStart<'a>,
    parts: &'a [Part],
    loc: Vec<Loc>,
    partner: Vec<Option<usize>>,
}

impl<'a> Links<'a> {
    fn new(trace: &'a Trace, parts: &'a [Part]) -> Links<'a> {
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
        Links {
            trace,
            // Only a backward part is searched for the engine's sums: a
            // forward-only rebuild does not sort the ops for it.
            ops: OpsByStart::new(trace, parts.iter().any(|p| p.kind == Kind::Backward)),
            parts,
            loc,
            partner: pair(&trace.memory),
        }
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

    fn partner(&self, e: usize) -> Option<usize> {
        self.partner.get(e).copied().flatten()
    }

    /// Whether `l` lies in a part (template or predecessor) of `stack`.
    fn in_stack(&self, l: Loc, stack: usize) -> bool {
        match l {
            Loc::Template(q, _) | Loc::Predecessor(q, _) => {
                self.parts.get(q).is_some_and(|p| p.stack == stack)
            }
            Loc::Outside => false,
        }
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

    /// The template's backward allocations that add two gradient
    /// contributions out of place ([`OpsByStart::is_accumulation`]) where the
    /// predecessor, which runs after it, makes none at the aligned place.
    fn first_accumulations(&self) -> BTreeSet<usize> {
        let backward = || self.parts.iter().filter(|p| p.kind == Kind::Backward);
        let accumulations: BTreeSet<usize> = backward()
            .flat_map(|p| p.events.iter().chain(&p.pred).copied())
            .filter(|&e| self.is_alloc(e) && self.ops.is_accumulation(e))
            .collect();
        backward()
            .flat_map(|p| {
                p.events.iter().enumerate().filter_map(|(pos, &e)| {
                    let twin = p
                        .t2p
                        .get(pos)
                        .copied()
                        .flatten()
                        .and_then(|q| p.pred.get(q));
                    (accumulations.contains(&e) && !twin.is_some_and(|t| accumulations.contains(t)))
                        .then_some(e)
                })
            })
            .collect()
    }

    /// For the out-of-place accumulation at position `pos` of part `pi`:
    /// the free of its first operand (the first free after it, in the
    /// same engine call), that operand's allocation in the same part, and
    /// the end of the engine call that made it.
    fn first_contribution(&self, pi: usize, pos: usize) -> Option<(usize, usize, i64)> {
        let part = self.parts.get(pi)?;
        let &a = part.events.get(pos)?;
        let call = self.ops.engine_call(a)?;
        let free = part
            .events
            .iter()
            .skip(pos + 1)
            .copied()
            .take_while(|&e| {
                self.trace
                    .memory
                    .get(e)
                    .is_some_and(|m| m.ts.get() <= call.1)
            })
            .find(|&e| !self.is_alloc(e))?;
        let alloc = self.partner(free)?;
        if !matches!(self.loc(alloc), Loc::Template(q, _) if q == pi) {
            return None;
        }
        Some((free, alloc, self.ops.engine_call(alloc)?.1))
    }

    /// The copies of every part and the address of every template event in
    /// every copy, by how the block's tensors cross blocks:
    /// - freed in a part of the same block (a temporary, a saved
    ///   activation freed in backward): each copy its own;
    /// - freed by the predecessor in backward (the gradient of the block's
    ///   input), or its predecessor's twin freed by the template in forward
    ///   (the residual stream): a chain through the copies, in the order
    ///   they run;
    /// - anything else the block makes (a KV-cache entry, a gradient, a
    ///   cast weight): kept by every copy and freed where the template's is.
    ///
    /// A tensor from outside the block that no rule links is freed by the
    /// last block that runs: in forward the last copy, in backward (and in
    /// an optimizer loop) the template. One function: the rules are tried in
    /// turn for each allocation.
    fn plan(&self, trace: &Trace, frames: &[ModuleFrame], stacks: &[Stack], k: u32) -> Copies {
        let mut plan = Copies::new(trace, k);
        plan.names = Some(Renumber::new(frames, stacks, k));
        plan.repeats = self
            .parts
            .iter()
            .map(|p| Repeat {
                seg: p.seg,
                place: match p.kind {
                    Kind::Forward | Kind::Step => Place::After,
                    Kind::Backward => Place::Before,
                },
                stack: Some(p.stack),
                events: p.events.clone(),
            })
            .collect();
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
        let first_only = self.first_accumulations();
        for &(pi, pos, a) in &template {
            if !self.is_alloc(a) {
                continue;
            }
            let f = self.partner(a);
            let floc = f.map(|f| self.loc(f));
            let stack = self.parts.get(pi).map_or(0, |p| p.stack);
            let same_stack = floc.is_some_and(|l| self.in_stack(l, stack));
            // A gradient buffer of a tensor every block reads (a decoder's
            // encoder output, a shared position bias): the engine adds a
            // second contribution out of place only while the buffer does
            // not own its sum, so once per backward pass, in the first block
            // that runs it, and in place after (`InputBuffer::accumulate`,
            // torch/csrc/autograd/input_buffer.cpp). The template ran first
            // in the trace, the predecessor after it shows a later block; in
            // the deeper job the first copy (`k`, which runs earliest) makes
            // the sum, and the template and the other copies add in place.
            // A block adding in place frees its first contribution as it
            // arrives, at the end of the engine's call that made it, where
            // the first block stored it to add it to the second.
            if first_only.contains(&a) && !matches!(floc, Some(Loc::Template(..)) if same_stack) {
                let first = self.first_contribution(pi, pos);
                for c in 0..k {
                    plan.addr.insert((a, c), None);
                    let Some((free, alloc, arrival)) = first else {
                        continue;
                    };
                    let addr = match plan.addr.get(&(alloc, c)) {
                        Some(Some(x)) => *x,
                        Some(None) => continue,
                        None => self.addr(alloc),
                    };
                    plan.addr.insert((free, c), None);
                    plan.extra.push(Extra {
                        when: When::In {
                            repeat: pi,
                            copy: c,
                            ts: arrival,
                        },
                        like: free,
                        addr,
                        bytes: trace.memory.get(free).map_or(0, |m| m.bytes),
                    });
                }
                // A fresh address: the template's own events keep theirs,
                // and its later blocks may reuse the sum's.
                let x = plan.fresh();
                plan.addr.insert((a, k), Some(x));
                if let Some(f) = f {
                    plan.addr.insert((f, 0), Some(x));
                }
                continue;
            }
            match floc {
                Some(Loc::Template(..)) if same_stack => {
                    let f = f.unwrap_or(a);
                    for c in 1..=k {
                        let x = plan.fresh();
                        plan.addr.insert((a, c), Some(x));
                        plan.addr.insert((f, c), Some(x));
                    }
                    continue;
                }
                Some(Loc::Predecessor(..)) if same_stack => {
                    // Backward chain: the block below frees what this one made.
                    if let Some(g) = f.and_then(|f| self.template_twin(f)) {
                        if !self.is_alloc(g) {
                            let original = self.addr(g);
                            for c in 1..=k {
                                let x = plan.fresh();
                                plan.addr.insert((a, c), Some(x));
                                plan.addr.insert((g, c - 1), Some(x));
                            }
                            plan.addr.insert((g, k), Some(original));
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
                .and_then(|e| self.partner(e))
                .filter(|&h| {
                    matches!(self.loc(h), Loc::Template(..)) && self.in_stack(self.loc(h), stack)
                });
            if let Some(g) = chain {
                let original = self.addr(a);
                for c in 0..k {
                    let x = plan.fresh();
                    plan.addr.insert((a, c), Some(x));
                    plan.addr.insert((g, c + 1), Some(x));
                }
                plan.addr.insert((a, k), Some(original));
                continue;
            }
            // Kept by every block.
            for c in 1..=k {
                let x = plan.fresh();
                plan.addr.insert((a, c), Some(x));
                if let Some(f) = f {
                    let bytes = trace.memory.get(f).map_or(0, |m| m.bytes);
                    plan.extra.push(Extra {
                        when: When::After(f),
                        like: f,
                        addr: x,
                        bytes,
                    });
                }
            }
        }
        // Frees of tensors from outside the block that no rule re-linked:
        // in forward the last block frees them (their last reader), in
        // backward the template does (it runs last).
        for &(pi, _, g) in &template {
            if self.is_alloc(g) || plan.addr.contains_key(&(g, k)) {
                continue;
            }
            if self.parts.get(pi).is_some_and(|p| p.kind == Kind::Forward) {
                let original = self.addr(g);
                plan.addr.insert((g, 0), None);
                plan.addr.insert((g, k), Some(original));
            }
        }
        plan
    }
}

/// The trace's ops by start, to find the ops around a `[memory]` event.
struct OpsByStart<'a> {
    trace: &'a Trace,
    order: Vec<usize>,
    starts: Vec<i64>,
}

impl<'a> OpsByStart<'a> {
    /// The ops of `trace` by start, or none where `needed` is false.
    fn new(trace: &'a Trace, needed: bool) -> OpsByStart<'a> {
        let count = if needed { trace.ops.len() } else { 0 };
        let mut order: Vec<usize> = (0..count).collect();
        order.sort_by_key(|&i| trace.ops.get(i).map_or(0, |o| o.start.get()));
        let starts = order
            .iter()
            .map(|&i| trace.ops.get(i).map_or(0, |o| o.start.get()))
            .collect();
        OpsByStart {
            trace,
            order,
            starts,
        }
    }

    /// The ops around `[memory]` event `e` on its thread, innermost first
    /// (a bounded look back: an engine's call holds a few ops).
    fn around(&self, e: usize) -> impl Iterator<Item = &'a OpEvent> + '_ {
        let trace = self.trace;
        let (ts, tid) = trace
            .memory
            .get(e)
            .map_or((i64::MIN, i64::MIN), |m| (m.ts.get(), m.tid));
        let end = self.starts.partition_point(|&s| s <= ts);
        self.order
            .get(end.saturating_sub(64)..end)
            .unwrap_or(&[])
            .iter()
            .rev()
            .filter_map(move |&i| trace.ops.get(i))
            .filter(move |o| o.tid == tid && o.start.get() + o.dur.get() >= ts)
    }

    /// Whether the autograd engine made allocation `e` to add two gradient
    /// contributions out of place: an `aten::add` run directly by the
    /// engine's call of a node, not by a node's own formula.
    fn is_accumulation(&self, e: usize) -> bool {
        let mut ops = self.around(e);
        let (Some(inner), Some(outer)) = (ops.next(), ops.next()) else {
            return false;
        };
        self.trace.name(inner.name) == "aten::add"
            && self
                .trace
                .name(outer.name)
                .starts_with(frames::AUTOGRAD_NODE)
    }

    /// The innermost engine call of a node around `[memory]` event `e`,
    /// as its (start, end).
    fn engine_call(&self, e: usize) -> Option<(i64, i64)> {
        self.around(e)
            .find(|o| self.trace.name(o.name).starts_with(frames::AUTOGRAD_NODE))
            .map(|o| (o.start.get(), o.start.get() + o.dur.get()))
    }
}
