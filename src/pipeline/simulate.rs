//! The orchestrator → simulator glue: a [`Schedule`] becomes simulator ops
//! for one GPU, and the simulation's samples come back per schedule event.
//! The estimate and the what-ifs share it.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use super::cycles::Cycles;
use crate::orchestrator::{Category, EventKind, Schedule};
use crate::presets::GpuTarget;
use crate::program::{JobEvent, JobRef};
use crate::report::{Recorder, SimulatedRun};
use crate::simulator::{AllocatorConfig, GpuMemory, Runner, SimOp, Suspended};
use crate::units::Bytes;

/// The simulator ops of a schedule on `target`: workspace blocks at the
/// target's cuBLAS workspace size (the first `cublas_workspaces` of them
/// only), blocks another architecture's kernels make and zero-byte blocks
/// skipped with their frees. Also returns, for each schedule event, the
/// number of ops issued up to and including it.
pub fn schedule_ops(schedule: &Schedule, target: &GpuTarget) -> (Vec<SimOp>, Vec<usize>) {
    let mut issued_size = Issued::on(target);
    let mut issued = vec![false; schedule.blocks.len()];
    let mut ops: Vec<SimOp> = Vec::with_capacity(schedule.events.len());
    let mut ops_through: Vec<usize> = Vec::with_capacity(schedule.events.len());
    for event in &schedule.events {
        let id = event.block.index();
        match event.kind {
            EventKind::Alloc => {
                let size = match schedule.blocks.get(id) {
                    Some(block) => issued_size.of(block.category, block.size_on(target)),
                    None => Bytes::ZERO,
                };
                if size > Bytes::ZERO {
                    if let Some(slot) = issued.get_mut(id) {
                        *slot = true;
                    }
                    ops.push(SimOp::Alloc {
                        block: id as u64,
                        size,
                        stream: 0,
                    });
                }
            }
            EventKind::Free => {
                if issued.get(id).copied().unwrap_or(false) {
                    ops.push(SimOp::Free { block: id as u64 });
                }
            }
        }
        ops_through.push(ops.len());
    }
    (ops, ops_through)
}

/// The sizes a simulation on one GPU issues its blocks at: each block's
/// size there, but only the first `cublas_workspaces` workspace blocks the
/// target makes (a handle per thread and stream), the others none.
struct Issued {
    workspaces_left: u32,
}

impl Issued {
    fn on(target: &GpuTarget) -> Issued {
        Issued {
            workspaces_left: target.overheads.cublas_workspaces,
        }
    }

    /// The size a block of `category` whose size on the target is `size`
    /// is issued at.
    fn of(&mut self, category: Category, size: Bytes) -> Bytes {
        if category != Category::Workspace || size == Bytes::ZERO {
            return size;
        }
        if self.workspaces_left == 0 {
            return Bytes::ZERO;
        }
        self.workspaces_left -= 1;
        size
    }
}

/// Replays a job through the simulated allocator on one device, with the
/// target's cuBLAS workspace size (the first `cublas_workspaces` workspace
/// blocks at it, the others and zero-byte blocks skipped with their frees),
/// handing the sample after each event to `recorder`; stops at an
/// out-of-memory error. `tick(n)` says every [`TICK`] events that `n` more
/// were simulated (at the end, the rest of the job's, simulated or not).
pub fn simulate_job(
    job: JobRef<'_>,
    target: &GpuTarget,
    allocator: &AllocatorConfig,
    device: &GpuMemory,
    recorder: Recorder,
    tick: &mut dyn FnMut(u64),
) -> SimulatedRun {
    let runner = Runner::new(
        allocator,
        device,
        usize::try_from(job.n_events()).unwrap_or(usize::MAX),
    );
    let start = Start {
        runner,
        recorder,
        at: 0,
        walked: None,
    };
    simulate_from(job, target, start, &[], &Handoffs::none(), tick)
}

