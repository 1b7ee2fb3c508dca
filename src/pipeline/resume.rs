//! Runs at capacity taken up again from where a longer generation's run
//! stood, rather than simulated again from the start.
//!
//! A generation's first `generate()` call grows its cache a step at a time
//! ([`crate::program::Program::first_steps_fixed`]): a shorter generation
//! makes the same events as a longer one up to the end of any of those
//! steps it has, so the allocator decides the same up to there, on any
//! GPU. A run at a GPU's capacity therefore keeps, every [`EVERY`] decode
//! steps of that call, the run as it stood at the step's start
//! ([`Checkpoint`]: the allocator and its live ids, the figures so far, the
//! blocks not issued and the workspaces left). The run of a shorter
//! generation on that GPU is the run taken up from the last checkpoint at
//! or before the end of its own steps ([`Resume::start_for`]): the same
//! decisions and figures as a run from the first event (an integration
//! test holds the two to each other), at the cost of at most [`EVERY`]
//! steps and what follows them. `whatif context` tries next the length
//! whose first call ends just before the step a run ran out at: such a
//! generation.
//!
//! A checkpoint is taken only where the allocator holds every event before
//! it: not inside decode steps let go by whose small events are not applied
//! yet ([`super::cycles::Cycles::settled`]). A GPU's run at capacity shares
//! the unlimited run until it parts (`runs.rs`), usually only a few steps
//! before it runs out: the unlimited run keeps checkpoints too, and a run
//! at capacity starts with the last one taken before it parted (its
//! allocator put on the GPU when taken up, as a run set aside at parting
//! is).

use std::collections::HashSet;
use std::sync::Arc;

use super::simulate::{Start, Walked};
use crate::program::{JobRef, StepRun};
use crate::report::Recorder;
use crate::simulator::{GpuMemory, Runner, Suspended};

/// Decode steps between two checkpoints of a run: the most a run taken up
/// simulates again before the end of its steps.
pub const EVERY: u64 = 64;

/// A run as it stood at the start of a decode step (see the module docs).
#[derive(Debug)]
pub(super) struct Checkpoint {
    pub(super) runner: Suspended,
    /// Its figures so far ([`Recorder::maxima_so_far`]).
    pub(super) recorder: Recorder,
    /// The event it stood before: the first of a step of `run`.
    pub(super) at: u64,
    pub(super) workspaces_left: u32,
    pub(super) skipped: HashSet<u64>,
    /// The first call's run of steps it was taken in.
    pub(super) run: StepRun,
    /// Taken in a run without a capacity limit that the GPU still shared:
    /// its allocator is put on the GPU when taken up
    /// ([`Suspended::on_device`]).
    pub(super) shared: bool,
}

/// A run at capacity's last checkpoint, to take the run of a shorter
/// generation up from ([`super::at_capacity_from`]).
#[derive(Debug, Clone)]
pub struct Resume(Arc<Checkpoint>);

impl Resume {
    /// The event the run stood before.
    pub fn at(&self) -> u64 {
        self.0.at
    }

    /// Where `job`'s run on the same GPU goes on from the checkpoint, or
    /// `None` where `job` does not make the events before it: its first
    /// call's steps are another run, or end before the checkpoint.
    pub(super) fn start_for(&self, job: JobRef<'_>, device: GpuMemory) -> Option<Start> {
        let run = job.first_steps_fixed()?;
        let kept = &self.0;
        let end = run.start.checked_add(run.copies.checked_mul(run.events)?)?;
        if run.start != kept.run.start || run.events != kept.run.events || kept.at > end {
            return None;
        }
        let runner = if kept.shared {
            kept.runner.on_device(device)?
        } else {
            kept.runner.clone()
        };
        Some(Start {
            runner: Runner::resume(runner),
            recorder: kept.recorder.maxima_so_far(),
            at: usize::try_from(kept.at).ok()?,
            walked: Some(Walked::before(kept.workspaces_left, kept.skipped.clone())),
        })
    }
}

/// What a run at capacity keeps as it goes ([`super::simulate`]).
#[derive(Debug)]
pub(super) struct Keeping {
    run: StepRun,
    /// The step from which the next checkpoint is due.
    due: u64,
    last: Option<Arc<Checkpoint>>,
}

impl Keeping {
    /// For a run of `job`, where its first call's steps grow a step at a
    /// time (`None`: nothing to keep).
    /// `from`: the checkpoint the run starts with, the last one of the run
    /// it parted from.
    pub(super) fn of(job: JobRef<'_>, from: Option<Resume>) -> Option<Keeping> {
        let run = job.first_steps_fixed().filter(|r| r.events > 0)?;
        Some(Keeping {
            run,
            due: 0,
            last: from.map(|r| r.0),
        })
    }

    /// Whether a checkpoint is due before event `index`: the first event
    /// of a step of the run (or the event just after its last), at or past
    /// the step due.
    pub(super) fn due(&self, index: u64) -> bool {
        let Some(past) = index.checked_sub(self.run.start) else {
            return false;
        };
        let step = past / self.run.events;
        past % self.run.events == 0 && step >= self.due && step <= self.run.copies
    }

    /// Keeps `checkpoint` (taken where [`Keeping::due`] said) as the last.
    pub(super) fn keep(&mut self, checkpoint: Checkpoint) {
        let step = checkpoint.at.saturating_sub(self.run.start) / self.run.events;
        self.due = step.saturating_add(EVERY);
        self.last = Some(Arc::new(checkpoint));
    }

    /// The run's first call's steps.
    pub(super) fn run(&self) -> StepRun {
        self.run
    }

    /// The last checkpoint kept.
    pub(super) fn last(&self) -> Option<Resume> {
        self.last.clone().map(Resume)
    }
}
