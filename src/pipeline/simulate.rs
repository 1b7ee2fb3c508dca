//! The orchestrator → simulator glue: a [`Schedule`] becomes simulator ops
//! for one GPU, and the simulation's samples come back per schedule event.
//! The estimate and the what-ifs share it.

use std::collections::HashSet;
use std::ops::ControlFlow;

use super::cycles::{Cycles, Item, Span};
use super::handoffs::{EndOnDrop, Slot};
pub use super::handoffs::{Handed, Handoffs};
use super::resume::{Checkpoint, Keeping, Resume};
use crate::orchestrator::{Category, EventKind, Schedule};
use crate::presets::GpuTarget;
use crate::program::{JobEvent, JobRef, Program};
use crate::report::{Recorder, SimulatedRun, Stretch};
use crate::simulator::{AllocatorConfig, GpuMemory, Runner, SimOp, Suspended};
use crate::units::{Bytes, Nanos};

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
/// it besides the allocator, from the run it shared or was kept from: the
/// blocks not issued (their frees are skipped too), the workspaces the
/// target still issues, and the op of the event it starts at where that
/// run made it already (`None`: it is made from the job).
#[derive(Debug, Clone)]
pub struct Walked {
    workspaces_left: u32,
    skipped: HashSet<u64>,
    op: Option<Option<SimOp>>,
}

impl Walked {
    /// Before the first event of a step, nothing of it made yet.
    pub(super) fn before(workspaces_left: u32, skipped: HashSet<u64>) -> Walked {
        Walked {
            workspaces_left,
            skipped,
            op: None,
        }
    }
}

/// A run at a device's capacity set aside where it leaves the run it
/// shared (see [`simulate_from`]).
pub struct Parted {
    pub runner: Suspended,
    pub recorder: Recorder,
    pub at: usize,
    pub walked: Walked,
    /// The shared run's last checkpoint ([`super::resume`]), where it kept
    /// them.
    pub kept: Option<Resume>,
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
/// its room and did not: expandable segments) before that device's run is
/// left to start alone.
const PARTING_TRIES: u32 = 16;

/// A device whose run at capacity shares the simulation until it parts.
enum Sharer {
    Waiting {
        device: GpuMemory,
        room: u64,
        tries: u32,
    },
    Decided,
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
    simulate_keeping(job, target, start, devices, handoffs, tick, None).0
}

/// [`simulate_from`] keeping checkpoints along the job's first call's
/// decode steps as `keep` says ([`super::resume`]; none where it is
/// `None`): the run, and its last checkpoint (`None` where no run stood
/// where one was due). Devices sharing the run part with its last
/// checkpoint.
pub(super) fn simulate_keeping(
    job: JobRef<'_>,
    target: &GpuTarget,
    start: Start,
    devices: &[GpuMemory],
    handoffs: &Handoffs,
    tick: &mut dyn FnMut(u64),
    keep: Option<Keeping>,
) -> (SimulatedRun, Option<Resume>) {
    let ending = EndOnDrop(handoffs);
    let Start {
        mut runner,
        recorder,
        at,
        walked,
    } = start;
    // From the run it shared, the events before `at` need not be made.
    let (issued_size, skipped, first_op, from) = match walked {
        Some(w) => (
            Issued {
                workspaces_left: w.workspaces_left,
            },
            w.skipped,
            w.op,
            at,
        ),
        None => (Issued::on(target), HashSet::new(), None, 0),
    };
    if from > 0 {
        tick(from as u64 / TICK * TICK);
    }
    let sharers: Vec<Sharer> = devices
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
    let cycles = Cycles::new(job, target, &mut runner, at as u64);
    let mut sim = Sim {
        target,
        handoffs,
        tick,
        runner,
        recorder,
        at,
        index: from,
        issued_size,
        skipped,
        first_op,
        lowest: lowest_room(&sharers),
        sharers,
        cycles,
        in_bulk: false,
        keep,
    };
    // The events one by one, but for the steps let go by in bulk.
    let mut resume = from as u64;
    loop {
        let mut next = Next::Event;
        job.for_each_from(resume, |e: &JobEvent| {
            next = sim.event(e);
            match next {
                Next::Event => ControlFlow::Continue(()),
                Next::Stop | Next::Bulk => ControlFlow::Break(()),
            }
        });
        match (next, job) {
            (Next::Bulk, JobRef::Program(program)) => match sim.bulk(program) {
                Some(at) => resume = at,
                None => break,
            },
            _ => break,
        }
    }
    let Sim {
        tick,
        recorder,
        index,
        keep,
        ..
    } = sim;
    tick(job.n_events().saturating_sub(index as u64 / TICK * TICK));
    let run = recorder.finish();
    handoffs.end(Some(&run));
    drop(ending);
    (run, keep.as_ref().and_then(Keeping::last))
}

/// The smallest room of a waiting device (u64::MAX: none waits).
fn lowest_room(sharers: &[Sharer]) -> u64 {
    sharers
        .iter()
        .filter_map(|s| match s {
            Sharer::Waiting { room, .. } => Some(*room),
            Sharer::Decided => None,
        })
        .min()
        .unwrap_or(u64::MAX)
}

/// What a simulation does after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Goes on with the next event.
    Event,
    /// Stops: out of memory.
    Stop,
    /// Lets the steps from this event go by in bulk ([`Sim::bulk`]); the
    /// event is not simulated yet.
    Bulk,
}

