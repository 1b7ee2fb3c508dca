//! Decode steps that repeat what the small pool did before, let go by
//! without the allocator.
//!
//! A long generation's decode steps make the same small blocks every step
//! (activations of one token), and after a few hundred steps the small
//! pool settles into a cycle: at the start of step `c` it is block for
//! block what it was at the start of step `c − P` (P = 1 or 2: a block
//! that outlives its step is made while its predecessor still lives, so
//! two places take turns), each live block held by the block the same
//! number of events before its step's start. The allocator is
//! deterministic, so a step that then asks the small pool for the same
//! rounded sizes, and frees the same blocks, takes the same decisions as
//! step `c − P` did: the same blocks from the cache, no segment. Its small
//! events change nothing but the allocated bytes, and the pool is left as
//! it was found, every block now held by the block `P` steps later.
//!
//! So a step is simulated event by event while it is recorded
//! ([`Transcript`]: what each event did in the small pool, and the pool at
//! its start). Where the pool at a step's start is the one recorded `P`
//! steps before, and those `P` steps drew no segment, released nothing and
//! freed only blocks of the steps, the next `P` steps are let go by: each
//! small event checked against its record (the same kind, rounded size, or
//! block freed) and counted in the allocated bytes, every other event
//! simulated as before, and at the end of the `P` steps the live small ids
//! moved on by `P` steps ([`Runner::shift_small`]). The large pool never
//! touches the small one, except by releasing cached blocks when the device
//! is short: before any allocation that could need that (it cannot get a
//! new segment at once, [`Runner::can_grow`], or could take a waiting GPU
//! past its room and set the run aside), and at any event that differs
//! from its record, the small events let go by are applied for real, in
//! order (small and large events commute where nothing was released), and
//! the steps are recorded again. The figures are those of the simulation
//! of every event (`tests/integration/stream.rs`, and the unit tests
//! below against the same job without the cycles).
//!
//! The small events let go by are not kept: where they must be applied,
//! they are made again from the job, from the first step let go by
//! ([`Cycles::catch_up`]). And most of them need not be made at all
//! ([`Plan`]): an event whose size (or how far back its block was made) is
//! the same on every step is let go by on every step its record is, so a
//! simulation of a program lets a stretch of such events go by at once —
//! the allocated bytes after each are the recorded ones plus a base, the
//! reserved bytes do not change — and makes only the others, one by one
//! (`pipeline/simulate.rs`).

use std::ops::ControlFlow;
use std::sync::Arc;

use crate::orchestrator::EventKind;
use crate::presets::GpuTarget;
use crate::program::{JobEvent, JobRef, StepRun, Steps};
use crate::simulator::{Runner, Sample, SimOp, SmallBlock};
use crate::units::Bytes;

/// What one event of a recorded step did in the small pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Did {
    /// Allocated a small block of these bytes, from the cache.
    Small(u64),
    /// Freed the small block of `size` bytes that the event `from` events
    /// after the step's first allocated.
    SmallFree { from: i64, size: u64 },
    /// Allocated a block of the large pool.
    Large,
    /// Freed the block (of the large pool, or not issued) that the event
    /// `from` events after the step's first allocated.
    LargeFree(i64),
    /// Issued nothing (a block of zero bytes, or its free).
    Unissued,
}

/// One step simulated event by event, as the small pool saw it.
#[derive(Debug, Clone)]
struct Transcript {
    /// The step's number in its run.
    copy: u64,
    /// The small pool at its start.
    start: Vec<SmallBlock>,
    did: Vec<Did>,
    /// No small allocation drew a segment and nothing was released; every
    /// small block freed was made in the run.
    clean: bool,
    /// [`Runner::releases`] at its start.
    releases: (u64, u64),
    /// How a simulation lets it go by in bulk, made when first asked for.
    plan: Option<Arc<Plan>>,
}

#[derive(Debug)]
enum Mode {
    /// Outside the runs of steps, or in a step not seen from its start.
    Idle,
    /// Simulating a step event by event and recording it.
    Recording(Transcript),
    /// Letting steps go by after the recorded ones, at the `k`-th of them;
    /// the first event of the first of them (the small events let go by
    /// since are applied from there, [`Cycles::catch_up`]), and the bytes
    /// they allocated.
    Replaying { k: usize, from: u64, allocated: i64 },
}

