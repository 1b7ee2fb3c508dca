//! The simulations of one estimate and how a shell runs them.
//!
//! An estimate needs, for the target and for each compared GPU, a run
//! without a capacity limit (the peak) and, for each compared GPU, a run at
//! its capacity (the verdict). Unlimited runs depend only on the cuBLAS
//! workspace configuration and the architecture whose kernels the schedule
//! holds blocks of, so GPUs that share both share that run.

use std::collections::BTreeMap;

use super::{simulate_schedule, Config, Error, Prepared, Progress, Stage};
use crate::diag::Warning;
use crate::presets::GpuTarget;
use crate::report::{GpuRuns, ReportError, ReportInput, RunSummary, SimulatedRun};
use crate::simulator::{AllocatorConfig, GpuMemory};
use crate::units::Bytes;

/// One simulation of [`super::estimate_with`], to run wherever the caller likes.
pub type SimulationJob<'a> = Box<dyn FnOnce() -> SimulatedRun + Send + 'a>;

/// Runs independent simulations: the CLI on several threads, the browser's
/// worker (one thread) in turn with [`InTurn`]. The core itself never
/// starts a thread.
pub trait Parallel {
    /// Runs every job and returns their results in the jobs' order, calling
    /// `finished(n)` on the calling thread as the number of finished jobs grows.
    fn run_all<'a>(
        &self,
        jobs: Vec<SimulationJob<'a>>,
        finished: &mut dyn FnMut(u64),
    ) -> Vec<SimulatedRun>;
}

/// Runs jobs one after the other on the calling thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct InTurn;

impl Parallel for InTurn {
    fn run_all<'a>(
        &self,
        jobs: Vec<SimulationJob<'a>>,
        finished: &mut dyn FnMut(u64),
    ) -> Vec<SimulatedRun> {
        let mut done = 0;
        jobs.into_iter()
            .map(|job| {
                let run = job();
                done += 1;
                finished(done);
                run
            })
            .collect()
    }
}

/// What an unlimited run depends on: the cuBLAS workspace size and count,
/// and the architecture whose kernels run (the schedule's blocks it makes).
type WorkspaceKey = (Bytes, u32, crate::kernels::Sm);

fn workspace_key(target: &GpuTarget) -> WorkspaceKey {
    (
        target.overheads.cublas_workspace_bytes,
        target.overheads.cublas_workspaces,
        target.kernel_sm(),
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
/// [`Stage::Simulating`] progress: one unlimited run per workspace
/// configuration, then one run at capacity per compared GPU.
pub(super) fn simulate_all<'c>(
    prepared: &Prepared,
    config: &'c Config,
    allocator: &AllocatorConfig,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Runs<'c>, Error> {
    let schedule = &prepared.orchestrated.schedule;
    let mut unlimited_targets: BTreeMap<WorkspaceKey, &GpuTarget> = BTreeMap::new();
    for target in std::iter::once(&config.reference).chain(&config.gpus) {
        unlimited_targets
            .entry(workspace_key(target))
            .or_insert(target);
    }
    let mut jobs: Vec<SimulationJob<'_>> = Vec::new();
    for &target in unlimited_targets.values() {
        jobs.push(Box::new(move || {
            simulate_schedule(schedule, target, allocator, &GpuMemory::unlimited())
        }));
    }
    for target in &config.gpus {
        jobs.push(Box::new(move || {
            let device = GpuMemory::new(target.capacity, target.overheads.context_bytes);
            simulate_schedule(schedule, target, allocator, &device)
        }));
    }
    let total = jobs.len() as u64;
    let mut simulating = |done| {
        progress(Progress {
            stage: Stage::Simulating,
            done,
            total,
        });
    };
    simulating(0);
    let mut results = parallel.run_all(jobs, &mut simulating).into_iter();
    let unlimited: BTreeMap<WorkspaceKey, SimulatedRun> = unlimited_targets
        .keys()
        .filter_map(|&key| results.next().map(|run| (key, run)))
        .collect();
    let missing = || Error::Report(ReportError::MissingSimulation);
    let unlimited_for = |target: &GpuTarget| {
        unlimited
            .get(&workspace_key(target))
            .cloned()
            .ok_or_else(missing)
    };
    let reference = unlimited_for(&config.reference)?;
    let mut gpus = Vec::with_capacity(config.gpus.len());
    for target in &config.gpus {
        let at_capacity = results.next().ok_or_else(missing)?;
        gpus.push((target, at_capacity, unlimited_for(target)?));
    }
    Ok(Runs { reference, gpus })
}

impl<'c> Runs<'c> {
    /// What the report is built from: these runs, the schedule's facts and
    /// the warnings of every stage.
    pub(super) fn report_input<'a>(
        &'a self,
        prepared: &'a Prepared,
        config: &'a Config,
        warnings: Vec<Warning>,
    ) -> ReportInput<'a> {
        let schedule = &prepared.orchestrated.schedule;
        let facts = &prepared.orchestrated.facts;
        let summary = RunSummary {
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
            n_blocks: u32::try_from(schedule.blocks.len()).unwrap_or(u32::MAX),
            n_events: u32::try_from(schedule.events.len()).unwrap_or(u32::MAX),
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
        };
        ReportInput {
            schedule,
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
            max_timeline_points: config.max_timeline_points,
        }
    }
}
