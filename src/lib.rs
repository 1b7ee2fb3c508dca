//! memcast estimates the GPU memory of a PyTorch training job from a
//! `torch.profiler` trace captured on the CPU, with the xMem pipeline.
//!
//! Steps, each a pure stage with one entry function:
//! 1. [`trace`] — read the Chrome trace (`.json` or `.json.gz`) into typed events;
//! 2. [`analyzer`] — rebuild memory-block lifecycles and attribute them to ops,
//!    layers and training phases;
//! 3. [`orchestrator`] — turn CPU lifetimes into the sequence a CUDA run would have;
//! 4. [`simulator`] — replay it through a model of PyTorch's CUDA caching allocator;
//! 5. [`report`] — peak, timeline, breakdown and per-GPU verdicts as plain data.
//!
//! [`replay`] is the validation mode: it replays real GPU-side allocator data
//! (memory snapshots, profiler memory events) through the simulator.
//!
//! Architecture invariant: everything outside `web` (and the binaries in
//! `src/bin`) is core — it does no I/O, reads no clock or environment, never
//! prints and never panics on user data.

pub mod analyzer;
pub mod diag;
pub mod orchestrator;
pub mod permalink;
pub mod presets;
pub mod protocol;
pub mod replay;
pub mod report;
pub mod simulator;
pub mod trace;
pub mod units;
pub mod whatif;

#[cfg(feature = "web")]
pub mod web;

pub use diag::{Warned, Warning};
pub use units::{Bytes, Nanos};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use analyzer::{AnalyzeError, AnalyzerConfig};
use orchestrator::{Category, EventKind, OrchestrateError, Orchestrated, OrchestratorConfig};
use presets::{GpuTarget, PresetError};
use report::{GpuRuns, MemSample, Report, ReportError, ReportInput, RunSummary, SimulatedRun};
use simulator::{AllocatorConfig, ConfigError, Device, RuleVersion, SimOp};
use trace::{TraceError, TraceSource};

/// Settings of a whole estimate. Build one with [`Config::standard`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub analyzer: AnalyzerConfig,
    pub orchestrator: OrchestratorConfig,
    /// A `PYTORCH_CUDA_ALLOC_CONF` string; empty for PyTorch's defaults.
    pub alloc_conf: String,
    /// The GPU whose overheads the headline peak uses.
    pub reference: GpuTarget,
    /// The GPUs to give a verdict for, in this order.
    pub gpus: Vec<GpuTarget>,
    /// Points the report's timeline keeps at most.
    pub max_timeline_points: usize,
}

impl Config {
    /// The standard estimate: three iterations, the CUDA default optimizer
    /// path, default allocator settings, the A100 80 GB as the reference and a
    /// verdict for every preset.
    pub fn standard() -> Config {
        let gpus: Vec<GpuTarget> = presets::PRESETS
            .iter()
            .map(GpuTarget::from_preset)
            .collect();
        let reference = presets::find("a100-80gb")
            .map(GpuTarget::from_preset)
            .or_else(|| gpus.first().cloned())
            .unwrap_or_else(|| GpuTarget {
                name: "unlimited".to_owned(),
                is_preset: false,
                arch: None,
                capacity: Bytes(u64::MAX),
                overheads: presets::DeviceOverheads::for_unknown_arch(),
            });
        Config {
            analyzer: AnalyzerConfig::standard(),
            orchestrator: OrchestratorConfig::standard(),
            alloc_conf: String::new(),
            reference,
            gpus,
            max_timeline_points: report::DEFAULT_MAX_POINTS,
        }
    }

    /// Assumes `context` bytes of CUDA context on every GPU instead of the
    /// per-architecture figures of [`presets::OVERHEADS`].
    pub fn with_context(mut self, context: Bytes) -> Config {
        self.reference.overheads.context_bytes = context;
        for gpu in &mut self.gpus {
            gpu.overheads.context_bytes = context;
        }
        self
    }

