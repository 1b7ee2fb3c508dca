//! The orchestrated job as the simulator and the report read it: a stream
//! of allocation and free events ([`JobRef::for_each`]), never required to
//! be held whole.
//!
//! A job is either a [`Schedule`] (the orchestrator's flat allocation
//! sequence) or a [`Program`]: a schedule described once with its repeated
//! parts (a block's copies, the decode steps), expanded as it streams, so
//! a rebuilt job of hundreds of millions of events is simulated in memory
//! bounded by its trace.
//!
//! Invariants: the events come in schedule order; a block is named by a
//! `u64` unique in the job, allocated once and freed at most once after.

mod build;
mod derive;
mod facts;
mod fast;
mod live;
mod steps;
#[cfg(test)]
mod testing;

pub(crate) use build::Grid;
pub(crate) use facts::grown_text;
use fast::FastLeaf;
use rustc_hash::{FxHashMap, FxHashSet};
pub(crate) use steps::Steps;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::ControlFlow;

use serde::{Deserialize, Serialize};

use crate::kernels::{ArchSet, KernelNote, PerGpu};
use crate::orchestrator::{
    Category, EventKind, IterationSpan, Phase, PhaseWindow, Schedule, ScheduledBlock,
};
use crate::presets::GpuTarget;
use crate::units::{Bytes, Nanos};

/// A kind of block whose size depends on the GPU: the architectures whose
/// kernels make it, and its size per GPU where that depends on more.
pub type SizeVariant = (ArchSet, Option<PerGpu>);

/// One event of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobEvent {
    /// Nanoseconds since the start of the schedule.
    pub time: Nanos,
    pub kind: EventKind,
    /// The block it allocates or frees.
    pub block: u64,
    /// The block's requested size (for [`Category::Workspace`] a
    /// placeholder the simulation replaces).
    pub size: Bytes,
    pub category: Category,
    /// The architectures whose kernels make the block.
    pub on: ArchSet,
    /// Its size where that depends on the GPU.
    pub per_gpu: Option<PerGpu>,
    /// Where the block's other facts are ([`JobRef::block_facts`]).
    pub facts: FactsRef,
}

impl JobEvent {
    /// The block's bytes on `target` (as [`ScheduledBlock::size_on`]).
    pub fn size_on(&self, target: &GpuTarget) -> Bytes {
        crate::orchestrator::bytes_on(self.size, self.category, self.on, self.per_gpu, target)
    }
}

/// A handle on a block's facts (its op, layer, phase, iteration), read
/// only for the few blocks a report names: its item, and for a program's
/// the copy it is of, per dimension.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FactsRef {
    pub(crate) item: u32,
    pub(crate) copy: [u32; 2],
}

/// What a block is, besides its size and category.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockFacts {
    pub phase: Phase,
    pub iteration: Option<u32>,
    pub op: Option<String>,
    pub layer: Option<String>,
}

