//! The simulations of one estimate and how a shell runs them.
//!
//! An estimate needs, for the target and for each compared GPU, a run
//! without a capacity limit (the peak) and, for each compared GPU, a run at
//! its capacity (the verdict). Unlimited runs depend only on the cuBLAS
//! workspace configuration and the architecture whose kernels the schedule
//! holds blocks of, so GPUs that share both share that run. A run at
//! a capacity the unlimited run never came near is that run: the device
//! refuses a segment only past its capacity, so every allocator decision is
//! the same (without a memory fraction, which makes the allocator collect
//! garbage against the capacity). So the unlimited runs go first, and only
//! the GPUs they do not fit get a run of their own.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::program::SizeVariant;

use super::resume::{Keeping, Resume};
use super::simulate::{simulate_keeping, Handed, Handoffs, Start};
use super::{Config, Error, Prepared, Progress, Stage};
use crate::diag::Warning;
use crate::presets::GpuTarget;
use crate::report::{self, GpuRuns, Recorder, ReportError, ReportInput, RunSummary, SimulatedRun};
use crate::simulator::Runner;
use crate::simulator::{AllocatorConfig, GpuMemory};
use crate::units::Bytes;

/// One simulation of [`super::estimate_with`], to run wherever the caller
/// likes. It reports the events it has simulated, now and then, through
/// the function it is given.
pub type SimulationJob<'a> = Box<dyn FnOnce(&mut dyn FnMut(u64)) -> SimulatedRun + Send + 'a>;

/// Runs independent simulations: the CLI on several threads, the browser's
/// worker (one thread) in turn with [`InTurn`]. The core itself never
/// starts a thread.
pub trait Parallel {
    /// Runs every job and returns their results in the jobs' order, calling
    /// `simulated(n)` on the calling thread now and then with the number of
    /// events all jobs have simulated so far. A job may wait for one before
    /// it in `jobs` (a GPU's run at capacity for the unlimited run it parts
    /// from), so no job may start before those before it have started: run
    /// them in turn, or side by side taken in order.
    fn run_all<'a>(
        &self,
        jobs: Vec<SimulationJob<'a>>,
        simulated: &mut dyn FnMut(u64),
    ) -> Vec<SimulatedRun>;

    /// Runs independent pieces of work (a derivation's rebuilds), each
    /// writing its result where it was told; in turn unless the shell can
    /// run them side by side. `done(n)` is called on the calling thread now
    /// and then with the number of tasks finished so far.
    fn run_tasks<'a>(&self, tasks: Vec<Task<'a>>, done: &mut dyn FnMut(usize)) {
        for (n, task) in tasks.into_iter().enumerate() {
            task();
            done(n + 1);
        }
    }
}

/// One piece of work for [`Parallel::run_tasks`].
pub type Task<'a> = Box<dyn FnOnce() + Send + 'a>;

/// Runs jobs one after the other on the calling thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct InTurn;

impl Parallel for InTurn {
    fn run_all<'a>(
        &self,
        jobs: Vec<SimulationJob<'a>>,
        simulated: &mut dyn FnMut(u64),
    ) -> Vec<SimulatedRun> {
        let mut done = 0u64;
        jobs.into_iter()
            .map(|job| {
                let mut tick = |n: u64| {
                    done = done.saturating_add(n);
                    simulated(done);
                };
                job(&mut tick)
            })
            .collect()
    }
}

/// What an unlimited run depends on: the cuBLAS workspace size and count,
/// and the size on the target of each kind of block whose size depends on
/// the GPU (0 where its architecture's kernels do not make it, `u64::MAX`
/// for its own size): GPUs that agree on all of these run the same
/// simulation.
type RunKey = (Bytes, u32, Vec<u64>);

fn run_key(target: &GpuTarget, variants: &[SizeVariant]) -> RunKey {
    let sm = target.kernel_sm();
    let sizes = variants
        .iter()
        .map(|&(on, per_gpu)| match per_gpu {
            _ if !on.contains(sm) => 0,
            Some(per_gpu) => per_gpu.bytes(target.device_limits()),
            None => u64::MAX,
        })
        .collect();
    (
        target.overheads.cublas_workspace_bytes,
        target.overheads.cublas_workspaces,
        sizes,
    )
}