/// Where a simulation starts: its run as it stands before event `at` (0:
/// a fresh allocator) and what it recorded of the events before; what the
/// run sharing it knew of them besides (`None`: they are walked to learn
/// it).
pub struct Start {
    pub runner: Runner,
    pub recorder: Recorder,
    pub at: usize,
    pub walked: Option<Walked>,
}

/// What a simulation starting at a later event needs of the events before
/// it besides the allocator, from the run it shared: the blocks not issued
/// (their frees are skipped too), the workspaces the target still issues,
/// and the op of the event it starts at, made already.
#[derive(Debug, Clone)]
pub struct Walked {
    workspaces_left: u32,
    skipped: HashSet<u64>,
    op: Option<SimOp>,
}

/// A run at a device's capacity set aside where it leaves the run it
/// shared (see [`simulate_from`]).
pub struct Parted {
    pub runner: Suspended,
    pub recorder: Recorder,
    pub at: usize,
    pub walked: Walked,
}

impl Parted {
    /// Where the run at capacity goes on.
    pub fn start(self) -> Start {
        Start {
            runner: Runner::resume(self.runner),
            recorder: self.recorder,
            at: self.at,
            walked: Some(self.walked),
        }
    }
}

/// Copies a run may take (before an event that could take a device past
/// its room and did not) before that device's run is left to start alone.
const PARTING_TRIES: u32 = 16;

/// Where the runs at capacity that share an unlimited run are handed from
/// that run to their own jobs: one slot per device sharing it, filled as
/// each parts (or is left to run alone) and, when the unlimited run ends,
/// with the run for every device it never took past its room. A job for a
/// device takes its slot, waiting while the unlimited run has not decided
/// it: shells that run jobs side by side go on with a run at capacity as
/// soon as it parts; shells that run them in turn find every slot decided.
pub struct Handoffs {
    slots: Mutex<Vec<Slot>>,
    decided: Condvar,
    /// What the runs set aside and not yet taken may hold.
    keep: u64,
}

/// One device's slot in [`Handoffs`].
enum Slot {
    /// The unlimited run has not yet decided it.
    Open,
    /// Its run set aside, to go on from there.
    Parted(Box<Parted>),
    /// Its run starts from the first event.
    Alone,
    /// The unlimited run ended without taking it past its room: that run
    /// (without its detail) is its run.
    Shared(Box<SimulatedRun>),
    /// Its job took it.
    Taken,
}

/// What a device's job finds in its slot ([`Handoffs::take`]).
pub enum Handed {
    /// Go on from where it parted.
    Parted(Box<Parted>),
    /// Run from the first event.
    Alone,
    /// The unlimited run never took it past its room; here it is, capped.
    Shared(SimulatedRun),
}

impl Handoffs {
    /// Slots for `devices` devices; the runs set aside hold at most `keep`
    /// bytes together.
    pub fn new(devices: usize, keep: Bytes) -> Handoffs {
        Handoffs {
            slots: Mutex::new((0..devices).map(|_| Slot::Open).collect()),
            decided: Condvar::new(),
            keep: keep.get(),
        }
    }