/// The job an estimate simulates.
#[derive(Debug, Clone, Copy)]
pub enum JobRef<'a> {
    Schedule(&'a Schedule),
    Program(&'a Program),
}

impl<'a> JobRef<'a> {
    /// Events in the job.
    pub fn n_events(&self) -> u64 {
        match self {
            JobRef::Schedule(s) => s.events.len() as u64,
            JobRef::Program(p) => p.n_events,
        }
    }

    /// Blocks in the job.
    pub fn n_blocks(&self) -> u64 {
        match self {
            JobRef::Schedule(s) => s.blocks.len() as u64,
            JobRef::Program(p) => p.n_blocks,
        }
    }

    /// The times of the first and the last event.
    pub fn time_range(&self) -> Option<(Nanos, Nanos)> {
        match self {
            JobRef::Schedule(s) => Some((s.events.first()?.time, s.events.last()?.time)),
            JobRef::Program(p) => p.time_range,
        }
    }

    /// The simulated iterations' spans.
    pub fn iterations(&self) -> Cow<'a, [IterationSpan]> {
        match self {
            JobRef::Schedule(s) => Cow::Borrowed(&s.iterations),
            JobRef::Program(p) => Cow::Borrowed(&p.iterations),
        }
    }

    /// The phases of every simulated iteration, in time order.
    pub fn phases(&self) -> Cow<'a, [PhaseWindow]> {
        match self {
            JobRef::Schedule(s) => Cow::Borrowed(&s.phases),
            JobRef::Program(p) => Cow::Borrowed(&p.phases),
        }
    }

    /// The kinds of block whose size depends on the GPU (made by some
    /// architectures' kernels only, or sized per GPU), each once, in a
    /// fixed order: what decides whether two GPUs run the same simulation.
    pub fn size_variants(&self) -> Vec<SizeVariant> {
        let mut out: Vec<SizeVariant> = Vec::new();
        let mut seen: FxHashSet<SizeVariant> = FxHashSet::default();
        let mut add = |on: ArchSet, per_gpu: Option<PerGpu>| {
            if (!on.is_all() || per_gpu.is_some()) && seen.insert((on, per_gpu)) {
                out.push((on, per_gpu));
            }
        };
        match self {
            JobRef::Schedule(s) => s.blocks.iter().for_each(|b| add(b.on, b.per_gpu)),
            JobRef::Program(p) => p.keys.iter().for_each(|k| add(k.on, k.per_gpu)),
        }
        out
    }

    /// The kernels the job assumes, per architecture.
    pub fn kernels(&self) -> Cow<'a, [KernelNote]> {
        match self {
            JobRef::Schedule(s) => Cow::Borrowed(&s.kernels),
            JobRef::Program(p) => Cow::Borrowed(&p.kernels),
        }
    }

    /// Calls `f` with each event in order until it breaks.
    pub fn for_each<F: FnMut(&JobEvent) -> ControlFlow<()>>(&self, f: F) {
        self.for_each_from(0, f);
    }

    /// Calls `f` with each event from the `from`-th on, in order, until it
    /// breaks; the events before are not made (a program skips whole
    /// copies of its runs).
    pub fn for_each_from<F: FnMut(&JobEvent) -> ControlFlow<()>>(&self, from: u64, mut f: F) {
        match self {
            JobRef::Schedule(s) => {
                let mut index = 0u64;
                for e in &s.events {
                    let Some(block) = s.block(e.block) else {
                        continue;
                    };
                    index += 1;
                    if index <= from {
                        continue;
                    }
                    let event = JobEvent {
                        time: e.time,
                        kind: e.kind,
                        block: u64::from(e.block.0),
                        size: block.size,
                        category: block.category,
                        on: block.on,
                        per_gpu: block.per_gpu,
                        facts: FactsRef {
                            item: e.block.0,
                            copy: [0, 0],
                        },
                    };
                    if f(&event).is_break() {
                        return;
                    }
                }
            }
            JobRef::Program(p) => p.for_each_from(from, &mut f),
        }
    }

    /// The runs of decode steps among the job's top-level parts, each step
    /// a fixed list of events (none for a schedule).
    pub fn step_runs(&self) -> Vec<StepRun> {
        match self {
            JobRef::Schedule(_) => Vec::new(),
            JobRef::Program(p) => p.step_runs(),
        }
    }

    /// [`Program::first_steps_fixed`] (none for a schedule).
    pub fn first_steps_fixed(&self) -> Option<StepRun> {
        match self {
            JobRef::Schedule(_) => None,
            JobRef::Program(p) => p.first_steps_fixed(),
        }
    }

    /// The blocks live right after event `index`, as the events that
    /// allocated them, in allocation order; and that event itself.
    pub fn live_after(&self, index: u64) -> (Vec<JobEvent>, Option<JobEvent>) {
        if let JobRef::Program(p) = self {
            return p.live_after(index);
        }
        let mut live: BTreeMap<u64, (u64, JobEvent)> = BTreeMap::new();
        let mut at = None;
        let mut position = 0u64;
        self.for_each(|e: &JobEvent| {
            match e.kind {
                EventKind::Alloc => {
                    live.insert(e.block, (position, *e));
                }
                EventKind::Free => {
                    live.remove(&e.block);
                }
            }
            if position == index {
                at = Some(*e);
                return ControlFlow::Break(());
            }
            position += 1;
            ControlFlow::Continue(())
        });
        let mut ordered: Vec<(u64, JobEvent)> = live.into_values().collect();
        ordered.sort_unstable_by_key(|&(position, e)| (position, e.block));
        (ordered.into_iter().map(|(_, e)| e).collect(), at)
    }

    /// The facts of the block `facts` names.
    pub fn block_facts(&self, facts: FactsRef) -> Option<BlockFacts> {
        match self {
            JobRef::Schedule(s) => s.blocks.get(facts.item as usize).map(ScheduledBlock::facts),
            JobRef::Program(p) => p.block_facts(facts),
        }
    }
}

