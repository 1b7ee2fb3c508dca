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

use crate::program::{JobRef, StepRun};
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
}

#[derive(Debug)]
enum Mode {
    /// Outside the runs of steps, or in a step not seen from its start.
    Idle,
    /// Simulating a step event by event and recording it.
    Recording(Transcript),
    /// Letting steps go by after the recorded ones, at the `k`-th of them;
    /// the small events let go by since the first, and the bytes they
    /// allocated.
    Replaying {
        k: usize,
        pending: Vec<SimOp>,
        allocated: i64,
    },
}

/// A simulation's view of the job's runs of steps (see the module docs).
#[derive(Debug)]
pub(super) struct Cycles {
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

impl Cycles {
    /// The cycles of `job` for a simulation starting at event `at`, whose
    /// small pool `runner` follows (none where it cannot).
    pub(super) fn new(job: JobRef<'_>, runner: &mut Runner, at: u64) -> Cycles {
        let follows = if at == 0 {
            runner.follow_small_pool()
        } else {
            runner.follows_small_pool()
        };
        let runs = if follows { job.step_runs() } else { Vec::new() };
        let mut cycles = Cycles {
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
        self.end_step(run, runner);
        let copy = (index - run.start) / run.events;
        if copy >= run.copies {
            // The run is over (in the middle of the steps let go by, if
            // it came there): the next one, maybe from this very event.
            self.differs(runner);
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
                pending: Vec::new(),
                allocated: 0,
            };
        } else {
            self.mode = Mode::Recording(Transcript {
                copy,
                start,
                did: Vec::with_capacity(usize::try_from(run.events).unwrap_or(0)),
                clean: true,
                releases: runner.releases(),
            });
        }
    }