    /// No device shares the run.
    pub fn none() -> Handoffs {
        Handoffs::new(0, Bytes::ZERO)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides device `i`'s slot (once: a decided slot is kept).
    fn decide(&self, i: usize, slot: Slot) {
        let mut slots = self.lock();
        let parted = matches!(slot, Slot::Parted(_));
        if let Some(open @ Slot::Open) = slots.get_mut(i) {
            *open = slot;
        }
        if parted {
            held_within(&mut slots, self.keep);
        }
        drop(slots);
        self.decided.notify_all();
    }

    /// Decides every open slot: the unlimited run ended as `run` (`None`:
    /// it did not finish).
    fn end(&self, run: Option<&SimulatedRun>) {
        let mut slots = self.lock();
        for slot in slots.iter_mut().filter(|s| matches!(s, Slot::Open)) {
            *slot = match run {
                Some(run) => Slot::Shared(Box::new(SimulatedRun {
                    detail: None,
                    ..run.clone()
                })),
                None => Slot::Alone,
            };
        }
        drop(slots);
        self.decided.notify_all();
    }

    /// Device `i`'s slot, once the unlimited run has decided it.
    pub fn take(&self, i: usize) -> Handed {
        let mut slots = self.lock();
        while matches!(slots.get(i), Some(Slot::Open)) {
            slots = self
                .decided
                .wait(slots)
                .unwrap_or_else(PoisonError::into_inner);
        }
        match slots
            .get_mut(i)
            .map(|slot| std::mem::replace(slot, Slot::Taken))
        {
            Some(Slot::Parted(parted)) => Handed::Parted(parted),
            Some(Slot::Shared(run)) => Handed::Shared(*run),
            _ => Handed::Alone,
        }
    }

    /// The runs set aside and not taken, per device (tests).
    #[cfg(test)]
    pub(super) fn into_parts(self) -> Vec<Option<Parted>> {
        self.slots
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .into_iter()
            .map(|slot| match slot {
                Slot::Parted(parted) => Some(*parted),
                _ => None,
            })
            .collect()
    }
}

/// Ends a run's handoffs however the run stops: a slot left open would
/// keep its job waiting.
struct EndOnDrop<'h>(&'h Handoffs);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.0.end(None);
    }
}

/// A device whose run at capacity shares the simulation until it parts.
enum Sharer {
    Waiting {
        device: GpuMemory,
        room: u64,
        tries: u32,
    },
    Decided,
}

/// Leaves to run alone the runs set aside (and not taken) that parted
/// first, until those held take at most `keep` bytes.
fn held_within(slots: &mut [Slot], keep: u64) {
    loop {
        let mut held = 0u64;
        let mut first: Option<(usize, usize)> = None;
        for (i, slot) in slots.iter().enumerate() {
            if let Slot::Parted(p) = slot {
                held = held.saturating_add(p.runner.footprint().get());
                if first.is_none_or(|(_, at)| p.at < at) {
                    first = Some((i, p.at));
                }
            }
        }
        match first.and_then(|(i, _)| slots.get_mut(i)) {
            Some(slot) if held > keep => *slot = Slot::Alone,
            _ => return,
        }
    }
}