impl ScheduledBlock {
    fn facts(&self) -> BlockFacts {
        BlockFacts {
            phase: self.phase,
            iteration: self.iteration,
            op: self.op.clone(),
            layer: self.layer.clone(),
        }
    }
}

/// Calls `f` with each leaf of `nodes` (its index) and the terms its
/// numbers take there, with `extra` added copies per dimension, until it
/// breaks.
pub(crate) fn walk_nodes<F: FnMut(u32, &Leaf, &Terms) -> ControlFlow<()>>(
    nodes: &[Node],
    leaves: &[Leaf],
    extra: [i64; 2],
    f: &mut F,
) {
    let _ = walk_vars(nodes, leaves, [0, extra[0], 0, extra[1]], f);
}

/// [`walk_nodes`] at the variables `vars` (each run's copy number and the
/// copies added, per dimension): what a walk does inside one copy.
fn walk_vars<F: FnMut(u32, &Leaf, &Terms) -> ControlFlow<()>>(
    nodes: &[Node],
    leaves: &[Leaf],
    vars: [i64; 4],
    f: &mut F,
) -> ControlFlow<()> {
    let terms = Terms::of(vars);
    for node in nodes {
        match node {
            Node::Leaf(i) => {
                if let Some(leaf) = leaves.get(*i as usize) {
                    f(*i, leaf, &terms)?;
                }
            }
            Node::Run { dim, body } => {
                let (copy, copies) = dim.slot(vars);
                for c in 0..copies {
                    walk_vars(body, leaves, with_copy(vars, copy, c), f)?;
                }
            }
        }
    }
    ControlFlow::Continue(())
}

/// `vars` with copy number `c` in place `slot`.
fn with_copy(vars: [i64; 4], slot: usize, c: i64) -> [i64; 4] {
    let mut inner = vars;
    if let Some(s) = inner.get_mut(slot) {
        *s = c;
    }
    inner
}

/// The two ways a rebuilt job repeats: more blocks, more decode steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dim {
    Depth,
    Tokens,
}

impl Dim {
    /// Where a copy's number of this dimension is among a walk's
    /// variables, and how many copies the job adds.
    fn slot(self, vars: [i64; 4]) -> (usize, i64) {
        match self {
            Dim::Depth => (0, vars[1]),
            Dim::Tokens => (2, vars[3]),
        }
    }
}

/// The variables a program's numbers are written in: the copy's number
/// inside a run of block copies and the block copies added, the same for
/// decode steps. A term of a [`Poly`] is a product of some of them, named
/// by the set of their bits.
pub(crate) const C_DEPTH: usize = 1;
pub(crate) const J_DEPTH: usize = 2;
pub(crate) const C_TOKENS: usize = 4;
pub(crate) const J_TOKENS: usize = 8;

/// A number of a program's item: a sum of products of the variables
/// ([`C_DEPTH`] …), each variable at most once in a product; `terms` marks
/// the non-zero coefficients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Poly {
    c: [i64; 16],
    terms: u16,
}

impl Poly {
    /// Adds `coef` to the term of the variables `mask`.
    pub(crate) fn add(&mut self, mask: usize, coef: i64) {
        if let Some(slot) = self.c.get_mut(mask & 15) {
            *slot = slot.saturating_add(coef);
            if *slot != 0 {
                self.terms |= 1 << (mask & 15);
            } else {
                self.terms &= !(1 << (mask & 15));
            }
        }
    }

    /// The value where the terms are `terms` (saturating).
    pub(crate) fn at(&self, terms: &Terms) -> i64 {
        let mut sum = 0i64;
        let mut left = self.terms;
        while left != 0 {
            let mask = left.trailing_zeros() as usize;
            left &= left - 1;
            let (Some(&c), Some(&t)) = (self.c.get(mask), terms.t.get(mask)) else {
                continue;
            };
            sum = sum.saturating_add(c.saturating_mul(t));
        }
        sum
    }
}

/// The variables at one place of a walk (indexed by their bit's place)
/// and the value of every term there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Terms {
    vars: [i64; 4],
    t: [i64; 16],
}

