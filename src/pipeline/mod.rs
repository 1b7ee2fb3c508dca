//! The pipeline: the stages of [`crate`] run in order, with the settings of a
//! whole estimate ([`Config`]) and the half-way point the UI and the what-ifs
//! reuse ([`Prepared`]).
//!
//! - [`prepare_from`] (and [`prepare`] on bytes in memory): trace →
//!   analyzer → orchestrator, giving a [`Prepared`];
//! - [`estimate_with`] (and [`estimate`]): simulate on the reference GPU and
//!   on every selected GPU at its capacity ([`runs`]), then report;
//!   [`estimate_split`], [`runs_at_capacity`] and [`Pending::finish`]: the
//!   same with some GPUs' runs at capacity simulated by another worker;
//! - [`run_from`] and [`run`]: both in turn;
//! - [`simulate_job`] and [`schedule_ops`]: the orchestrator → simulator
//!   glue the estimate and the what-ifs share ([`simulate`]).
//!
//! Invariants: no I/O and no threads (a shell hands the input in piece by
//! piece through a [`TraceSource`] and runs independent simulations its own
//! way through a [`Parallel`]); the report does not depend on how the
//! simulations were run.

mod capture;
mod config;
mod cycles;
mod estimate;
mod events;
mod handoffs;
mod resume;
mod runs;
mod settings;
mod simulate;
mod stream;

pub use capture::{figures as capture_figures, CaptureFigures};
pub use config::{Config, DEFAULT_MEMORY_BUDGET, DEFAULT_TARGET};
pub use estimate::{
    estimate, estimate_split, estimate_with, runs_at_capacity, share_early, share_with_one, Pending,
};
pub use events::{event_rows, EventRow};
pub use resume::Resume;
pub use runs::{
    at_capacity, at_capacity_from, at_capacity_keeping, CapacityRun, InTurn, Parallel, Parting,
    SimulationJob, Split, Task,
};
pub use settings::Settings;
pub use simulate::{schedule_ops, simulate_job};

use serde::{Deserialize, Serialize};

use crate::analyzer::{self, AnalyzeError};
use crate::diag::{Setting, Warned, Warning};
use crate::orchestrator::{self, OrchestrateError, Orchestrated};
use crate::presets::PresetError;
use crate::report::{Report, ReportError};
use crate::simulator::ConfigError;
use crate::trace::{self, TraceError, TraceSource};
use crate::units::Bytes;

/// The pipeline step being worked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Parsing,
    /// Building the trace of the larger job ([`crate::scale`]).
    Rebuilding,
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

impl Stage {
    /// Every stage, in the order a run goes through them (a run of the
    /// traced job skips [`Stage::Rebuilding`]).
    pub const ALL: [Stage; 6] = [
        Stage::Parsing,
        Stage::Rebuilding,
        Stage::Analyzing,
        Stage::Orchestrating,
        Stage::Simulating,
        Stage::Reporting,
    ];

    /// The stage's place in [`Stage::ALL`] (0-based).
    pub fn index(self) -> usize {
        Stage::ALL.iter().position(|s| *s == self).unwrap_or(0)
    }
}

impl Progress {
    /// The start of a stage counted in one unit.
    fn start(stage: Stage) -> Progress {
        Progress {
            stage,
            done: 0,
            total: 1,
        }
    }
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
    #[error(
        "the parameter bytes {0:?} are not a size: give bytes such as 500MiB, 1.5GiB or 124439808"
    )]
    ParameterBytes(String),
    #[error(transparent)]
    Scale(#[from] crate::scale::ScaleError),
    #[error("the autocast type {0:?} is not one CUDA autocast runs in: give bf16 or fp16")]
    AutocastDtype(String),
    #[error(
        "this rebuilt job is streamed from its rebuilds and cannot be expanded into events; ask for fewer layers or new tokens"
    )]
    EventsStreamed,
    #[error("no autocast policy is known for PyTorch {given:?}: give one of {known}")]
    AutocastPolicy { given: String, known: String },
}