/// The finished simulations of one estimate.
pub(super) struct Runs<'c> {
    /// The target's run without a capacity limit.
    reference: SimulatedRun,
    /// Each compared GPU with its run at capacity and its unlimited run.
    gpus: Vec<(&'c GpuTarget, SimulatedRun, SimulatedRun)>,
}

/// A compared GPU whose run at capacity is still to simulate once the
/// unlimited runs are done ([`Split`]): its index in the config's GPUs,
/// the event its run goes on alone from (where it left the unlimited run
/// it shared; 0: from the first event), so the events left to it at most,
/// and whether it runs out of memory for certain (its unlimited run
/// allocated more than the GPU leaves the allocator at once: it stops
/// there, at an event not known before, so what is left may be little).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parting {
    pub gpu: usize,
    pub from: u64,
    pub runs_out: bool,
}

/// Where an estimate's runs at capacity may be simulated elsewhere (a
/// shell's other worker, [`runs_at_capacity`]): once the unlimited runs
/// are done, `hand` is given the compared GPUs whose runs at capacity are
/// still to simulate, and returns those it has handed elsewhere (the
/// others are simulated here). A GPU whose run at capacity is the
/// unlimited run (it never left it) is never handed.
pub type Split<'s> = &'s mut dyn FnMut(&[Parting], u64) -> Vec<usize>;

/// The simulations of an estimate made here, those handed elsewhere
/// ([`Split`]) still missing.
pub(super) struct Simulated {
    unlimited: BTreeMap<RunKey, SimulatedRun>,
    at_capacity: BTreeMap<usize, SimulatedRun>,
    /// The job's GPU-dependent block sizes, which key the unlimited runs.
    variants: Vec<SizeVariant>,
}

impl Simulated {
    /// The compared GPUs (by index) whose runs at capacity were handed
    /// elsewhere.
    pub(super) fn elsewhere(&self, config: &Config) -> Vec<usize> {
        (0..config.gpus.len())
            .filter(|i| !self.at_capacity.contains_key(i))
            .collect()
    }

    /// The runs at capacity missing here (handed elsewhere before the
    /// unlimited runs) of the GPUs whose unlimited run never took its
    /// reserved bytes past the room they leave the allocator: without a
    /// memory fraction (`shares`), such a run at capacity is that run
    /// (the device refuses a segment only past its room), as
    /// [`Handoffs`] gives it.
    pub(super) fn fill_unparted(&mut self, config: &Config, shares: bool) {
        if !shares {
            return;
        }
        for (gpu, target) in config.gpus.iter().enumerate() {
            if self.at_capacity.contains_key(&gpu) {
                continue;
            }
            let Some(run) = self.unlimited.get(&run_key(target, &self.variants)) else {
                continue;
            };
            let room = device_of(target).available_to_allocator();
            if room.is_some_and(|room| run.max_reserved.get() <= room) {
                let run = SimulatedRun {
                    detail: None,
                    ..run.clone()
                };
                self.at_capacity.insert(gpu, run);
            }
        }
    }

    /// Every run of the estimate, with `given` (by GPU index) for those
    /// handed elsewhere; an error where one is still missing.
    pub(super) fn runs(
        mut self,
        config: &Config,
        given: Vec<(usize, SimulatedRun)>,
    ) -> Result<Runs<'_>, Error> {
        for (gpu, run) in given {
            if gpu < config.gpus.len() {
                self.at_capacity.entry(gpu).or_insert(run);
            }
        }
        let missing = || Error::Report(ReportError::MissingSimulation);
        let (unlimited, variants) = (&self.unlimited, &self.variants);
        let unlimited_for = |target: &GpuTarget| {
            unlimited
                .get(&run_key(target, variants))
                .cloned()
                .ok_or_else(missing)
        };
        let mut out = Vec::with_capacity(config.gpus.len());
        for (i, target) in config.gpus.iter().enumerate() {
            let run = self.at_capacity.remove(&i).ok_or_else(missing)?;
            out.push((target, run, unlimited_for(target)?));
        }
        Ok(Runs {
            reference: unlimited_for(&config.reference)?,
            gpus: out,
        })
    }
}