/// [`simulate_job`] from `start`, the events before `start.at` walked but
/// not simulated. Each of `devices` (without a memory limit) shares the
/// run until the event that first takes its reserved bytes past what the
/// device leaves the allocator: the device refuses a segment only there,
/// so its run at capacity takes the same decisions until then. At that
/// event its run is set aside as it stood before it ([`Parted`]) and handed
/// to its slot in `handoffs`, to go on alone from there. A device the run
/// never took past its room gets the run itself ([`Handed::Shared`]); one
/// whose run could not be set aside (the copy before the event was not
/// taken, [`PARTING_TRIES`] copies were taken in vain, or the allocator is
/// set up so that the device mattered sooner,
/// [`crate::simulator::CachingAllocator::on_device`]) runs from the first
/// event. The runs set aside and not yet taken hold at most the handoffs'
/// `keep` bytes together: past that, the one that parted first (whose
/// shared part is the shortest) runs from the first event.
pub fn simulate_from(
    job: JobRef<'_>,
    target: &GpuTarget,
    start: Start,
    devices: &[GpuMemory],
    handoffs: &Handoffs,
    tick: &mut dyn FnMut(u64),
) -> SimulatedRun {
    let ending = EndOnDrop(handoffs);
    let Start {
        mut runner,
        mut recorder,
        at,
        walked,
    } = start;
    // From the run it shared, the events before `at` need not be made.
    let (mut issued_size, mut skipped, mut first_op, from) = match walked {
        Some(w) => (
            Issued {
                workspaces_left: w.workspaces_left,
            },
            w.skipped,
            Some(w.op),
            at,
        ),
        None => (Issued::on(target), HashSet::new(), None, 0),
    };
    if from > 0 {
        tick(from as u64 / TICK * TICK);
    }
    let mut sharers: Vec<Sharer> = devices
        .iter()
        .enumerate()
        .map(|(i, &device)| match device.available_to_allocator() {
            Some(room) if device.memory_limit.is_none() => Sharer::Waiting {
                device,
                room,
                tries: 0,
            },
            _ => {
                handoffs.decide(i, Slot::Alone);
                Sharer::Decided
            }
        })
        .collect();
    // The smallest room of a waiting device (u64::MAX: none waits).
    let lowest_room = |sharers: &[Sharer]| {
        sharers
            .iter()
            .filter_map(|s| match s {
                Sharer::Waiting { room, .. } => Some(*room),
                Sharer::Decided => None,
            })
            .min()
            .unwrap_or(u64::MAX)
    };
    let mut lowest = lowest_room(&sharers);
    // Blocks never issued (zero bytes, workspaces past the count): their
    // frees are skipped too (`skipped`).
    let mut index = from;
    let mut cycles = Cycles::new(job, &mut runner, at as u64);
    job.for_each_from(from as u64, |e: &JobEvent| {
        let op = match first_op.take() {
            Some(op) => op,
            None => match e.kind {
                EventKind::Alloc => {
                    let size = issued_size.of(e.category, e.size_on(target));
                    if size > Bytes::ZERO {
                        Some(SimOp::Alloc {
                            block: e.block,
                            size,
                            stream: 0,
                        })
                    } else {
                        skipped.insert(e.block);
                        None
                    }
                }
                EventKind::Free => {
                    let was_skipped = !skipped.is_empty() && skipped.remove(&e.block);
                    (!was_skipped).then_some(SimOp::Free { block: e.block })
                }
            },
        };
        if index < at {
            index += 1;
            if index as u64 % TICK == 0 {
                tick(TICK);
            }
            return ControlFlow::Continue(());
        }
        // A decode step the small pool has seen: its small events go by.
        cycles.boundary(index as u64, &mut runner);
        if cycles.replaying() && cycles.let_by(index as u64, op.as_ref(), &mut runner, lowest) {
            index += 1;
            if index as u64 % TICK == 0 {
                tick(TICK);
            }
            recorder.record(e.time, cycles.sample(&runner));
            return ControlFlow::Continue(());
        }
        let noted = cycles.before(op.as_ref(), &runner);
        // Before an allocation that could take a waiting device past its
        // room: the run as it stands, and how far the event could take it.
        let mut before: Option<(Suspended, u64)> = None;
        if lowest < u64::MAX {
            if let Some(SimOp::Alloc { size, .. }) = op {
                let reach = runner
                    .sample()
                    .reserved
                    .get()
                    .saturating_add(runner.segment_for(size).get());
                if reach > lowest {
                    before = Some((runner.suspend(), reach));
                }
            }
        }
        let oom = op.is_some_and(|op| runner.step(index, &op).is_err());
        cycles.after(noted, &runner);
        let sample = cycles.sample(&runner);
        if lowest < u64::MAX && (sample.reserved.get() > lowest || before.is_some()) {
            for (i, sharer) in sharers.iter_mut().enumerate() {
                let Sharer::Waiting {
                    device,
                    room,
                    tries,
                } = sharer
                else {
                    continue;
                };
                if sample.reserved.get() > *room {
                    let slot = match before
                        .as_ref()
                        .and_then(|(runner, _)| runner.on_device(*device))
                    {
                        Some(runner) => Slot::Parted(Box::new(Parted {
                            runner,
                            recorder: recorder.maxima_so_far(),
                            at: index,
                            walked: Walked {
                                workspaces_left: issued_size.workspaces_left,
                                skipped: skipped.clone(),
                                op,
                            },
                        })),
                        None => Slot::Alone,
                    };
                    handoffs.decide(i, slot);
                    *sharer = Sharer::Decided;
                } else if before.as_ref().is_some_and(|b| b.1 > *room) {
                    *tries += 1;
                    if *tries >= PARTING_TRIES {
                        handoffs.decide(i, Slot::Alone);
                        *sharer = Sharer::Decided;
                    }
                }
            }
            lowest = lowest_room(&sharers);
        }
        index += 1;
        if index as u64 % TICK == 0 {
            tick(TICK);
        }
        recorder.record(e.time, sample);
        if oom {
            recorder.out_of_memory();
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    tick(job.n_events().saturating_sub(index as u64 / TICK * TICK));
    let run = recorder.finish();
    handoffs.end(Some(&run));
    drop(ending);
    run
}

/// Events between two progress ticks of a simulation.
pub const TICK: u64 = 1 << 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::{BlockId, Phase, ScheduleEvent, ScheduledBlock};
    use crate::presets::parse_gpu;
    use crate::units::Nanos;
    use proptest::prelude::*;

    /// A schedule of `sizes` (bytes) allocated in order, each freed where
    /// `frees` says: `frees[i]` blocks are freed (the oldest live first,
    /// then every other) after the i-th allocation.
    fn schedule(sizes: &[u64], frees: &[usize]) -> Schedule {
        let blocks = sizes
            .iter()
            .map(|&size| ScheduledBlock {
                size: Bytes(size),
                category: Category::Temporary,
                iteration: Some(0),
                phase: Phase::Forward,
                op: None,
                layer: None,
                on: crate::kernels::ArchSet::ALL,
                per_gpu: None,
            })
            .collect();
        let mut events = Vec::new();
        let mut live: Vec<u32> = Vec::new();
        let mut time = 0i64;
        let mut push = |events: &mut Vec<ScheduleEvent>, kind, block| {
            time += 1;
            events.push(ScheduleEvent {
                time: Nanos(time),
                kind,
                block: BlockId(block),
            });
        };
        for (i, _) in sizes.iter().enumerate() {
            push(&mut events, EventKind::Alloc, i as u32);
            live.push(i as u32);
            for k in 0..frees.get(i).copied().unwrap_or(0) {
                if live.is_empty() {
                    break;
                }
                let at = (k * 2) % live.len();
                let block = live.remove(at);
                push(&mut events, EventKind::Free, block);
            }
        }
        for block in live {
            push(&mut events, EventKind::Free, block);
        }
        Schedule {
            blocks,
            events,
            ..Schedule::default()
        }
    }

    /// The unlimited run with `caps` (allocator bytes) sharing it, and each
    /// cap's run from the first event.
    fn runs(
        schedule: &Schedule,
        caps: &[u64],
    ) -> (SimulatedRun, Vec<Option<Parted>>, Vec<SimulatedRun>) {
        runs_keeping(schedule, caps, Bytes(u64::MAX))
    }

    /// [`runs`], the runs set aside holding at most `keep` bytes.
    fn runs_keeping(
        schedule: &Schedule,
        caps: &[u64],
        keep: Bytes,
    ) -> (SimulatedRun, Vec<Option<Parted>>, Vec<SimulatedRun>) {
        let target = parse_gpu("a100-80gb").unwrap();
        let allocator = AllocatorConfig::default();
        let job = JobRef::Schedule(schedule);
        let devices: Vec<GpuMemory> = caps
            .iter()
            .map(|&cap| GpuMemory::new(Bytes(cap), Bytes::ZERO))
            .collect();
        let start = Start {
            runner: Runner::new(&allocator, &GpuMemory::unlimited(), 0),
            recorder: Recorder::maxima(),
            at: 0,
            walked: None,
        };
        let handoffs = Handoffs::new(devices.len(), keep);
        let unlimited = simulate_from(job, &target, start, &devices, &handoffs, &mut |_| {});
        let parted = handoffs.into_parts();
        let alone = devices
            .iter()
            .map(|d| simulate_job(job, &target, &allocator, d, Recorder::maxima(), &mut |_| {}))
            .collect();
        (unlimited, parted, alone)
    }

    /// A run at capacity that goes on from where it parted from the
    /// unlimited run is the run at capacity from the first event; one that
    /// never parted is the unlimited run.
    fn check(schedule: &Schedule, caps: &[u64]) -> Result<usize, TestCaseError> {
        let target = parse_gpu("a100-80gb").unwrap();
        let job = JobRef::Schedule(schedule);
        let (unlimited, parted, alone) = runs(schedule, caps);
        let mut n = 0;
        for ((cap, part), alone) in caps.iter().zip(parted).zip(alone) {
            match part {
                Some(part) => {
                    n += 1;
                    let resumed = simulate_from(
                        job,
                        &target,
                        part.start(),
                        &[],
                        &Handoffs::none(),
                        &mut |_| {},
                    );
                    prop_assert_eq!(&resumed, &alone, "at {} B", cap);
                }
                None if unlimited.max_reserved.get() <= *cap => {
                    prop_assert_eq!(&unlimited, &alone, "at {} B", cap);
                }
                // Left to run alone.
                None => {}
            }
        }
        Ok(n)
    }

    #[test]
    fn a_growing_job_parts_where_each_capacity_is_passed() {
        let mib = 1u64 << 20;
        // Growing blocks, each freed two allocations later, small ones
        // between: the cache serves some, segments grow.
        let sizes: Vec<u64> = (1..200u64)
            .map(|i| {
                if i % 3 == 0 {
                    4096 * i
                } else {
                    mib * (i % 17 + 1)
                }
            })
            .collect();
        let frees: Vec<usize> = (0..sizes.len())
            .map(|i| usize::from(i % 2 == 1) * 2)
            .collect();
        let s = schedule(&sizes, &frees);
        let (unlimited, _, _) = runs(&s, &[]);
        let top = unlimited.max_reserved.get();
        // Four capacities it passes (one below its first segment's end),
        // one it never does.
        let caps = [top / 8, top / 3, top / 2, top - 1, top];
        let parted = check(&s, &caps).unwrap();
        assert_eq!(
            parted, 4,
            "of the capacities {caps:?} ({top} B reserved at most)"
        );
        // Room for none; then for all but a byte: those left to run alone
        // parted no later than any kept, and the kept ones fit.
        let (_, none, _) = runs_keeping(&s, &caps, Bytes::ZERO);
        assert!(none.iter().all(Option::is_none));
        let (_, all, _) = runs(&s, &caps);
        let footprint = |parts: &[Option<Parted>]| -> u64 {
            parts
                .iter()
                .flatten()
                .map(|p| p.runner.footprint().get())
                .sum()
        };
        let keep = footprint(&all) - 1;
        let (_, some, _) = runs_keeping(&s, &caps, Bytes(keep));
        assert!(footprint(&some) <= keep);
        let kept: Vec<usize> = some.iter().flatten().map(|p| p.at).collect();
        assert!(kept.len() < parted, "nothing was left alone: {kept:?}");
        let first_kept = kept.iter().min().copied().unwrap_or(usize::MAX);
        for (a, o) in all.iter().zip(&some) {
            if let (Some(a), None) = (a, o) {
                assert!(a.at <= first_kept, "{} left alone, {kept:?} kept", a.at);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn a_run_at_capacity_goes_on_from_where_it_parts(
            sizes in proptest::collection::vec(
                prop_oneof![1u64..(1 << 20), (1u64 << 20)..(64 << 20)],
                1..120,
            ),
            frees in proptest::collection::vec(0usize..4, 0..120),
            caps in proptest::collection::vec((1u64 << 20)..(512 << 20), 1..6),
        ) {
            check(&schedule(&sizes, &frees), &caps)?;
        }
    }
}