/// A recorded step as a simulation lets it go by in bulk: its events in
/// order, stretches of small events that are the same on every step (let
/// go by at once) between the events made one by one.
#[derive(Debug, Default)]
pub(super) struct Plan {
    pub(super) items: Vec<Item>,
    /// Per event of a stretch, the bytes allocated by the stretch's events
    /// up to and including it.
    pub(super) prefix: Vec<i64>,
}

/// One part of a [`Plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Item {
    /// The step's `q`-th event, made and simulated (or let go by) alone.
    One(u64),
    /// Events let go by at once.
    Stretch(Span),
}

/// `n` events from the step's `q`-th, small ones that are the same on
/// every step: their allocated bytes are [`Plan::prefix`]`[at..at + n]`,
/// the first highest at `max_at` and the first lowest at `min_at`, in all
/// `total`; a segment for any of them takes at most `segment` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    pub(super) q: u64,
    pub(super) n: u64,
    pub(super) at: usize,
    pub(super) max_at: u64,
    pub(super) min_at: u64,
    pub(super) total: i64,
    pub(super) segment: u64,
}

/// A simulation's view of the job's runs of steps (see the module docs).
#[derive(Debug)]
pub(super) struct Cycles<'a> {
    job: JobRef<'a>,
    target: &'a GpuTarget,
    runs: Vec<StepRun>,
    /// The run of the next boundary.
    run: usize,
    /// The next event that starts a step or ends a run (`u64::MAX`: none).
    next: u64,
    /// The first event of the current step.
    step_start: u64,
    /// The last steps recorded, consecutive, oldest first (at most two).
    recorded: Vec<Transcript>,
    mode: Mode,
}