/// Runs every simulation an estimate needs with `parallel`, reporting
/// [`Stage::Simulating`] progress in events simulated (out of every run's
/// events; a run that was not needed, or stopped out of memory, counts as
/// done): one unlimited run per workspace configuration, then one run at
/// capacity per compared GPU the unlimited run does not fit.
/// Those `split` hands elsewhere are left out.
pub(super) fn simulate_here(
    prepared: &Prepared,
    summary: &RunSummary,
    config: &Config,
    allocator: &AllocatorConfig,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
    handing: Option<(&[usize], Split<'_>)>,
) -> Simulated {
    let (early, split) = match handing {
        Some((early, split)) => (early, Some(split)),
        None => (&[][..], None),
    };
    let variants = prepared.job().size_variants();
    let here: Vec<usize> = (0..config.gpus.len())
        .filter(|gpu| !early.contains(gpu))
        .collect();
    let plan = Plan {
        split,
        only: (!early.is_empty()).then_some(here),
        ..Plan::default()
    };
    let (unlimited, at_capacity) = simulate_runs(
        prepared,
        Some(summary),
        config,
        allocator,
        progress,
        parallel,
        plan,
    );
    Simulated {
        unlimited,
        at_capacity,
        variants,
    }
}

/// Each compared GPU's run at capacity alone, in the config's order, for
/// its verdict without a report: the unlimited runs are simulated only as
/// far as a GPU still shares them ([`Handoffs::sharing_only`]), and the
/// reference GPU's only where a compared GPU shares it. Each run is the
/// one [`simulate_here`] gives that GPU; with the last checkpoint its run
/// alone kept ([`super::resume`]) where `keep` is set.
pub(super) fn simulate_at_capacity(
    prepared: &Prepared,
    config: &Config,
    allocator: &AllocatorConfig,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
    keep: bool,
) -> Result<Vec<(SimulatedRun, Option<Resume>)>, Error> {
    let kept: Vec<Mutex<Option<Resume>>> = config.gpus.iter().map(|_| Mutex::new(None)).collect();
    let plan = Plan {
        kept: keep.then_some(kept.as_slice()),
        ..Plan::default()
    };
    let (_, mut at_capacity) =
        simulate_runs(prepared, None, config, allocator, progress, parallel, plan);
    let mut kept = kept.into_iter().map(|m| m.into_inner().ok().flatten());
    (0..config.gpus.len())
        .map(|i| {
            let run = at_capacity
                .remove(&i)
                .ok_or(Error::Report(ReportError::MissingSimulation))?;
            Ok((run, kept.next().flatten()))
        })
        .collect()
}

/// Which of an estimate's runs [`simulate_runs`] makes, and how.
#[derive(Default)]
struct Plan<'s> {
    /// Each compared GPU's slot for the last checkpoint its run alone
    /// keeps ([`super::resume`]); none kept where `None`.
    kept: Option<&'s [Mutex<Option<Resume>>]>,
    /// Only these compared GPUs' runs at capacity (by index; all where
    /// `None`), the unlimited runs going only as far as they share them.
    only: Option<Vec<usize>>,
    /// Where runs at capacity may be handed elsewhere once the unlimited
    /// runs are done.
    split: Option<Split<'s>>,
}