    /// Ends the step before a boundary: keeps its record, or, after the
    /// last of the recorded steps let go by, moves the small ids on.
    fn end_step(&mut self, run: StepRun, runner: &mut Runner) {
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
            Mode::Replaying {
                k,
                pending,
                allocated,
            } => {
                if k + 1 < self.recorded.len() {
                    self.mode = Mode::Replaying {
                        k: k + 1,
                        pending,
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
                        pending: Vec::new(),
                        allocated: 0,
                    };
                } else {
                    catch_up(runner, &pending);
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
        let Mode::Replaying {
            k,
            pending,
            allocated,
        } = &mut self.mode
        else {
            return false;
        };
        let q = index.saturating_sub(self.step_start) as usize;
        let from = |block: u64| i64::try_from(i128::from(block) - i128::from(self.step_start));
        let Some(&did) = self.recorded.get(*k).and_then(|t| t.did.get(q)) else {
            return self.differs(runner);
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
                            pending.extend(op.copied());
                            *allocated = allocated.saturating_add_unsigned(r);
                            counted();
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
                pending.push(SimOp::Free { block });
                *allocated = allocated.saturating_sub_unsigned(size);
                counted();
                return true;
            }
            (Some(&SimOp::Free { block }), Did::LargeFree(want))
                if from(block) == Ok(want) && !runner.is_small(block) =>
            {
                return false;
            }
            _ => {}
        }
        self.differs(runner)
    }

    /// An event differs from its record: the events let go by are applied
    /// and the steps recorded again. Never takes care of the event.
    fn differs(&mut self, runner: &mut Runner) -> bool {
        if let Mode::Replaying { pending, .. } = std::mem::replace(&mut self.mode, Mode::Idle) {
            catch_up(runner, &pending);
        }
        self.recorded.clear();
        false
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

/// Applies the small events let go by, in order: the allocator as if they
/// had been simulated where they came.
fn catch_up(runner: &mut Runner, pending: &[SimOp]) {
    for op in pending {
        let _ = runner.step(0, op);
    }
}

// Small events let go by on this thread (tests check that they are).
#[cfg(test)]
thread_local! {
    static LET_BY: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[inline]
fn counted() {
    #[cfg(test)]
    LET_BY.with(|n| n.set(n.get() + 1));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::simulate::{simulate_from, simulate_job, Handoffs, Start};
    use crate::pipeline::Settings;
    use crate::presets::parse_gpu;
    use crate::report::{Recorder, SimulatedRun};
    use crate::simulator::{AllocatorConfig, GpuMemory};

    /// Runs `job` without a limit, with runs at `caps` (allocator bytes)
    /// sharing it, then each run set aside on its own; and each cap's run
    /// from the first event. The small events let go by, counted.
    fn runs(job: JobRef<'_>, caps: &[u64], config: &AllocatorConfig) -> (Vec<SimulatedRun>, u64) {
        let target = parse_gpu("a100-80gb").unwrap();
        let devices: Vec<GpuMemory> = caps
            .iter()
            .map(|&cap| GpuMemory::new(Bytes(cap), Bytes::ZERO))
            .collect();
        LET_BY.with(|n| n.set(0));
        let (first, last) = job.time_range().unwrap();
        let start = Start {
            runner: Runner::new(config, &GpuMemory::unlimited(), 0),
            recorder: Recorder::detailed(job.n_events(), (first, last), 512, vec![(first, last)]),
            at: 0,
            walked: None,
        };
        let handoffs = Handoffs::new(devices.len(), Bytes(u64::MAX));
        let mut out = vec![simulate_from(
            job,
            &target,
            start,
            &devices,
            &handoffs,
            &mut |_| {},
        )];
        for part in handoffs.into_parts().into_iter().flatten() {
            out.push(simulate_from(
                job,
                &target,
                part.start(),
                &[],
                &Handoffs::none(),
                &mut |_| {},
            ));
        }
        for device in &devices {
            out.push(simulate_job(
                job,
                &target,
                config,
                device,
                Recorder::maxima(),
                &mut |_| {},
            ));
        }
        (out, LET_BY.with(std::cell::Cell::get))
    }

    /// A generation long enough that its KV cache leaves the small pool:
    /// simulated with the decode steps let go by, every figure of every run
    /// (the unlimited one with its timeline, the runs at capacity parting
    /// from it, each from the first event, out of memory at some) is the
    /// figure of the same events simulated one by one (the job held whole,
    /// which has no runs of steps); steps were let go by where the small
    /// pool's decisions depend on it alone, and none with expandable
    /// segments.
    #[test]
    fn steps_let_go_by_give_the_figures_of_every_event_simulated() {
        let bytes = include_bytes!("../../tests/data/traces-llm/llama_gen8_b2_p16.json.gz");
        let settings = Settings {
            new_tokens: Some(600),
            gpus: vec!["a100-80gb".into()],
            ..Settings::default()
        };
        let config = settings.config().unwrap();
        let prepared = crate::pipeline::prepare(bytes, &config, &mut |_| {}).unwrap();
        let program = prepared
            .program
            .as_ref()
            .expect("the generation is streamed");
        let whole = program.schedule().unwrap();
        let (unlimited, _) = runs(JobRef::Schedule(&whole), &[], &AllocatorConfig::default());
        let peak = unlimited[0].max_reserved.get();
        // Capacities passed all along the job, inside the steps let go by.
        let mut caps: Vec<u64> = (16..32).map(|k| peak / 32 * k).collect();
        caps.extend([peak - 1, peak + (2 << 20)]);
        // Garbage collection runs only under a memory limit: the unlimited
        // run lets steps go by, the runs at a fraction of the device not.
        for (conf, lets_by) in [
            ("", Some(true)),
            ("max_split_size_mb:20", Some(true)),
            (
                "garbage_collection_threshold:0.5,per_process_memory_fraction:0.99",
                None,
            ),
            ("expandable_segments:True", Some(false)),
        ] {
            let allocator =
                AllocatorConfig::parse(conf, crate::simulator::RuleVersion::New).unwrap();
            let (streamed, let_by) = runs(JobRef::Program(program), &caps, &allocator);
            let (held, none) = runs(JobRef::Schedule(&whole), &caps, &allocator);
            assert_eq!(none, 0);
            assert!(streamed == held, "{conf:?}: the runs differ");
            if let Some(lets_by) = lets_by {
                assert_eq!(let_by > 0, lets_by, "{conf:?}: {let_by} events let go by");
            }
        }
    }

    /// Decode steps written by hand: temporaries of the small pool (one of
    /// a whole segment's half, live while the large block is made), a small
    /// block each step makes while the last step's still lives (two places
    /// take turns: a cycle of two steps), and a large block that grows a
    /// step, made before the last step's is freed, so that segments are
    /// drawn inside the steps let go by, runs at capacity part there and
    /// release the cache there.
    /// Every figure of every run is the figure of the events simulated one
    /// by one, and steps were let go by.
    #[test]
    fn steps_written_by_hand_let_go_by_give_the_figures_of_every_event_simulated() {
        use crate::orchestrator::EventKind::{Alloc, Free};
        let mib = 1i64 << 20;
        // The first small segment half full, so that the temporary of a
        // megabyte takes a segment of its own.
        let prefix = [
            (Alloc, mib),
            (Alloc, 65536),
            (Alloc, 1024),
            (Alloc, 3 * mib),
            (Alloc, 2048),
            (Alloc, 4096),
            (Alloc, 1536),
            (Alloc, 700),
            (Free, 1),
            (Alloc, 300),
            (Free, 1),
        ];
        // Each number of a free: how many events before its block was made
        // (the last step's block: its place less twelve).
        let body = [
            (Alloc, 4096, 0),
            (Alloc, 8192, 0),
            (Free, 2, 0),
            (Alloc, mib, 0),
            (Alloc, 3 * mib, 256 << 10),
            (Free, 13, 0),
            (Free, 3, 0),
            (Alloc, 1536, 0),
            (Free, 13, 0),
            (Free, 8, 0),
            (Alloc, 512, 0),
            (Free, 1, 0),
        ];
        let program =
            crate::program::Program::of_events(&prefix, &body, 240, &[(Free, 8), (Free, 6)]);
        let whole = program.schedule().unwrap();
        let (unlimited, _) = runs(JobRef::Schedule(&whole), &[], &AllocatorConfig::default());
        let peak = unlimited[0].max_reserved.get();
        let mut caps: Vec<u64> = (8..16).map(|k| peak / 16 * k).collect();
        caps.extend([peak - 1, peak + (2 << 20)]);
        for conf in ["", "max_split_size_mb:20"] {
            let allocator =
                AllocatorConfig::parse(conf, crate::simulator::RuleVersion::New).unwrap();
            let (streamed, let_by) = runs(JobRef::Program(&program), &caps, &allocator);
            let (held, _) = runs(JobRef::Schedule(&whole), &caps, &allocator);
            assert!(streamed == held, "{conf:?}: the runs differ");
            assert!(let_by > 1000, "{conf:?}: {let_by} events let go by");
        }
    }
}
