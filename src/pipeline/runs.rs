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

use crate::program::SizeVariant;

use super::simulate::{simulate_from, Parted, Start};
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
    /// events all jobs have simulated so far.
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

/// Runs every simulation an estimate needs with `parallel`, reporting
/// [`Stage::Simulating`] progress in events simulated (out of every run's
/// events; a run that was not needed, or stopped out of memory, counts as
/// done): one unlimited run per workspace configuration, then one run at
/// capacity per compared GPU the unlimited run does not fit.
pub(super) fn simulate_all<'c>(
    prepared: &Prepared,
    summary: &RunSummary,
    config: &'c Config,
    allocator: &AllocatorConfig,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Runs<'c>, Error> {
    let job = prepared.job();
    let n = job.n_events();
    let n_hint = usize::try_from(n).unwrap_or(usize::MAX);
    let variants = job.size_variants();
    let key = |target: &GpuTarget| run_key(target, &variants);
    let mut unlimited_targets: BTreeMap<RunKey, &GpuTarget> = BTreeMap::new();
    for target in std::iter::once(&config.reference).chain(&config.gpus) {
        unlimited_targets.entry(key(target)).or_insert(target);
    }
    let reference_key = key(&config.reference);
    let runs = unlimited_targets.len() as u64 + config.gpus.len() as u64;
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
    // there (`Parted`) rather than from the first event.
    let sharers: Vec<Vec<(usize, GpuMemory)>> = unlimited_targets
        .keys()
        .map(|run_key| {
            config
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, target)| key(target) == *run_key)
                .map(|(i, target)| (i, device_of(target)))
                .collect()
        })
        .collect();
    let mut parted: Vec<Vec<Option<Parted>>> = sharers.iter().map(|_| Vec::new()).collect();
    let fresh = || Runner::new(allocator, &GpuMemory::unlimited(), n_hint);
    // What the runs set aside may hold, each unlimited run's share of a
    // sixteenth of the memory budget.
    let keep = Bytes(config.memory_budget.get() / 16 / (unlimited_targets.len().max(1) as u64));
    let mut jobs: Vec<SimulationJob<'_>> = Vec::new();
    for ((run_key, &target), (sharers, slot)) in unlimited_targets
        .iter()
        .zip(sharers.iter().zip(parted.iter_mut()))
    {
        let recorder = if *run_key == reference_key {
            report::recorder(job, summary, config.max_timeline_points)
        } else {
            Recorder::maxima()
        };
        let devices: Vec<GpuMemory> = sharers.iter().map(|(_, d)| *d).collect();
        let start = Start {
            runner: fresh(),
            recorder,
            at: 0,
        };
        jobs.push(Box::new(move |tick| {
            let (run, parts) = simulate_from(job, target, start, &devices, keep, tick);
            *slot = parts;
            run
        }));
    }
    let mut results = parallel.run_all(jobs, &mut |done| report(done)).into_iter();
    let unlimited: BTreeMap<RunKey, SimulatedRun> = unlimited_targets
        .keys()
        .filter_map(|k| results.next().map(|run| (k.clone(), run)))
        .collect();
    let mut parted: BTreeMap<usize, Parted> = sharers
        .iter()
        .zip(parted)
        .flat_map(|(sharers, parts)| sharers.iter().map(|(i, _)| *i).zip(parts))
        .filter_map(|(i, part)| Some((i, part?)))
        .collect();
    let missing = || Error::Report(ReportError::MissingSimulation);
    let unlimited_for =
        |target: &GpuTarget| unlimited.get(&key(target)).cloned().ok_or_else(missing);
    // The GPUs whose unlimited run never came near their capacity take it
    // as their run at capacity.
    let mut gpus: Vec<(&GpuTarget, Option<SimulatedRun>, SimulatedRun)> = Vec::new();
    for target in &config.gpus {
        let free_run = unlimited_for(target)?;
        let device = device_of(target);
        let same = allocator.per_process_memory_fraction.is_none()
            && device.memory_limit.is_none()
            && device
                .available_to_allocator()
                .is_some_and(|room| free_run.max_reserved.get() <= room);
        let at_capacity = same.then(|| capped(&free_run));
        gpus.push((target, at_capacity, free_run));
    }
    let first = unlimited.len() as u64 + gpus.iter().filter(|g| g.1.is_some()).count() as u64;
    let done_before = first.saturating_mul(n);
    report(done_before);
    let mut jobs: Vec<SimulationJob<'_>> = Vec::new();
    for (i, (target, at_capacity, _)) in gpus.iter().enumerate() {
        if at_capacity.is_none() {
            let target: &GpuTarget = target;
            let device = device_of(target);
            let start = match parted.remove(&i) {
                Some(part) => part.start(),
                None => Start {
                    runner: Runner::new(allocator, &device, n_hint),
                    recorder: Recorder::maxima(),
                    at: 0,
                },
            };
            jobs.push(Box::new(move |tick| {
                simulate_from(job, target, start, &[], Bytes::ZERO, tick).0
            }));
        }
    }
    let mut capped_runs = if jobs.is_empty() {
        Vec::new()
    } else {
        parallel.run_all(jobs, &mut |done| report(done_before.saturating_add(done)))
    }
    .into_iter();
    let mut out = Vec::with_capacity(gpus.len());
    for (target, at_capacity, free_run) in gpus {
        let at_capacity = match at_capacity {
            Some(run) => run,
            None => capped_runs.next().ok_or_else(missing)?,
        };
        out.push((target, at_capacity, free_run));
    }
    report(total);
    Ok(Runs {
        reference: unlimited_for(&config.reference)?,
        gpus: out,
    })
}

/// The device a GPU's run at capacity has: its capacity, less its context.
fn device_of(target: &GpuTarget) -> GpuMemory {
    GpuMemory::new(target.capacity, target.overheads.context_bytes)
}

/// An unlimited run as the run at a capacity it fits (the verdict reads
/// its maxima and whether it ran out of memory).
fn capped(run: &SimulatedRun) -> SimulatedRun {
    SimulatedRun {
        detail: None,
        ..run.clone()
    }
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