/// The runs at capacity of the compared GPUs `gpus` alone ([`Plan::only`];
/// indices past the config's GPUs are ignored), by index.
pub(super) fn simulate_only(
    prepared: &Prepared,
    config: &Config,
    allocator: &AllocatorConfig,
    gpus: &[usize],
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Vec<(usize, SimulatedRun)>, Error> {
    let plan = Plan {
        only: Some(gpus.to_vec()),
        ..Plan::default()
    };
    let (_, at_capacity) =
        simulate_runs(prepared, None, config, allocator, progress, parallel, plan);
    Ok(at_capacity.into_iter().collect())
}

/// The unlimited runs (by key) and each compared GPU's run at capacity (by
/// its index in the config) of an estimate: for its report where `summary`
/// is given (the reference GPU's unlimited run records what the report
/// shows), else only for the compared GPUs' verdicts (the unlimited runs
/// stop once every GPU sharing them has parted; they are not whole). The
/// GPUs `plan` leaves out, or its split hands elsewhere, have no run at
/// capacity.
fn simulate_runs(
    prepared: &Prepared,
    summary: Option<&RunSummary>,
    config: &Config,
    allocator: &AllocatorConfig,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
    plan: Plan<'_>,
) -> (
    BTreeMap<RunKey, SimulatedRun>,
    BTreeMap<usize, SimulatedRun>,
) {
    let Plan { kept, only, split } = plan;
    let only = only.as_deref();
    let wanted = |gpu: usize| only.is_none_or(|only| only.contains(&gpu));
    let job = prepared.job();
    let n = job.n_events();
    let n_hint = usize::try_from(n).unwrap_or(usize::MAX);
    let variants = job.size_variants();
    let key = |target: &GpuTarget| run_key(target, &variants);
    let mut unlimited_targets: BTreeMap<RunKey, &GpuTarget> = BTreeMap::new();
    let reference = summary.map(|_| &config.reference);
    for target in reference.into_iter().chain(&config.gpus) {
        unlimited_targets.entry(key(target)).or_insert(target);
    }
    if summary.is_none() {
        // Without a report, only the unlimited runs some GPU shares.
        unlimited_targets.retain(|run_key, _| {
            config
                .gpus
                .iter()
                .enumerate()
                .any(|(i, target)| wanted(i) && key(target) == *run_key)
        });
    }
    let reference_key = key(&config.reference);
    // An estimate's progress counts every compared GPU's run at capacity,
    // those made elsewhere too (they leave it short of the total).
    let compared = match summary {
        Some(_) => config.gpus.len(),
        None => (0..config.gpus.len()).filter(|&i| wanted(i)).count(),
    };
    let runs = unlimited_targets.len() as u64 + compared as u64;
    let total = runs.saturating_mul(n).max(1);
    let mut report = |done: u64| {
        progress(Progress {
            stage: Stage::Simulating,
            done: done.min(total),
            total,
        });
    };
    report(0);
    // Each compared GPU shares the unlimited run of its key until that run
    // first needs more than the GPU has: its run at capacity goes on from
    // there (`Handed::Parted`) rather than from the first event, and is the
    // unlimited run itself where that never happens (`Handed::Shared`).
    let sharers: Vec<Vec<(usize, GpuMemory)>> = unlimited_targets
        .keys()
        .map(|run_key| {
            config
                .gpus
                .iter()
                .enumerate()
                .filter(|(i, target)| wanted(*i) && key(target) == *run_key)
                .map(|(i, target)| (i, device_of(target)))
                .collect()
        })
        .collect();
    // What the runs set aside may hold, each unlimited run's share of a
    // sixteenth of the memory budget.
    let keep = Bytes(config.memory_budget.get() / 16 / (unlimited_targets.len().max(1) as u64));
    let handoffs: Vec<Handoffs> = sharers
        .iter()
        .map(|sharers| {
            let handoffs = Handoffs::new(sharers.len(), keep);
            match summary {
                Some(_) => handoffs,
                None => handoffs.sharing_only(),
            }
        })
        .collect();
    let fresh = || Runner::new(allocator, &GpuMemory::unlimited(), n_hint);
    // The unlimited runs first, then one job per compared GPU, which takes
    // its run from its unlimited run's handoffs (waiting, on a shell that
    // runs jobs side by side, until that run has decided it).
    let mut jobs: Vec<SimulationJob<'_>> = Vec::new();
    for ((run_key, &target), (sharers, handoffs)) in
        unlimited_targets.iter().zip(sharers.iter().zip(&handoffs))
    {
        let headline = summary.filter(|_| *run_key == reference_key);
        let recorder = match headline {
            Some(summary) => report::recorder(job, summary, config.max_timeline_points),
            None => Recorder::maxima(),
        };
        let headline = headline.is_some();
        let devices: Vec<GpuMemory> = sharers.iter().map(|(_, d)| *d).collect();
        let start = Start {
            runner: fresh(),
            recorder,
            at: 0,
            walked: None,
        };
        // Keeping checkpoints where asked, for the runs at capacity that
        // part from it ([`super::resume`]).
        let keep = kept.and_then(|_| Keeping::of(job, None));
        jobs.push(Box::new(move |tick| {
            let (mut run, _) = simulate_keeping(job, target, start, &devices, handoffs, tick, keep);
            // The report's blocks at the peak, found here: beside the runs
            // at capacity still going on, where the shell runs jobs side
            // by side.
            if let Some(detail) = run.detail.as_mut().filter(|_| headline) {
                detail.live_at_peak = Some(job.live_after(run.peak_index));
            }
            run
        }));
    }
    // Each GPU's slot: its unlimited run's handoffs and its place there.
    let mut slots: Vec<(usize, &Handoffs, usize)> = sharers
        .iter()
        .zip(&handoffs)
        .flat_map(|(sharers, handoffs)| {
            sharers
                .iter()
                .enumerate()
                .map(move |(slot, (gpu, _))| (*gpu, handoffs, slot))
        })
        .collect();
    // The smaller GPUs first: in a job that grows, they part sooner.
    slots.sort_by_key(|(gpu, _, _)| {
        let room = config
            .gpus
            .get(*gpu)
            .and_then(|target| device_of(target).available_to_allocator());
        (room.unwrap_or(u64::MAX), *gpu)
    });
    // The GPU of each job after the unlimited runs, in the jobs' order.
    let mut order: Vec<usize> = Vec::with_capacity(slots.len());
    let mut places: Vec<(&Handoffs, usize)> = Vec::with_capacity(slots.len());
    let shares = allocator.per_process_memory_fraction.is_none();
    for (gpu, handoffs, slot) in slots {
        let Some(target) = config.gpus.get(gpu) else {
            continue;
        };
        order.push(gpu);
        places.push((handoffs, slot));
        let device = device_of(target);
        let kept = kept.and_then(|k| k.get(gpu));
        jobs.push(Box::new(move |tick| {
            let mut from = None;
            let start = match handoffs.take(slot) {
                Handed::Parted(part) => {
                    from = part.kept.clone();
                    part.start()
                }
                // Without a memory fraction (garbage collected against the
                // capacity), a run the device never limited is its run.
                Handed::Shared(run) if shares => {
                    tick(n);
                    return run;
                }
                Handed::Shared(_) | Handed::Alone => Start {
                    runner: Runner::new(allocator, &device, n_hint),
                    recorder: Recorder::maxima(),
                    at: 0,
                    walked: None,
                },
            };
            let keep = kept.and_then(|_| Keeping::of(job, from));
            let none = Handoffs::none();
            let (run, resume) = simulate_keeping(job, target, start, &[], &none, tick, keep);
            if let Some(Ok(mut kept)) = kept.map(Mutex::lock) {
                *kept = resume;
            }
            run
        }));
    }
    let results = match split {
        None => parallel.run_all(jobs, &mut |done| report(done)),
        Some(hand) => {
            // The unlimited runs first; then the GPUs whose runs at
            // capacity are still to simulate may be handed elsewhere.
            let capacity_jobs = jobs.split_off(unlimited_targets.len());
            let mut results = parallel.run_all(jobs, &mut |done| report(done));
            let before = (unlimited_targets.len() as u64).saturating_mul(n);
            // The most each GPU's unlimited run allocated.
            let allocated: BTreeMap<&RunKey, u64> = unlimited_targets
                .keys()
                .zip(&results)
                .map(|(k, run)| (k, run.max_allocated.get()))
                .collect();
            let partings: Vec<Parting> = order
                .iter()
                .zip(&places)
                .filter_map(|(&gpu, (handoffs, slot))| {
                    let from = handoffs.left_from(*slot, shares)?;
                    let target = config.gpus.get(gpu)?;
                    let most = allocated.get(&key(target)).copied().unwrap_or(0);
                    let room = device_of(target).available_to_allocator().unwrap_or(0);
                    Some(Parting {
                        gpu,
                        from,
                        runs_out: most > room,
                    })
                })
                .collect();
            let handed = if partings.is_empty() {
                Vec::new()
            } else {
                hand(&partings, n)
            };
            let mut here = Vec::with_capacity(capacity_jobs.len());
            let mut left = Vec::with_capacity(order.len());
            for ((gpu, (handoffs, slot)), job) in order.iter().zip(&places).zip(capacity_jobs) {
                if handed.contains(gpu) && partings.iter().any(|p| p.gpu == *gpu) {
                    handoffs.forget(*slot);
                } else {
                    left.push(*gpu);
                    here.push(job);
                }
            }
            order = left;
            report(before);
            results.extend(parallel.run_all(here, &mut |done| {
                report(before.saturating_add(done));
            }));
            results
        }
    };
    let mut results = results.into_iter();
    let unlimited: BTreeMap<RunKey, SimulatedRun> = unlimited_targets
        .keys()
        .filter_map(|k| results.next().map(|run| (k.clone(), run)))
        .collect();
    let whole = order.len() == compared;
    let at_capacity: BTreeMap<usize, SimulatedRun> = order.into_iter().zip(results).collect();
    // Runs handed elsewhere leave the progress short of the total: their
    // events are counted where they are simulated.
    if whole {
        report(total);
    }
    (unlimited, at_capacity)
}

/// The device a GPU's run at capacity has: its capacity, less its context.
pub(super) fn device_of(target: &GpuTarget) -> GpuMemory {
    GpuMemory::new(target.capacity, target.overheads.context_bytes)
}

impl<'c> Runs<'c> {
    /// What the report is built from: these runs, the job and the warnings
    /// of every stage.
    pub(super) fn report_input<'a>(
        &'a self,
        prepared: &'a Prepared,
        config: &'a Config,
        summary: RunSummary,
        warnings: Vec<Warning>,
    ) -> ReportInput<'a> {
        ReportInput {
            job: prepared.job(),
            reference: &config.reference,
            unlimited: &self.reference,
            gpus: self
                .gpus
                .iter()
                .map(|(target, at_capacity, unlimited)| GpuRuns {
                    target,
                    at_capacity,
                    unlimited,
                })
                .collect(),
            summary,
            warnings,
        }
    }
}