    /// Sets the GPUs from `NAME|SIZE` strings; the first becomes the reference.
    /// An empty list keeps the current GPUs.
    pub fn with_gpus(mut self, specs: &[String]) -> Result<Config, Error> {
        if specs.is_empty() {
            return Ok(self);
        }
        let gpus = specs
            .iter()
            .map(|spec| presets::parse_gpu(spec))
            .collect::<Result<Vec<GpuTarget>, PresetError>>()?;
        if let Some(first) = gpus.first() {
            self.reference = first.clone();
        }
        self.gpus = gpus;
        Ok(self)
    }
}

/// The pipeline step being worked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Parsing,
    Analyzing,
    Orchestrating,
    Simulating,
    Reporting,
}

/// Progress of a run: `done` out of `total` units of the current stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub stage: Stage,
    pub done: u64,
    pub total: u64,
}

/// Why an estimate failed; each stage's error, with its advice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Analyze(#[from] AnalyzeError),
    #[error(transparent)]
    Orchestrate(#[from] OrchestrateError),
    #[error(transparent)]
    AllocatorConfig(#[from] ConfigError),
    #[error(transparent)]
    Gpu(#[from] PresetError),
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// A trace parsed, analyzed and orchestrated: everything up to the
/// simulation. [`estimate`] runs the simulation and report from it, so a UI can
/// change GPUs or allocator settings without reading the trace again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    pub orchestrated: Orchestrated,
    pub optimizer: Option<String>,
    pub parameter_bytes: Bytes,
    pub n_parameters: u32,
    /// Samples per batch, when the trace shows it
    /// ([`analyzer::loader_batch_size`]).
    pub batch_size: Option<u32>,
    /// Warnings of the trace, analyzer and orchestrator stages.
    pub warnings: Vec<Warning>,
}

/// Runs the whole pipeline on the bytes of a `.json` or `.json.gz` trace.
///
/// ```
/// // A one-iteration trace of a tiny Linear model, as torch.profiler writes it.
/// let bytes = include_bytes!("../tests/fixtures/tiny_step.json");
/// let config = memcast::Config::standard()
///     .with_gpus(&["t4".to_owned()])
///     .unwrap();
/// let report = memcast::run(bytes, &config, &mut |_| {}).unwrap().value;
/// assert_eq!(report.schema, "memcast.estimate/1");
/// assert_eq!(report.breakdown_at_peak.total(), report.peak.total_bytes);
/// assert!(report.gpus[0].fits);
/// ```
pub fn run(
    bytes: &[u8],
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> Result<Warned<Report>, Error> {
    let prepared = prepare(bytes, config, progress)?;
    estimate(&prepared, config, progress)
}

/// Runs the whole pipeline on a trace read piece by piece from `source`
/// (what the CLI and the worker call: neither holds the whole file).
///
/// `parallel` runs the simulations (see [`estimate_with`]).
pub fn run_from(
    source: &mut dyn TraceSource,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Warned<Report>, Error> {
    let prepared = prepare_from(source, config, progress)?;
    estimate_with(&prepared, config, progress, parallel)
}

/// Parses, analyzes and orchestrates a trace.
pub fn prepare(
    bytes: &[u8],
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> Result<Prepared, Error> {
    prepare_from(&mut trace::SliceSource::new(bytes), config, progress)
}

/// Parses, analyzes and orchestrates a trace read piece by piece from `source`.
pub fn prepare_from(
    source: &mut dyn TraceSource,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> Result<Prepared, Error> {
    let trace = trace::read(source, &mut |done, total| {
        progress(Progress {
            stage: Stage::Parsing,
            done,
            total,
        });
    })?;
    let mut warnings = trace.warnings;
    progress(Progress {
        stage: Stage::Analyzing,
        done: 0,
        total: 1,
    });
    let analysis = analyzer::analyze(&trace.value, &config.analyzer)?;
    warnings.extend(analysis.warnings);
    let analysis = analysis.value;
    progress(Progress {
        stage: Stage::Orchestrating,
        done: 0,
        total: 1,
    });
    let orchestrated = orchestrator::orchestrate(&analysis, &config.orchestrator)?;
    warnings.extend(orchestrated.warnings);
    Ok(Prepared {
        orchestrated: orchestrated.value,
        optimizer: analysis.optimizer.class_name.clone(),
        parameter_bytes: analysis.parameters.iter().map(|p| p.bytes).sum(),
        n_parameters: u32::try_from(analysis.parameters.len()).unwrap_or(u32::MAX),
        batch_size: analysis.batch_size,
        warnings,
    })
}

/// Simulates a prepared schedule on the reference GPU (without a capacity
/// limit) and on every GPU of `config` (at its capacity), and builds the report.
pub fn estimate(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> Result<Warned<Report>, Error> {
    estimate_with(prepared, config, progress, &InTurn)
}

/// One simulation of [`estimate_with`], to run wherever the caller likes.
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

/// Estimates like [`estimate`], running the simulations (the reference
/// GPU's and each GPU's) with `parallel`. The report does not depend on how
/// they were run.
pub fn estimate_with(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Warned<Report>, Error> {
    let allocator = if config.alloc_conf.trim().is_empty() {
        AllocatorConfig::pytorch_defaults()
    } else {
        AllocatorConfig::parse(&config.alloc_conf, RuleVersion::New)?
    };
    let schedule = &prepared.orchestrated.schedule;
    // Unlimited runs depend only on the workspace size: one per size, then
    // one at capacity per GPU.
    let key = |target: &GpuTarget| {
        (
            target.overheads.cublas_workspace_bytes,
            target.overheads.cublas_workspaces,
        )
    };
    let mut unlimited_targets: BTreeMap<(Bytes, u32), &GpuTarget> = BTreeMap::new();
    for target in std::iter::once(&config.reference).chain(&config.gpus) {
        unlimited_targets.entry(key(target)).or_insert(target);
    }
    let mut jobs: Vec<SimulationJob<'_>> = Vec::new();
    for &target in unlimited_targets.values() {
        let allocator = &allocator;
        jobs.push(Box::new(move || {
            simulate_schedule(schedule, target, allocator, &Device::unlimited())
        }));
    }
    for target in &config.gpus {
        let allocator = &allocator;
        jobs.push(Box::new(move || {
            let device = Device::new(target.capacity, target.overheads.context_bytes);
            simulate_schedule(schedule, target, allocator, &device)
        }));
    }
    let total = jobs.len() as u64;
    progress(Progress {
        stage: Stage::Simulating,
        done: 0,
        total,
    });
    let mut results = parallel
        .run_all(jobs, &mut |done| {
            progress(Progress {
                stage: Stage::Simulating,
                done,
                total,
            });
        })
        .into_iter();
    let unlimited: BTreeMap<(Bytes, u32), SimulatedRun> = unlimited_targets
        .keys()
        .filter_map(|&k| results.next().map(|run| (k, run)))
        .collect();
    let unlimited_for = |target: &GpuTarget| unlimited.get(&key(target)).cloned();
    let missing = || Error::Report(ReportError::MissingSimulation);
    let reference_run = unlimited_for(&config.reference).ok_or_else(missing)?;
    let mut runs: Vec<(SimulatedRun, SimulatedRun)> = Vec::with_capacity(config.gpus.len());
    for target in &config.gpus {
        let at_capacity = results.next().ok_or_else(missing)?;
        runs.push((at_capacity, unlimited_for(target).ok_or_else(missing)?));
    }
    progress(Progress {
        stage: Stage::Reporting,
        done: 0,
        total: 1,
    });
    let facts = &prepared.orchestrated.facts;
    let summary = RunSummary {
        optimizer: prepared.optimizer.clone(),
        foreach_modelled: facts.foreach_modelled,
        iterations_captured: facts.iterations_captured,
        iterations_simulated: facts.iterations_simulated,
        parameter_bytes: prepared.parameter_bytes,
        n_parameters: prepared.n_parameters,
        n_blocks: u32::try_from(schedule.blocks.len()).unwrap_or(u32::MAX),
        n_events: u32::try_from(schedule.events.len()).unwrap_or(u32::MAX),
        alloc_conf: config.alloc_conf.clone(),
        rules: facts.rule_counts.clone(),
    };
    let input = ReportInput {
        schedule,
        reference: &config.reference,
        unlimited: &reference_run,
        gpus: config
            .gpus
            .iter()
            .zip(&runs)
            .map(|(target, (at_capacity, unlimited))| GpuRuns {
                target,
                at_capacity,
                unlimited,
            })
            .collect(),
        summary,
        warnings: {
            let mut warnings = prepared.warnings.clone();
            let context = config.reference.overheads.context_bytes;
            let sourced = presets::DeviceOverheads::for_arch(
                config.reference.arch.unwrap_or(presets::Arch::Ampere),
            )
            .context_bytes;
            if context == sourced {
                warnings.push(Warning::new(
                    "context_assumed",
                    format!(
                        "the CUDA context outside the allocator is assumed to be {} MiB on {} (a bare context with lazy module loading); a training process that has loaded cuBLAS and cuDNN kernels can hold a few hundred MiB more, so measure nvidia-smi used minus torch.cuda.memory_reserved() after one step and pass it with --context",
                        context.get() / Bytes::MIB,
                        config.reference.name
                    ),
                ));
            }
            warnings
        },
        max_timeline_points: config.max_timeline_points,
    };
    let report = report::build(&input)?;
    Ok(Warned {
        warnings: report.warnings.clone(),
        value: report,
    })
}

/// The simulator ops of a schedule on `target`: workspace blocks at the
/// target's cuBLAS workspace size (the first `cublas_workspaces` of them
/// only), zero-byte blocks skipped with their frees. Also returns, for each
/// schedule event, the number of ops issued up to and including it.
pub fn schedule_ops(
    schedule: &orchestrator::Schedule,
    target: &GpuTarget,
) -> (Vec<SimOp>, Vec<usize>) {
    let workspace = target.overheads.cublas_workspace_bytes;
    let mut workspaces_left = target.overheads.cublas_workspaces;
    let mut issued = vec![false; schedule.blocks.len()];
    let mut ops: Vec<SimOp> = Vec::with_capacity(schedule.events.len());
    let mut ops_through: Vec<usize> = Vec::with_capacity(schedule.events.len());
    for event in &schedule.events {
        let id = event.block.index();
        match event.kind {
            EventKind::Alloc => {
                let size = match schedule.blocks.get(id) {
                    Some(block) if block.category == Category::Workspace => {
                        if workspaces_left > 0 {
                            workspaces_left -= 1;
                            workspace
                        } else {
                            Bytes::ZERO
                        }
                    }
                    Some(block) => block.size,
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

/// Replays a schedule through the simulated allocator on one device, with
/// the target's cuBLAS workspace size, and returns one sample per schedule
/// event (fewer when the run ran out of memory).
pub fn simulate_schedule(
    schedule: &orchestrator::Schedule,
    target: &GpuTarget,
    allocator: &AllocatorConfig,
    device: &Device,
) -> SimulatedRun {
    let (ops, ops_through) = schedule_ops(schedule, target);
    let simulation = simulator::simulate(&ops, allocator, device);
    let op_samples: Vec<MemSample> = simulation
        .after_event
        .iter()
        .map(|s| MemSample {
            allocated: Bytes(s.allocated),
            reserved: Bytes(s.reserved),
        })
        .collect();
    let oom_op = simulation.oom.map(|oom| oom.event_index);
    let mut samples = Vec::with_capacity(schedule.events.len());
    let mut oom_at = None;
    for (event_index, &through) in ops_through.iter().enumerate() {
        if let Some(op) = oom_op {
            if through > op {
                oom_at = Some(event_index);
                if let Some(sample) = op_samples.get(op) {
                    samples.push(*sample);
                }
                break;
            }
        }
        let sample = through
            .checked_sub(1)
            .and_then(|last| op_samples.get(last))
            .copied()
            .unwrap_or_default();
        samples.push(sample);
    }
    SimulatedRun { samples, oom_at }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &[u8] = include_bytes!("../tests/fixtures/tiny_step.json");

    #[test]
    fn progress_walks_through_every_stage_in_order() {
        let config = Config::standard()
            .with_gpus(&["t4".to_owned(), "l4".to_owned()])
            .unwrap();
        let mut seen: Vec<Progress> = Vec::new();
        run(TINY, &config, &mut |p| seen.push(p)).unwrap();
        let mut stages: Vec<Stage> = seen.iter().map(|p| p.stage).collect();
        stages.dedup();
        assert_eq!(
            stages,
            vec![
                Stage::Parsing,
                Stage::Analyzing,
                Stage::Orchestrating,
                Stage::Simulating,
                Stage::Reporting
            ]
        );
        let simulating: Vec<(u64, u64)> = seen
            .iter()
            .filter(|p| p.stage == Stage::Simulating)
            .map(|p| (p.done, p.total))
            .collect();
        // The reference GPU and two GPUs: one unlimited run per workspace
        // size, one run at capacity per GPU.
        let total = simulating[0].1;
        assert!(total >= 3, "{simulating:?}");
        let expected: Vec<(u64, u64)> = (0..=total).map(|done| (done, total)).collect();
        assert_eq!(simulating, expected);
        assert!(seen.iter().all(|p| p.done <= p.total));
    }

    #[test]
    fn stage_errors_reach_the_caller_with_their_advice() {
        let config = Config::standard();
        let err = run(b"", &config, &mut |_| {}).unwrap_err();
        assert!(matches!(err, Error::Trace(TraceError::Empty)));
        let bad_conf = Config {
            alloc_conf: "no_such_option:1".to_owned(),
            ..Config::standard()
        };
        let err = run(TINY, &bad_conf, &mut |_| {}).unwrap_err();
        assert!(matches!(err, Error::AllocatorConfig(_)), "{err}");
        assert!(err.to_string().contains("no_such_option"), "{err}");
        let err = Config::standard()
            .with_gpus(&["a100".to_owned()])
            .unwrap_err();
        assert!(matches!(err, Error::Gpu(PresetError::Unknown(_))));
        let zero = Config {
            orchestrator: OrchestratorConfig {
                iterations: 0,
                ..OrchestratorConfig::standard()
            },
            ..Config::standard()
        };
        let err = run(TINY, &zero, &mut |_| {}).unwrap_err();
        assert!(matches!(
            err,
            Error::Orchestrate(OrchestrateError::NoIterations(0))
        ));
    }

    #[test]
    fn the_context_warning_is_only_given_for_the_assumed_value() {
        let assumed = Config::standard().with_gpus(&["t4".to_owned()]).unwrap();
        let report = run(TINY, &assumed, &mut |_| {}).unwrap();
        assert!(report.warnings.iter().any(|w| w.code == "context_assumed"));
        let measured = assumed.with_context(Bytes(700 * Bytes::MIB));
        let report = run(TINY, &measured, &mut |_| {}).unwrap();
        assert!(!report.warnings.iter().any(|w| w.code == "context_assumed"));
        assert_eq!(report.value.peak.context_bytes, Bytes(700 * Bytes::MIB));
    }

    #[test]
    fn the_context_override_applies_to_every_gpu() {
        let config = Config::standard().with_context(Bytes(123));
        assert_eq!(config.reference.overheads.context_bytes, Bytes(123));
        assert!(config
            .gpus
            .iter()
            .all(|g| g.overheads.context_bytes == Bytes(123)));
        assert_eq!(config.gpus.len(), presets::PRESETS.len());
        assert_eq!(config.reference.name, "a100-80gb");
    }
}