impl Error {
    /// The setting the message asks the user to give, if any: each shell
    /// names its own control for it.
    pub fn setting(&self) -> Option<Setting> {
        match self {
            Error::Orchestrate(err) => err.setting(),
            Error::ParameterBytes(_) => Some(Setting::ParameterBytes),
            Error::Scale(err) => err.setting(),
            Error::Trace(_)
            | Error::AutocastDtype(_)
            | Error::AutocastPolicy { .. }
            | Error::EventsStreamed
            | Error::Analyze(_)
            | Error::AllocatorConfig(_)
            | Error::Gpu(_)
            | Error::Report(_) => None,
        }
    }
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
    /// The parameters with and without gradients, and the buffers, as
    /// scheduled.
    #[serde(default)]
    pub state: orchestrator::StateFacts,
    /// What the run does (training, fine-tuning, a forward pass).
    #[serde(default)]
    pub run_kind: analyzer::RunKind,
    /// Samples per batch, when the trace shows it
    /// ([`analyzer::loader_batch_size`]).
    pub batch_size: Option<u32>,
    /// The run's structure and recipe ([`analyzer::RunRecipe`]).
    pub recipe: analyzer::RunRecipe,
    /// Warnings of the trace, analyzer and orchestrator stages.
    pub warnings: Vec<Warning>,
    /// The same job under CUDA autocast (bf16), for the mixed-precision
    /// what-if: made for traces that ran no op in 16 bits, when the config
    /// asks for it (`AutocastConfig::what_if`).
    #[serde(default)]
    pub autocast: Option<Box<Orchestrated>>,
    /// What was rebuilt for a job larger than the traced one.
    #[serde(default)]
    pub scaled: crate::scale::ScaleFacts,
    /// The traced job's depth and length (of the first trace).
    #[serde(default)]
    pub traced: crate::scale::Traced,
    /// A `generate()` run: its calls and KV cache.
    #[serde(default)]
    pub generation: Option<analyzer::generation::Generation>,
    /// A mixture-of-experts model: its experts and the traced routing.
    pub moe: Option<analyzer::moe::Moe>,
    /// A rebuilt job streamed to the simulator ([`stream`]): its events
    /// are this program's, and `orchestrated.schedule` holds only its
    /// iterations and phases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<Box<crate::program::Program>>,
    /// What memcast's capture helper wrote into the (first) trace: the full
    /// job it stands for, whose figures the estimate took where the
    /// settings left them as traced.
    #[serde(default)]
    pub capture: Option<Box<crate::trace::Capture>>,
    /// How quantized weights are stored ([`report::RunSummary::quantization`]).
    #[serde(default)]
    pub quantization: Option<String>,
}

impl Prepared {
    /// The same job with its program's events held whole as a schedule
    /// (what a what-if that changes the schedule reads); `None` where it
    /// is not streamed or its program cannot be expanded.
    pub fn held_whole(&self) -> Option<Prepared> {
        self.clone().into_held_whole()
    }

    /// [`Prepared::held_whole`], taking the job.
    pub fn into_held_whole(mut self) -> Option<Prepared> {
        self.orchestrated.schedule = self.program.take()?.schedule()?;
        Some(self)
    }

    /// The job to simulate.
    pub fn job(&self) -> crate::program::JobRef<'_> {
        match &self.program {
            Some(program) => crate::program::JobRef::Program(program),
            None => crate::program::JobRef::Schedule(&self.orchestrated.schedule),
        }
    }
}

/// Runs the whole pipeline on the bytes of a `.json` or `.json.gz` trace.
///
/// ```
/// // A one-iteration trace of a tiny Linear model, as torch.profiler writes it.
/// let bytes = include_bytes!("../../tests/fixtures/tiny_step.json");
/// let config = memcast::Config::for_gpus("t4", &["t4".to_owned()]).unwrap();
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
    let prepared = prepare_many_with(&mut [source], config, progress, parallel)?;
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
    prepare_many_from(&mut [source], config, progress)
}