/// A simulation under way ([`simulate_from`]).
struct Sim<'s, 'a> {
    target: &'a GpuTarget,
    handoffs: &'s Handoffs,
    tick: &'s mut dyn FnMut(u64),
    runner: Runner,
    recorder: Recorder,
    /// The first event simulated (those before are walked).
    at: usize,
    /// The next event.
    index: usize,
    issued_size: Issued,
    /// Blocks never issued (zero bytes, workspaces past the count): their
    /// frees are skipped too.
    skipped: HashSet<u64>,
    /// The op of the first event, made by the run this one parted from.
    first_op: Option<Option<SimOp>>,
    sharers: Vec<Sharer>,
    /// The smallest room of a waiting device (u64::MAX: none waits).
    lowest: u64,
    cycles: Cycles<'a>,
    /// Events are made by [`Sim::bulk`], which must not be asked for again.
    in_bulk: bool,
    /// The checkpoints a run alone keeps ([`super::resume`]).
    keep: Option<Keeping>,
}

impl Sim<'_, '_> {
    /// `n` more events passed: the next event's index, and a progress tick
    /// for each [`TICK`] events crossed.
    fn counted(&mut self, n: usize) {
        let before = self.index as u64 / TICK;
        self.index += n;
        for _ in before..self.index as u64 / TICK {
            (self.tick)(TICK);
        }
    }