impl Terms {
    /// The terms of the variables `vars`.
    pub(crate) fn of(vars: [i64; 4]) -> Terms {
        let mut t = [1i64; 16];
        for (mask, slot) in t.iter_mut().enumerate() {
            for (bit, v) in vars.iter().enumerate() {
                if mask & (1 << bit) != 0 {
                    *slot = slot.saturating_mul(*v);
                }
            }
        }
        Terms { vars, t }
    }
}

/// Decode steps in a row: from event `start`, `copies` steps of `events`
/// events each, every step the same list of the program's events (its
/// `node`-th top-level node's, [`Program::steps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRun {
    pub start: u64,
    pub events: u64,
    pub copies: u64,
    pub node: usize,
}

/// What an event is, besides its numbers: equal on every copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct EventKey {
    pub kind: EventKind,
    pub category: Category,
    pub phase: Phase,
    pub iteration: Option<u32>,
    /// The op's name and the layer's with its numbers as `#` (indices
    /// into [`Program::names`]); how many numbers it has.
    pub op: Option<u32>,
    pub layer: Option<u32>,
    pub numbers: u32,
    pub on: ArchSet,
    pub per_gpu: Option<PerGpu>,
}

/// One event of a program: its key and numbers ([`build::TIME`] …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Leaf {
    pub key: u32,
    pub attrs: Vec<Poly>,
}

/// A program's shape: events in order, and runs of copies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Node {
    /// An event ([`Program::leaves`]).
    Leaf(u32),
    /// `body` once per copy of `dim` the job adds.
    Run { dim: Dim, body: Vec<Node> },
}

/// A rebuilt job described once: its events with their repeated parts and
/// each number as it grows per copy, expanded as it streams
/// ([`JobRef::for_each`]); see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    nodes: Vec<Node>,
    leaves: Vec<Leaf>,
    keys: Vec<EventKey>,
    names: Vec<String>,
    /// Copies of each dimension (depth, tokens) the job adds to the
    /// program's base.
    extra: [i64; 2],
    n_events: u64,
    n_blocks: u64,
    time_range: Option<(Nanos, Nanos)>,
    iterations: Vec<IterationSpan>,
    phases: Vec<PhaseWindow>,
    kernels: Vec<KernelNote>,
    /// Each leaf's event in the form the stream reads it fastest (made
    /// with the program; a program read back without it streams from
    /// `leaves`).
    #[serde(skip)]
    fast: Vec<Option<FastLeaf>>,
}

impl Program {
    /// The program of a job whose schedules at four consecutive counts of
    /// copies of one dimension are `grid`, at the first count (the job at
    /// another is [`Program::at`]). `None` when the schedules do not grow
    /// copy by copy ([`derive`]).
    pub(crate) fn derive(grid: &Grid<&Schedule>) -> Option<Program> {
        let mut atoms = build::Atoms::default();
        let seqs = grid.map(|s| atoms.of(s));
        let (nodes, leaves) = build::program_of(
            &seqs,
            Some(&|a: &derive::Atom| {
                // An allocation by its size and layer, a free by its layer
                // (how far back its block was made moves with the copies).
                let free = atoms
                    .keys
                    .items
                    .get(a.key as usize)
                    .is_some_and(|k| k.kind == EventKind::Free);
                let from = if free {
                    build::LAYER_NUMBERS
                } else {
                    build::SIZE_OR_BACK
                };
                a.attrs.get(from..).unwrap_or(&[])
            }),
        )?;
        let [first, ..] = grid.at;
        let mut program = Program {
            nodes,
            leaves,
            keys: atoms.keys.items,
            names: atoms.names.items,
            extra: [0, 0],
            n_events: 0,
            n_blocks: 0,
            time_range: None,
            iterations: first.iterations.clone(),
            phases: first.phases.clone(),
            kernels: first.kernels.clone(),
            fast: Vec::new(),
        };
        program.fast = program
            .leaves
            .iter()
            .map(|leaf| FastLeaf::of(leaf, &program.keys))
            .collect();
        program.count_at([0, 0]);
        Some(program)
    }

    /// The same job with `extra` copies per dimension added to the first
    /// count, its iterations, phases and kernels those of `frame`.
    pub(crate) fn at(&self, extra: [i64; 2], frame: &Schedule) -> Program {
        let mut program = Program {
            iterations: frame.iterations.clone(),
            phases: frame.phases.clone(),
            kernels: frame.kernels.clone(),
            ..self.clone()
        };
        program.count_at(extra);
        program
    }