/// Like [`prepare_from`] for one or more traces of one job at different
/// sequence lengths (`Config::scale` names the length to estimate): each is
/// read in turn, then the job's trace is rebuilt from them ([`crate::scale`]).
pub fn prepare_many_from(
    sources: &mut [&mut dyn TraceSource],
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> Result<Prepared, Error> {
    prepare_many_with(sources, config, progress, &InTurn)
}

/// [`prepare_many_from`] with `parallel` running the independent rebuilds
/// a derived job is made from (the same result however they run).
pub fn prepare_many_with(
    sources: &mut [&mut dyn TraceSource],
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Prepared, Error> {
    let mut traces = Vec::with_capacity(sources.len());
    let mut warnings = Vec::new();
    for source in sources.iter_mut() {
        let trace = trace::read(&mut **source, &mut |done, total| {
            progress(Progress {
                stage: Stage::Parsing,
                done,
                total,
            });
        })?;
        warnings.extend(trace.warnings);
        traces.push(trace.value);
    }
    let capture = traces.first().and_then(|t| t.header.capture.clone());
    let config = &capture::apply(config, capture.as_deref());
    if traces.len() == 1 && config.scale.is_identity() {
        return prepare_parsed(&traces, warnings, config, progress);
    }
    let traced = traces
        .first()
        .map(crate::scale::inspect)
        .unwrap_or_default();
    progress(Progress::start(Stage::Rebuilding));
    if let Some(mut prepared) = stream::prepare(&traces, &warnings, config, progress, parallel)? {
        prepared.traced = traced;
        prepared.capture = capture;
        return Ok(prepared);
    }
    let scaled = rebuild(&traces, config)?;
    warnings.extend(scaled.warnings);
    // The traces read can go before the rebuilt one is analyzed (the
    // browser holds both otherwise).
    drop(traces);
    let (trace, facts) = scaled.value;
    let mut prepared = prepare_trace(&trace, facts, warnings, config, progress)?;
    prepared.traced = traced;
    prepared.capture = capture;
    Ok(prepared)
}

/// Like [`prepare_many_from`] for traces already parsed (with the parser's
/// warnings): what a what-if that estimates one job at several targets
/// calls, reading its traces once.
pub fn prepare_parsed(
    traces: &[trace::Trace],
    mut warnings: Vec<Warning>,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> Result<Prepared, Error> {
    let traced = traces
        .first()
        .map(crate::scale::inspect)
        .unwrap_or_default();
    let capture = traces.first().and_then(|t| t.header.capture.clone());
    let config = &capture::apply(config, capture.as_deref());
    let mut prepared = match traces {
        [one] if config.scale.is_identity() => prepare_trace(
            one,
            crate::scale::ScaleFacts::default(),
            warnings,
            config,
            progress,
        )?,
        _ => {
            progress(Progress::start(Stage::Rebuilding));
            match stream::prepare(traces, &warnings, config, progress, &InTurn)? {
                Some(prepared) => prepared,
                None => {
                    let scaled = rebuild(traces, config)?;
                    warnings.extend(scaled.warnings);
                    let (trace, facts) = scaled.value;
                    prepare_trace(&trace, facts, warnings, config, progress)?
                }
            }
        }
    };
    prepared.traced = traced;
    prepared.capture = capture;
    Ok(prepared)
}

/// A generation's job derived once from four short rebuilds at the depth
/// `config.scale` asks for, and made at any number of new tokens without
/// rebuilding ([`GenerationJob::prepared`]): for a search over lengths. Each
/// is the [`Prepared`] that [`prepare_parsed`] makes of the same traces
/// and settings where it streams the job.
#[derive(Debug, Clone)]
pub struct GenerationJob {
    derivation: stream::Derivation,
    traced: crate::scale::Traced,
    capture: Option<Box<crate::trace::Capture>>,
}

impl GenerationJob {
    /// The generation of `traces` derived; `None` where the traces are no
    /// generation, the settings ask for the job built whole, or its decode
    /// steps do not grow step by step (then [`prepare_parsed`] builds each
    /// length whole).
    pub fn derive(
        traces: &[trace::Trace],
        config: &Config,
        parallel: &dyn Parallel,
    ) -> Result<Option<GenerationJob>, Error> {
        let capture = traces.first().and_then(|t| t.header.capture.clone());
        let config = &capture::apply(config, capture.as_deref());
        if config.materialize {
            return Ok(None);
        }
        crate::scale::validate(&config.scale)?;
        let derivation = stream::Derivation::of(traces, &[], config, &mut |_| {}, parallel)?;
        Ok(derivation.map(|derivation| GenerationJob {
            derivation,
            traced: traces
                .first()
                .map(crate::scale::inspect)
                .unwrap_or_default(),
            capture,
        }))
    }

    /// The fewest new tokens it makes.
    pub fn first_tokens(&self) -> u32 {
        self.derivation.first_tokens()
    }

    /// The job at `new_tokens` new tokens (at least
    /// [`GenerationJob::first_tokens`]); `None` where its facts do not grow
    /// that far.
    pub fn prepared(&self, new_tokens: u32) -> Option<Prepared> {
        let mut prepared = self.derivation.prepared(new_tokens)?;
        prepared.traced = self.traced.clone();
        prepared.capture = self.capture.clone();
        Some(prepared)
    }
}

/// The trace of the job `config.scale` asks for, rebuilt from `traces`
/// once its work is known to fit `config.memory_budget` (a request too
/// large is refused before anything is built, with the largest that fits).
fn rebuild(
    traces: &[trace::Trace],
    config: &Config,
) -> Result<Warned<(trace::Trace, crate::scale::ScaleFacts)>, Error> {
    Ok(crate::scale::scale_within(
        traces,
        &config.scale,
        config.work_budget(),
    )?)
}

/// Analyzes and orchestrates a parsed (and possibly rebuilt) trace.
fn prepare_trace(
    trace: &trace::Trace,
    scaled: crate::scale::ScaleFacts,
    mut warnings: Vec<Warning>,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> Result<Prepared, Error> {
    progress(Progress::start(Stage::Analyzing));
    let mut analyzer_config = config.analyzer.clone();
    analyzer_config.keep_op_inputs |= config.orchestrator.autocast.what_if;
    let analysis = analyzer::analyze(trace, &analyzer_config)?;
    warnings.extend(analysis.warnings);
    let analysis = analysis.value;
    progress(Progress::start(Stage::Orchestrating));
    // A trace rebuilt with more blocks captured only the traced blocks'
    // share of a foreach step's lists: the rule models them over every
    // parameter.
    let mut orchestrator_config = config.orchestrator.clone();
    orchestrator_config.remodel_foreach = scaled
        .depth
        .as_ref()
        .is_some_and(|d| d.estimated > d.traced);
    let orchestrated = orchestrator::orchestrate(&analysis, &orchestrator_config)?;
    warnings.extend(orchestrated.warnings);
    let autocast = if config.orchestrator.autocast.what_if {
        orchestrator::orchestrate_under_autocast(&analysis, &orchestrator_config)
            .map(|o| Box::new(o.value))
    } else {
        None
    };
    let state = orchestrated.value.facts.state;
    Ok(Prepared {
        orchestrated: orchestrated.value,
        optimizer: analysis.optimizer.class_name.clone(),
        parameter_bytes: state.parameter_bytes,
        n_parameters: state.n_parameters,
        state,
        run_kind: analysis.state.run_kind,
        batch_size: analysis.batch_size,
        recipe: analysis.recipe.clone(),
        warnings,
        autocast,
        scaled,
        traced: crate::scale::Traced::default(),
        generation: analysis.generation.clone(),
        moe: analysis.moe.clone(),
        program: None,
        capture: None,
        quantization: quantization_of(&analysis.quant_kernels),
    })
}

/// How the trace's quantized weights are stored, from the bitsandbytes
/// kernels it runs (4-bit when any is a 4-bit kernel).
fn quantization_of(kernels: &[analyzer::quantized::QuantKernel]) -> Option<String> {
    use analyzer::quantized::QuantOp;
    let four_bit = kernels.iter().any(|k| {
        matches!(
            k.kind,
            QuantOp::Gemm4bit | QuantOp::Dequantize4bit | QuantOp::Gemv4bitCpuPacked
        )
    });
    let eight_bit = kernels.iter().any(|k| {
        matches!(
            k.kind,
            QuantOp::Int8VectorwiseQuant | QuantOp::Int8LinearMatmul | QuantOp::Int8MmDequant
        )
    });
    match (four_bit, eight_bit) {
        (true, _) => Some("bitsandbytes 4-bit".to_owned()),
        (false, true) => Some("bitsandbytes 8-bit (LLM.int8())".to_owned()),
        (false, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::OrchestratorConfig;
    use crate::report;
    use crate::{presets, simulator};

    pub(super) const TINY: &[u8] = include_bytes!("../../tests/fixtures/tiny_step.json");

    pub(super) fn gpus(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn progress_walks_through_every_stage_in_order() {
        let config = Config::for_gpus("t4", &gpus(&["t4", "l4"])).unwrap();
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
        // Counted in events: one unlimited run (the GPUs share their
        // workspace size, and the job has no block whose size depends on
        // the architecture) and one run at capacity per GPU, of every
        // event; from none to all, never back, the end only once all ran.
        let events = u64::from(
            run(TINY, &config, &mut |_| {})
                .unwrap()
                .value
                .summary
                .n_events,
        );
        let total = simulating[0].1;
        assert_eq!(total, 3 * events, "{simulating:?}");
        assert_eq!(simulating.first(), Some(&(0, total)));
        assert_eq!(simulating.last(), Some(&(total, total)));
        assert!(simulating
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 == w[1].1));
        assert!(seen.iter().all(|p| p.done <= p.total));
    }

    /// A GPU the unlimited run fits takes it as its run at capacity; the
    /// verdicts are those of a run at each capacity, and of the runs at
    /// capacity without a report (the unlimited runs stopped once every GPU
    /// has parted, [`at_capacity`]).
    #[test]
    fn verdicts_are_those_of_a_run_at_each_capacity() {
        let sizes = ["1MiB", "3MiB", "8MiB", "40MiB", "t4"];
        for alloc_conf in [
            "",
            "expandable_segments:True",
            "per_process_memory_fraction:0.5",
        ] {
            let config = Config {
                alloc_conf: alloc_conf.to_owned(),
                ..Config::for_gpus("t4", &gpus(&sizes)).unwrap()
            };
            let prepared = prepare(TINY, &config, &mut |_| {}).unwrap();
            let report = estimate(&prepared, &config, &mut |_| {}).unwrap().value;
            let alone = at_capacity(&prepared, &config, &mut |_| {}, &InTurn).unwrap();
            let figures: Vec<report::AtCapacity> = alone.iter().map(|r| r.at).collect();
            let verdicts: Vec<report::AtCapacity> = report
                .gpus
                .iter()
                .map(report::GpuVerdict::at_capacity)
                .collect();
            assert!(verdicts.iter().any(|v| v.fits) && verdicts.iter().any(|v| !v.fits));
            assert_eq!(figures, verdicts, "{alloc_conf}");
            let allocator = config.allocator().unwrap();
            for ((target, verdict), alone) in config.gpus.iter().zip(&report.gpus).zip(&alone) {
                let device =
                    simulator::GpuMemory::new(target.capacity, target.overheads.context_bytes);
                let run = simulate_job(
                    prepared.job(),
                    target,
                    &allocator,
                    &device,
                    crate::report::Recorder::maxima(),
                    &mut |_| {},
                );
                let peak = run.max_reserved + target.overheads.context_bytes;
                assert_eq!(
                    verdict.peak_total_bytes, peak,
                    "{alloc_conf} {}",
                    target.name
                );
                assert_eq!(
                    verdict.fits,
                    run.oom_at.is_none() && peak <= target.capacity,
                    "{alloc_conf} {}",
                    target.name
                );
                assert_eq!(alone.ran_out_at, run.oom_at, "{alloc_conf} {}", target.name);
            }
            assert!(report.gpus.iter().any(|g| !g.fits) && report.gpus.iter().any(|g| g.fits));
        }
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
        let err = Config::for_gpus("a100-80gb", &gpus(&["a100"])).unwrap_err();
        assert!(matches!(err, Error::Gpu(PresetError::Unknown(_))));
        let err = Config::for_gpus("a100", &[]).unwrap_err();
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
        let assumed = Config::for_gpus("t4", &gpus(&["t4"])).unwrap();
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

    #[test]
    fn the_target_and_the_compared_gpus_are_given_apart() {
        // The page: the default target, the selected GPUs compared.
        let page = Config::for_gpus(DEFAULT_TARGET, &gpus(&["t4", "l4"])).unwrap();
        assert_eq!(page.reference.name, "a100-80gb");
        let names: Vec<&str> = page.gpus.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["t4", "l4"]);
        // No GPUs: every preset, as the standard estimate.
        let every = Config::for_gpus(DEFAULT_TARGET, &[]).unwrap();
        assert_eq!(every, Config::standard());
        // A custom size as the target.
        let custom = Config::for_gpus("24GiB", &gpus(&["24GiB"])).unwrap();
        assert_eq!(custom.reference.capacity, Bytes(24 * Bytes::GIB));
    }
}