    /// Simulates event `e` (the `index`-th), or lets it go by.
    fn event(&mut self, e: &JobEvent) -> Next {
        if self.shared_out() {
            return Next::Stop;
        }
        let index = self.index;
        if index >= self.at {
            // A decode step the small pool has seen: its small events go by,
            // in bulk where they can.
            self.cycles.boundary(index as u64, &mut self.runner);
            self.keep_at(index);
            if !self.in_bulk
                && self.first_op.is_none()
                && self.cycles.bulk_step(index as u64).is_some()
            {
                return Next::Bulk;
            }
        }
        let op = match self.first_op.take() {
            Some(op) => op,
            None => match e.kind {
                EventKind::Alloc => {
                    let size = self.issued_size.of(e.category, e.size_on(self.target));
                    if size > Bytes::ZERO {
                        Some(SimOp::Alloc {
                            block: e.block,
                            size,
                            stream: 0,
                        })
                    } else {
                        self.skipped.insert(e.block);
                        None
                    }
                }
                EventKind::Free => {
                    let was_skipped = !self.skipped.is_empty() && self.skipped.remove(&e.block);
                    (!was_skipped).then_some(SimOp::Free { block: e.block })
                }
            },
        };
        if index < self.at {
            self.counted(1);
            return Next::Event;
        }
        let runner = &mut self.runner;
        let cycles = &mut self.cycles;
        if cycles.replaying() && cycles.let_by(index as u64, op.as_ref(), runner, self.lowest) {
            let sample = cycles.sample(runner);
            self.counted(1);
            self.recorder.record(e.time, sample);
            return Next::Event;
        }
        let noted = cycles.before(op.as_ref(), runner);
        // Before an allocation whose new segment (no cached block serves
        // it) could take a waiting device past its room: the run as it
        // stands, and how far the event could take it.
        let mut before: Option<(Suspended, u64)> = None;
        if self.lowest < u64::MAX {
            if let Some(SimOp::Alloc { size, stream, .. }) = op {
                let reach = runner
                    .sample()
                    .reserved
                    .get()
                    .saturating_add(runner.segment_for(size).get());
                if reach > self.lowest && !runner.serves_from_cache(size, stream) {
                    before = Some((runner.suspend(), reach));
                }
            }
        }
        let oom = op.is_some_and(|op| runner.step(index, &op).is_err());
        cycles.after(noted, runner);
        let sample = cycles.sample(runner);
        if self.lowest < u64::MAX && (sample.reserved.get() > self.lowest || before.is_some()) {
            for (i, sharer) in self.sharers.iter_mut().enumerate() {
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
                            recorder: self.recorder.maxima_so_far(),
                            at: index,
                            walked: Walked {
                                workspaces_left: self.issued_size.workspaces_left,
                                skipped: self.skipped.clone(),
                                op: Some(op),
                            },
                            kept: self.keep.as_ref().and_then(Keeping::last),
                        })),
                        None => Slot::Alone,
                    };
                    self.handoffs.decide(i, slot);
                    *sharer = Sharer::Decided;
                } else if before.as_ref().is_some_and(|b| b.1 > *room) {
                    *tries += 1;
                    if *tries >= PARTING_TRIES {
                        self.handoffs.decide(i, Slot::Alone);
                        *sharer = Sharer::Decided;
                    }
                }
            }
            self.lowest = lowest_room(&self.sharers);
        }
        self.counted(1);
        self.recorder.record(e.time, sample);
        if oom {
            self.recorder.out_of_memory();
            return Next::Stop;
        }
        Next::Event
    }

    /// Before event `index`: keeps the run as it stands where a checkpoint
    /// is due and the allocator holds every event before (none made of
    /// `index` yet, no small event let go by still to apply).
    fn keep_at(&mut self, index: usize) {
        let Some(keep) = self.keep.as_mut().filter(|k| k.due(index as u64)) else {
            return;
        };
        // A run that devices still share keeps only near the first one's
        // parting (its reserved bytes within an eighth of that device's
        // room): a checkpoint is read only by a run that parts after it,
        // and a copy of a run without a limit grows with its cache.
        let near = self.lowest == u64::MAX
            || self.runner.sample().reserved.get() >= self.lowest - self.lowest / 8;
        if self.first_op.is_some() || !near || !self.cycles.settled() {
            return;
        }
        keep.keep(Checkpoint {
            runner: self.runner.suspend(),
            recorder: self.recorder.maxima_so_far(),
            at: index as u64,
            workspaces_left: self.issued_size.workspaces_left,
            skipped: self.skipped.clone(),
            run: keep.run(),
            shared: !self.sharers.is_empty(),
        });
    }

    /// Whether the run is wanted only for what it hands on and has
    /// decided every device sharing it: nothing reads its events past here.
    fn shared_out(&self) -> bool {
        self.lowest == u64::MAX && self.handoffs.stops_when_decided()
    }

    /// From the first event of a step let go by ([`Next::Bulk`]), step
    /// after step while they are let go by: each stretch of small events
    /// that are the same on every step at once ([`Item::Stretch`]), every
    /// other event made and taken by [`Sim::event`]. Returns the event the
    /// simulation goes on from one by one (`None`: it stopped), where the
    /// steps are no longer let go by, or where a stretch could take a
    /// waiting device past its room (the events decide it one by one).
    fn bulk(&mut self, program: &Program) -> Option<u64> {
        self.in_bulk = true;
        let at = self.bulk_steps(program);
        self.in_bulk = false;
        at
    }

    fn bulk_steps(&mut self, program: &Program) -> Option<u64> {
        loop {
            let index = self.index as u64;
            let Some((run, k, copy)) = self.cycles.bulk_step(index) else {
                return Some(index);
            };
            let (Some(steps), true) = (program.steps(&run), copy < run.copies) else {
                return Some(index);
            };
            let Some(plan) = self.cycles.plan(k, &steps, &self.runner) else {
                return Some(index);
            };
            let terms = steps.terms(copy);
            for item in &plan.items {
                let index = self.index as u64;
                match *item {
                    Item::One(q) => {
                        let Some(e) = steps.event(q, index, &terms) else {
                            return Some(index);
                        };
                        if self.event(&e) == Next::Stop {
                            return None;
                        }
                        if !self.cycles.replaying() {
                            return Some(self.index as u64);
                        }
                    }
                    Item::Stretch(Span {
                        q,
                        n,
                        at,
                        max_at,
                        min_at,
                        total,
                        segment,
                    }) => {
                        if self.shared_out() {
                            return None;
                        }
                        let sample = self.runner.sample();
                        if self.lowest < u64::MAX
                            && sample.reserved.get().saturating_add(segment) > self.lowest
                        {
                            return Some(index);
                        }
                        let before = self.cycles.allocated();
                        let prefix = plan.prefix.get(at..).unwrap_or(&[]);
                        let bytes = |i: u64| {
                            let step = prefix.get(i as usize).copied().unwrap_or(0);
                            i128::from(sample.allocated.get())
                                + i128::from(before)
                                + i128::from(step)
                        };
                        if bytes(min_at) < 0 || bytes(max_at) > i128::from(u64::MAX) {
                            return Some(index);
                        }
                        let stretch = Stretch {
                            n,
                            reserved: sample.reserved,
                            max_at,
                            min_at,
                        };
                        let time = |i: u64| {
                            steps
                                .event(q + i, index + i, &terms)
                                .map_or(Nanos(0), |e| e.time)
                        };
                        let allocated = |i: u64| Bytes(u64::try_from(bytes(i)).unwrap_or(0));
                        self.recorder.record_stretch(&stretch, allocated, time);
                        self.cycles.let_by_stretch(n, total);
                        self.counted(usize::try_from(n).unwrap_or(usize::MAX));
                    }
                }
            }
            // The next step's first event ends this one.
            self.cycles.boundary(self.index as u64, &mut self.runner);
            self.keep_at(self.index);
            if !self.cycles.replaying() {
                return Some(self.index as u64);
            }
        }
    }
}

/// Events between two progress ticks of a simulation.
pub const TICK: u64 = 1 << 16;

#[cfg(test)]
#[path = "simulate_tests.rs"]
mod tests;