impl<'a> Cycles<'a> {
    /// The cycles of `job` on `target` for a simulation starting at event
    /// `at`, whose small pool `runner` follows (none where it cannot).
    pub(super) fn new(
        job: JobRef<'a>,
        target: &'a GpuTarget,
        runner: &mut Runner,
        at: u64,
    ) -> Cycles<'a> {
        let follows = if at == 0 {
            runner.follow_small_pool()
        } else {
            runner.follows_small_pool()
        };
        let runs = if follows { job.step_runs() } else { Vec::new() };
        let mut cycles = Cycles {
            job,
            target,
            runs,
            run: 0,
            next: u64::MAX,
            step_start: 0,
            recorded: Vec::new(),
            mode: Mode::Idle,
        };
        cycles.aim(at);
        cycles
    }

    /// Sets the next boundary at or after event `from`.
    fn aim(&mut self, from: u64) {
        self.next = u64::MAX;
        while let Some(run) = self.runs.get(self.run) {
            let end = run
                .start
                .saturating_add(run.events.saturating_mul(run.copies));
            if from > end {
                self.run += 1;
                continue;
            }
            self.next = if from <= run.start {
                run.start
            } else {
                let into = from - run.start;
                run.start + into.div_ceil(run.events) * run.events
            };
            return;
        }
    }

    /// At event `index`, the first of a step let go by (the `k`-th of the
    /// recorded steps): its run, `k` and the step's number in its run.
    pub(super) fn bulk_step(&self, index: u64) -> Option<(StepRun, usize, u64)> {
        let Mode::Replaying { k, .. } = self.mode else {
            return None;
        };
        let run = *self.runs.get(self.run)?;
        if index != self.step_start || run.events == 0 || index < run.start {
            return None;
        }
        Some((run, k, (index - run.start) / run.events))
    }

    /// The plan of the `k`-th recorded step, whose run's steps are `steps`.
    pub(super) fn plan(
        &mut self,
        k: usize,
        steps: &Steps<'_>,
        runner: &Runner,
    ) -> Option<Arc<Plan>> {
        let t = self.recorded.get_mut(k)?;
        let plan = t
            .plan
            .get_or_insert_with(|| Arc::new(Plan::of(&t.did, steps, runner)));
        Some(Arc::clone(plan))
    }

    /// The bytes the events let go by allocated since the first of their
    /// steps.
    pub(super) fn allocated(&self) -> i64 {
        match self.mode {
            Mode::Replaying { allocated, .. } => allocated,
            _ => 0,
        }
    }

    /// A stretch of `n` events let go by at once, allocating `total`
    /// bytes (see [`Item::Stretch`]).
    pub(super) fn let_by_stretch(&mut self, n: u64, total: i64) {
        if let Mode::Replaying { allocated, .. } = &mut self.mode {
            *allocated = allocated.saturating_add(total);
            counted(n);
            #[cfg(test)]
            IN_BULK.with(|b| b.set(b.get() + n));
        }
    }

    /// Whether the runner holds every event so far: not between the steps
    /// let go by whose small events it has not been given (past the first
    /// of the recorded steps, or with bytes allocated by stretches).
    pub(super) fn settled(&self) -> bool {
        !matches!(self.mode, Mode::Replaying { k, allocated, .. } if k > 0 || allocated != 0)
    }

    /// Whether events are being let go by (their samples need
    /// [`Cycles::sample`]).
    pub(super) fn replaying(&self) -> bool {
        matches!(self.mode, Mode::Replaying { .. })
    }

    /// The allocated and reserved bytes after an event.
    pub(super) fn sample(&self, runner: &Runner) -> Sample {
        match &self.mode {
            Mode::Replaying { allocated, .. } => runner.sample_with(*allocated),
            _ => runner.sample(),
        }
    }

    /// Called before event `index` is simulated: at a step's start, ends
    /// the step before (recorded, or let go by) and starts the next.
    pub(super) fn boundary(&mut self, index: u64, runner: &mut Runner) {
        if index != self.next {
            return;
        }
        let Some(run) = self.runs.get(self.run).copied() else {
            self.next = u64::MAX;
            return;
        };
        self.end_step(run, runner, index);
        let copy = (index - run.start) / run.events;
        if copy >= run.copies {
            // The run is over (in the middle of the steps let go by, if
            // it came there): the next one, maybe from this very event.
            self.differs(runner, index);
            self.recorded.clear();
            self.run += 1;
            self.aim(index);
            if self.next == index {
                self.boundary(index, runner);
            }
            return;
        }
        self.step_start = index;
        self.next = index.saturating_add(run.events);
        if self.replaying() {
            return;
        }
        let Some(start) = runner.small_state(run.start, index) else {
            self.mode = Mode::Idle;
            return;
        };
        let cycle = self.recorded.iter().rposition(|t| t.start == start);
        let unit = cycle.filter(|&from| {
            let steps = &self.recorded[from..];
            steps.iter().all(|t| t.clean)
                && copy + steps.len() as u64 <= run.copies
                && steps.last().is_some_and(|t| t.copy + 1 == copy)
                && steps
                    .iter()
                    .zip(steps.iter().skip(1))
                    .all(|(a, b)| a.copy + 1 == b.copy)
        });
        if let Some(from) = unit {
            self.recorded.drain(..from);
            self.mode = Mode::Replaying {
                k: 0,
                from: index,
                allocated: 0,
            };
        } else {
            self.mode = Mode::Recording(Transcript {
                copy,
                start,
                did: Vec::with_capacity(usize::try_from(run.events).unwrap_or(0)),
                clean: true,
                releases: runner.releases(),
                plan: None,
            });
        }
    }

    /// Ends the step before the boundary at event `index`: keeps its
    /// record, or, after the last of the recorded steps let go by, moves
    /// the small ids on.
    fn end_step(&mut self, run: StepRun, runner: &mut Runner, index: u64) {
        match std::mem::replace(&mut self.mode, Mode::Idle) {
            Mode::Recording(mut t) => {
                let whole = t.did.len() as u64 == run.events;
                t.clean &= runner.releases() == t.releases;
                if whole {
                    if self.recorded.last().is_some_and(|l| l.copy + 1 != t.copy) {
                        self.recorded.clear();
                    }
                    self.recorded.push(t);
                    if self.recorded.len() > 2 {
                        self.recorded.remove(0);
                    }
                }
            }
            Mode::Replaying { k, from, allocated } => {
                if k + 1 < self.recorded.len() {
                    self.mode = Mode::Replaying {
                        k: k + 1,
                        from,
                        allocated,
                    };
                    return;
                }
                let steps = self.recorded.len() as u64;
                let by = run.events.saturating_mul(steps);
                if allocated == 0 && runner.shift_small(run.start, by) {
                    // The pool is as the recorded steps found it: go on.
                    self.mode = Mode::Replaying {
                        k: 0,
                        from: index,
                        allocated: 0,
                    };
                } else {
                    self.catch_up(runner, run, from, index);
                    self.recorded.clear();
                }
            }
            Mode::Idle => {}
        }
    }

    /// While steps are let go by: whether event `index` (issuing `op`) is
    /// taken care of — a small event as recorded, counted, or nothing
    /// issued as recorded. Otherwise the caller simulates it, after the
    /// events let go by were applied where it differs from its record or
    /// could release cached blocks or take a waiting GPU past `lowest`.
    pub(super) fn let_by(
        &mut self,
        index: u64,
        op: Option<&SimOp>,
        runner: &mut Runner,
        lowest: u64,
    ) -> bool {
        let Mode::Replaying { k, allocated, .. } = &mut self.mode else {
            return false;
        };
        let q = index.saturating_sub(self.step_start) as usize;
        let from = |block: u64| i64::try_from(i128::from(block) - i128::from(self.step_start));
        let Some(&did) = self.recorded.get(*k).and_then(|t| t.did.get(q)) else {
            return self.differs(runner, index);
        };
        match (op, did) {
            (None, Did::Unissued) => return true,
            (Some(&SimOp::Alloc { size, .. }), _) => {
                let (small, segment) = runner.request(size);
                let waiting = lowest < u64::MAX
                    && runner.sample().reserved.get().saturating_add(segment) > lowest;
                if !waiting {
                    match (small, did) {
                        (Some(r), Did::Small(want)) if r == want => {
                            *allocated = allocated.saturating_add_unsigned(r);
                            counted(1);
                            return true;
                        }
                        (None, Did::Large) if runner.can_grow(size) => return false,
                        _ => {}
                    }
                }
            }
            (Some(&SimOp::Free { block }), Did::SmallFree { from: want, size })
                if from(block) == Ok(want) =>
            {
                *allocated = allocated.saturating_sub_unsigned(size);
                counted(1);
                return true;
            }
            (Some(&SimOp::Free { block }), Did::LargeFree(want))
                if from(block) == Ok(want) && !runner.is_small(block) =>
            {
                return false;
            }
            _ => {}
        }
        self.differs(runner, index)
    }

    /// An event (the `index`-th) differs from its record: the events let go
    /// by before it are applied and the steps recorded again. Never takes
    /// care of the event.
    fn differs(&mut self, runner: &mut Runner, index: u64) -> bool {
        if let Mode::Replaying { from, .. } = std::mem::replace(&mut self.mode, Mode::Idle) {
            if let Some(run) = self.runs.get(self.run).copied() {
                self.catch_up(runner, run, from, index);
            }
        }
        self.recorded.clear();
        false
    }

    /// Applies the small events let go by from event `from` (the first of
    /// a step of `run`, the first let go by) to event `to` (excluded), in
    /// order: the allocator as if they had been simulated where they came.
    /// They are made again from the job: an event let go by is one whose
    /// record says it allocated or freed a small block (any other was
    /// simulated, or issued nothing), and its op is what the simulation
    /// makes of it (a small block's size is never a workspace's left
    /// unissued, so it is its size on the target).
    fn catch_up(&self, runner: &mut Runner, run: StepRun, from: u64, to: u64) {
        if run.events == 0 || from >= to {
            return;
        }
        let mut index = from;
        self.job.for_each_from(from, |e: &JobEvent| {
            if index >= to {
                return ControlFlow::Break(());
            }
            let q = (index - run.start) % run.events;
            let k = (index - from) / run.events;
            let did = usize::try_from(k)
                .ok()
                .and_then(|k| self.recorded.get(k))
                .and_then(|t| t.did.get(usize::try_from(q).ok()?));
            let op = match (did, e.kind) {
                (Some(Did::Small(_)), EventKind::Alloc) => Some(SimOp::Alloc {
                    block: e.block,
                    size: e.size_on(self.target),
                    stream: 0,
                }),
                (Some(Did::SmallFree { .. }), EventKind::Free) => {
                    Some(SimOp::Free { block: e.block })
                }
                _ => None,
            };
            if let Some(op) = op {
                let _ = runner.step(0, &op);
            }
            index += 1;
            ControlFlow::Continue(())
        });
    }

    /// While a step is recorded, before its event issuing `op` is
    /// simulated: what it will do in the small pool (`None`: not
    /// recording).
    pub(super) fn before(&self, op: Option<&SimOp>, runner: &Runner) -> Option<(Did, Bytes)> {
        if !matches!(self.mode, Mode::Recording(_)) {
            return None;
        }
        let from = |block: u64| i64::try_from(i128::from(block) - i128::from(self.step_start)).ok();
        let did = match op {
            None => Did::Unissued,
            Some(&SimOp::Alloc { size, .. }) => match runner.small_rounded(size) {
                Some(r) => Did::Small(r),
                None => Did::Large,
            },
            Some(&SimOp::Free { block }) => {
                let rel = from(block)?;
                match runner.small_size(block) {
                    Some(size) => Did::SmallFree { from: rel, size },
                    None => Did::LargeFree(rel),
                }
            }
            Some(SimOp::EmptyCache) => return None,
        };
        Some((did, runner.sample().reserved))
    }

    /// While a step is recorded, after its event was simulated: records
    /// what it did (`noted` from [`Cycles::before`]).
    pub(super) fn after(&mut self, noted: Option<(Did, Bytes)>, runner: &Runner) {
        let run_start = self.run_start();
        let Mode::Recording(t) = &mut self.mode else {
            return;
        };
        match noted {
            Some((did, reserved)) => {
                match did {
                    Did::Small(_) if runner.sample().reserved != reserved => t.clean = false,
                    Did::SmallFree { from, .. }
                        if i128::from(self.step_start) + i128::from(from)
                            < i128::from(run_start) =>
                    {
                        t.clean = false
                    }
                    _ => {}
                }
                t.did.push(did);
            }
            None => {
                // An event the record cannot hold: the step is not recorded.
                self.mode = Mode::Idle;
            }
        }
    }

    /// The first event of the current run.
    fn run_start(&self) -> u64 {
        self.runs.get(self.run).map_or(0, |r| r.start)
    }
}