    /// The job as a schedule, held whole: what a derivation in the other
    /// dimension reads ([`crate::pipeline`]'s two-dimensional case). Blocks
    /// are numbered in the order they are allocated.
    /// `None` where an event's facts are missing (never, for a derived
    /// program).
    pub fn schedule(&self) -> Option<Schedule> {
        let capacity = usize::try_from(self.n_blocks).unwrap_or(0);
        let mut blocks = Vec::with_capacity(capacity);
        let mut events = Vec::with_capacity(capacity.saturating_mul(2));
        // The job's block numbers (its allocations' places) to ids.
        let mut ids: FxHashMap<u64, u32> = FxHashMap::default();
        let mut whole = true;
        JobRef::Program(self).for_each(|e: &JobEvent| {
            let id = match e.kind {
                EventKind::Alloc => {
                    let (Some(facts), Ok(id)) =
                        (self.block_facts(e.facts), u32::try_from(blocks.len()))
                    else {
                        whole = false;
                        return ControlFlow::Break(());
                    };
                    blocks.push(ScheduledBlock {
                        size: e.size,
                        category: e.category,
                        iteration: facts.iteration,
                        phase: facts.phase,
                        op: facts.op,
                        layer: facts.layer,
                        on: e.on,
                        per_gpu: e.per_gpu,
                    });
                    ids.insert(e.block, id);
                    id
                }
                EventKind::Free => match ids.remove(&e.block) {
                    Some(id) => id,
                    None => return ControlFlow::Continue(()),
                },
            };
            events.push(crate::orchestrator::ScheduleEvent {
                time: e.time,
                kind: e.kind,
                block: crate::orchestrator::BlockId(id),
            });
            ControlFlow::Continue(())
        });
        whole.then(|| Schedule {
            blocks,
            events,
            iterations: self.iterations.clone(),
            phases: self.phases.clone(),
            kernels: self.kernels.clone(),
        })
    }

    /// Sets `extra` and what follows from it: the events, blocks and times.
    fn count_at(&mut self, extra: [i64; 2]) {
        self.extra = extra;
        (self.n_events, self.n_blocks) = self.count(&self.nodes, extra);
        let vars = [0, extra[0], 0, extra[1]];
        let first = self.edge_time(&self.nodes, vars, false);
        let last = self.edge_time(&self.nodes, vars, true);
        self.time_range = first.zip(last).map(|(a, b)| (Nanos(a), Nanos(b)));
    }

    /// [`JobRef::step_runs`]: the top-level runs of decode steps whose
    /// body is events only.
    fn step_runs(&self) -> Vec<StepRun> {
        let mut runs = Vec::new();
        let mut position = 0u64;
        for (i, node) in self.nodes.iter().enumerate() {
            match node {
                Node::Leaf(_) => position = position.saturating_add(1),
                Node::Run { dim, body } => {
                    let copies = u64::try_from(self.extra[*dim as usize]).unwrap_or(0);
                    let (events, _) = self.count(body, self.extra);
                    let flat = body.iter().all(|n| matches!(n, Node::Leaf(_)));
                    if *dim == Dim::Tokens && flat && events > 0 && copies > 0 {
                        runs.push(StepRun {
                            start: position,
                            events,
                            copies,
                            node: i,
                        });
                    }
                    position = position.saturating_add(events.saturating_mul(copies));
                }
            }
        }
        runs
    }

    fn key(&self, leaf: &Leaf) -> Option<&EventKey> {
        self.keys.get(leaf.key as usize)
    }

    /// Events of `nodes` once and allocations among them, for `extra`.
    fn count(&self, nodes: &[Node], extra: [i64; 2]) -> (u64, u64) {
        let mut n = (0u64, 0u64);
        for node in nodes {
            let (events, allocs) = match node {
                Node::Leaf(i) => {
                    let alloc = self
                        .leaves
                        .get(*i as usize)
                        .and_then(|l| self.key(l))
                        .is_some_and(|k| k.kind == EventKind::Alloc);
                    (1, u64::from(alloc))
                }
                Node::Run { dim, body } => {
                    let k = u64::try_from(extra[*dim as usize]).unwrap_or(0);
                    let (e, a) = self.count(body, extra);
                    (e.saturating_mul(k), a.saturating_mul(k))
                }
            };
            n = (n.0.saturating_add(events), n.1.saturating_add(allocs));
        }
        n
    }