/// The facts of the run the report repeats.
pub(super) fn summary(prepared: &Prepared, config: &Config) -> RunSummary {
    let job = prepared.job();
    let facts = &prepared.orchestrated.facts;
    RunSummary {
        optimizer: prepared.optimizer.clone(),
        foreach_modelled: facts.foreach_modelled,
        iterations_captured: facts.iterations_captured,
        iterations_simulated: facts.iterations_simulated,
        parameter_bytes: prepared.parameter_bytes,
        n_parameters: prepared.n_parameters,
        trainable_parameter_bytes: prepared.state.trainable_bytes,
        frozen_parameter_bytes: prepared.state.frozen_bytes,
        buffer_bytes: prepared.state.buffer_bytes,
        quantized_parameter_bytes: prepared.state.quantized_bytes,
        quant_state_bytes: prepared.state.quant_state_bytes,
        run_kind: prepared.run_kind,
        n_blocks: u32::try_from(job.n_blocks()).unwrap_or(u32::MAX),
        n_events: u32::try_from(job.n_events()).unwrap_or(u32::MAX),
        alloc_conf: config.alloc_conf.clone(),
        rules: facts.rule_counts.clone(),
        cpu_scratch: facts.cpu_scratch.clone(),
        recipe: prepared.recipe.clone(),
        scaled: prepared.scaled.clone(),
        traced: prepared.traced.clone(),
        generation: prepared.generation.clone(),
        moe: prepared.moe.clone(),
        capture: prepared.capture.clone(),
        quantization: prepared.quantization.clone(),
    }
}