// Small events let go by on this thread (tests check that they are).
#[cfg(test)]
thread_local! {
    static LET_BY: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Of those, the ones let go by a stretch at a time.
    static IN_BULK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[inline]
fn counted(_n: u64) {
    #[cfg(test)]
    LET_BY.with(|n| n.set(n.get() + _n));
}

impl Plan {
    /// The plan of a step recorded as `did`, whose run's steps are `steps`.
    fn of(did: &[Did], steps: &Steps<'_>, runner: &Runner) -> Plan {
        let mut plan = Plan::default();
        let mut open: Option<Span> = None;
        for (q, &d) in (0u64..).zip(did) {
            // What the event allocates, and the segment it could draw.
            let change = match d {
                Did::Small(r) if steps.fixed(q) => Some((
                    i64::try_from(r).unwrap_or(i64::MAX),
                    runner.request(Bytes(r)).1,
                )),
                Did::SmallFree { size, .. } if steps.fixed(q) => {
                    Some((0i64.saturating_sub_unsigned(size), 0))
                }
                _ => None,
            };
            let Some((delta, segment)) = change else {
                plan.items.extend(open.take().map(Item::Stretch));
                plan.items.push(Item::One(q));
                continue;
            };
            let span = open.get_or_insert(Span {
                q,
                n: 0,
                at: plan.prefix.len(),
                max_at: 0,
                min_at: 0,
                total: 0,
                segment: 0,
            });
            let sum = span.total.saturating_add(delta);
            let value = |i: u64| plan.prefix.get(span.at + i as usize).copied();
            if value(span.max_at).is_none_or(|most| sum > most) {
                span.max_at = span.n;
            }
            if value(span.min_at).is_none_or(|least| sum < least) {
                span.min_at = span.n;
            }
            plan.prefix.push(sum);
            span.n += 1;
            span.total = sum;
            span.segment = span.segment.max(segment);
        }
        plan.items.extend(open.map(Item::Stretch));
        plan
    }
}

#[cfg(test)]
mod tests;