    /// The time of the first (`last` false) or last event of `nodes`, at
    /// the variables `vars`.
    fn edge_time(&self, nodes: &[Node], vars: [i64; 4], last: bool) -> Option<i64> {
        let mut order: Box<dyn Iterator<Item = &Node>> = if last {
            Box::new(nodes.iter().rev())
        } else {
            Box::new(nodes.iter())
        };
        order.find_map(|node| match node {
            Node::Leaf(i) => {
                let leaf = self.leaves.get(*i as usize)?;
                Some(leaf.attrs.get(build::TIME)?.at(&Terms::of(vars)))
            }
            Node::Run { dim, body } => {
                let (copy, copies) = dim.slot(vars);
                if copies <= 0 {
                    return None;
                }
                let c = if last { copies - 1 } else { 0 };
                self.edge_time(body, with_copy(vars, copy, c), last)
            }
        })
    }

    fn event(&self, item: u32, leaf: &Leaf, index: u64, terms: &Terms) -> Option<JobEvent> {
        if let Some(Some(fast)) = self.fast.get(item as usize) {
            return Some(fast.event(item, index, terms));
        }
        let key = self.key(leaf)?;
        let numbers = [
            leaf.attrs.get(build::TIME)?.at(terms),
            leaf.attrs.get(build::SIZE_OR_BACK)?.at(terms),
        ];
        Some(fast::Head::of(key).event(numbers, item, index, terms))
    }

    fn for_each_from<F: FnMut(&JobEvent) -> ControlFlow<()>>(&self, from: u64, f: &mut F) {
        let mut index = 0u64;
        let vars = [0, self.extra[0], 0, self.extra[1]];
        let _ = self.walk_from(
            &self.nodes,
            vars,
            from,
            &mut index,
            &mut |item, leaf, terms, at| match self.event(item, leaf, at, terms) {
                Some(e) => f(&e),
                None => ControlFlow::Continue(()),
            },
        );
    }

    /// [`walk_vars`] from the `from`-th event on, counting the events in
    /// `position`: a copy of a run that ends before `from` is counted, not
    /// walked.
    fn walk_from<F: FnMut(u32, &Leaf, &Terms, u64) -> ControlFlow<()>>(
        &self,
        nodes: &[Node],
        vars: [i64; 4],
        from: u64,
        position: &mut u64,
        f: &mut F,
    ) -> ControlFlow<()> {
        let terms = Terms::of(vars);
        for node in nodes {
            match node {
                Node::Leaf(i) => {
                    if let Some(leaf) = self.leaves.get(*i as usize) {
                        if *position >= from {
                            f(*i, leaf, &terms, *position)?;
                        }
                        *position += 1;
                    }
                }
                Node::Run { dim, body } => {
                    let (slot, copies) = dim.slot(vars);
                    // A copy's events, counted only where one can be skipped.
                    let per = (*position < from).then(|| self.count(body, self.extra).0);
                    for c in 0..copies {
                        if let Some(per) = per.filter(|&p| position.saturating_add(p) <= from) {
                            *position += per;
                            continue;
                        }
                        self.walk_from(body, with_copy(vars, slot, c), from, position, f)?;
                    }
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// The facts of a block: its leaf's key, its layer's numbers at its
    /// variables.
    fn block_facts(&self, facts: FactsRef) -> Option<BlockFacts> {
        let leaf = self.leaves.get(facts.item as usize)?;
        let key = self.key(leaf)?;
        let name = |i: Option<u32>| i.and_then(|i| self.names.get(i as usize));
        let layer = match name(key.layer) {
            Some(template) => {
                let terms = Terms::of([
                    i64::from(facts.copy[0]),
                    self.extra[0],
                    i64::from(facts.copy[1]),
                    self.extra[1],
                ]);
                let numbers: Vec<i64> = leaf
                    .attrs
                    .iter()
                    .skip(build::LAYER_NUMBERS)
                    .map(|b| b.at(&terms))
                    .collect();
                Some(build::join_numbers(template, &numbers))
            }
            None => None,
        };
        Some(BlockFacts {
            phase: key.phase,
            iteration: key.iteration,
            op: name(key.op).cloned(),
            layer,
        })
    }
}