/// A GPU's run at its capacity, as a search over sizes reads it: its
/// verdict's figures, and the job's event at which it ran out of memory
/// (after releasing its cache and retrying), if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityRun {
    pub at: report::AtCapacity,
    pub ran_out_at: Option<u64>,
}

impl CapacityRun {
    fn of(run: &report::SimulatedRun, target: &GpuTarget) -> CapacityRun {
        CapacityRun {
            at: report::AtCapacity::of(run, target),
            ran_out_at: run.oom_at,
        }
    }
}

/// Each GPU of `config` at its capacity, without a report: whether the job
/// fits and its peak there, the figures of the verdicts [`estimate`] gives
/// (the same runs), for a search that asks only that of many sizes
/// (`whatif context`); the runs go through `parallel`. The unlimited runs,
/// which a report needs whole, go only as far as some GPU still shares
/// them.
pub fn at_capacity(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Vec<CapacityRun>, Error> {
    Ok(
        at_capacity_keeping(prepared, config, progress, parallel, false)?
            .into_iter()
            .map(|(run, _)| run)
            .collect(),
    )
}

/// [`at_capacity`], each GPU's run with the last checkpoint its run alone
/// kept where `keep` is set ([`Resume`]: a shorter generation's run on that
/// GPU is taken up from it with [`at_capacity_from`]).
pub fn at_capacity_keeping(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
    keep: bool,
) -> Result<Vec<(CapacityRun, Option<Resume>)>, Error> {
    let allocator = config.allocator()?;
    let runs = simulate_at_capacity(prepared, config, &allocator, progress, parallel, keep)?;
    Ok(config
        .gpus
        .iter()
        .zip(runs)
        .map(|(target, (run, resume))| (CapacityRun::of(&run, target), resume))
        .collect())
}

/// The run at capacity of `target`, taken up from `resume` (a longer
/// generation's run on that GPU, [`at_capacity_keeping`]): the run
/// [`at_capacity`] gives, and its own last checkpoint; `None` where the
/// prepared job does not make the events before the checkpoint (it is not
/// a shorter generation of the same job, or its first call's steps end
/// before it).
pub fn at_capacity_from(
    prepared: &Prepared,
    target: &GpuTarget,
    resume: &Resume,
) -> Option<(CapacityRun, Option<Resume>)> {
    let job = prepared.job();
    let start = resume.start_for(job, device_of(target))?;
    let keep = Keeping::of(job, Some(resume.clone()));
    let none = Handoffs::none();
    let (run, kept) = simulate_keeping(job, target, start, &[], &none, &mut |_| {}, keep);
    Some((CapacityRun::of(&run, target), kept))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{ArchSet, Sm};
    use crate::orchestrator::{Category, Phase, Schedule, ScheduledBlock};
    use crate::presets::parse_gpu;
    use crate::program::JobRef;

    fn block(on: ArchSet) -> ScheduledBlock {
        ScheduledBlock {
            size: Bytes(1 << 20),
            category: Category::Temporary,
            iteration: Some(0),
            phase: Phase::Forward,
            op: None,
            layer: None,
            on,
            per_gpu: None,
        }
    }

    /// GPUs share a simulation where they agree on every block whose size
    /// depends on the GPU: without such blocks, by their workspaces alone.
    #[test]
    fn gpus_share_a_run_where_every_block_has_the_same_size() {
        let key = |schedule: &Schedule, gpu: &str| {
            let variants = JobRef::Schedule(schedule).size_variants();
            run_key(&parse_gpu(gpu).unwrap(), &variants)
        };
        let plain = Schedule {
            blocks: vec![block(ArchSet::ALL)],
            ..Schedule::default()
        };
        assert_eq!(key(&plain, "t4"), key(&plain, "l4"));
        assert_ne!(key(&plain, "t4"), key(&plain, "h100-80gb"));
        // A block only sm80 kernels make: the A100s apart from the A10.
        let ampere = Schedule {
            blocks: vec![block(ArchSet::ALL), block(ArchSet::of(Sm(8, 0)))],
            ..Schedule::default()
        };
        assert_eq!(key(&ampere, "a100-40gb"), key(&ampere, "a100-80gb"));
        assert_ne!(key(&ampere, "a100-80gb"), key(&ampere, "a10"));
        assert_eq!(key(&ampere, "a10"), key(&ampere, "t4"));
    }
}
