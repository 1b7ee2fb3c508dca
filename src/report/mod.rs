//! Stage 4 — **report**: the simulation and analysis → the plain-data `Report`
//! that the CLI prints, the worker posts and the snapshot tests compare.
//!
//! Input: the orchestrated schedule, the simulation without a capacity limit
//! (the estimate) and one simulation per GPU at its capacity (the verdicts).
//! Output: peak reserved, allocated and total (with device overheads), when
//! and where the peak happens, a downsampled timeline that keeps every local
//! maximum, the breakdown at the peak by category and layer, the verdict per
//! GPU, and the warnings.
//!
//! Invariants: plain serde data with deterministic field and element order; the
//! breakdown categories sum exactly to the peak total.

pub mod accuracy;
mod recorder;
mod timeline;
mod verdict;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use accuracy::{ErrorBand, JobKind, Margin};
pub use recorder::{LiveAtPeak, Recorder, RunDetail, SimulatedRun, Stretch};
pub use timeline::{downsample, Downsampler, TimelinePoint, DEFAULT_MAX_POINTS};
use verdict::verdict;
pub use verdict::{kernels_on, AtCapacity, GpuVerdict};

use crate::diag::Warning;
use crate::orchestrator::{Category, IterationSpan, Phase, PhaseWindow};
use crate::presets::GpuTarget;
use crate::program::{JobEvent, JobRef};
use crate::units::{Bytes, Nanos};

/// The version tag of the JSON report.
pub const SCHEMA: &str = "memcast.estimate/1";

/// How many layers the report lists at the peak.
pub const TOP_LAYERS: usize = 10;

/// Facts about the run that the report repeats for the reader.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RunSummary {
    /// The optimizer class seen in the trace, e.g. `Adam`.
    pub optimizer: Option<String>,
    /// Whether the CUDA `foreach` optimizer path was modelled in place of the
    /// captured per-tensor step.
    pub foreach_modelled: bool,
    pub iterations_captured: u32,
    pub iterations_simulated: u32,
    /// Every parameter's bytes, with or without a gradient (the trace's,
    /// or the user's figure).
    pub parameter_bytes: Bytes,
    pub n_parameters: u32,
    /// The parameters that get a gradient.
    #[serde(default)]
    pub trainable_parameter_bytes: Bytes,
    /// The parameters that get none (frozen, or all in a forward-only run).
    #[serde(default)]
    pub frozen_parameter_bytes: Bytes,
    /// The model's buffers (BatchNorm statistics, position ids, ...).
    #[serde(default)]
    pub buffer_bytes: Bytes,
    /// Of the frozen parameters, those stored quantized (int8, packed
    /// 4-bit); absent when none.
    #[serde(default, skip_serializing_if = "Bytes::is_zero")]
    pub quantized_parameter_bytes: Bytes,
    /// The quantized weights' quantisation state (bitsandbytes' absmax,
    /// code tables, LLM.int8()'s `SCB`), resident beside them and not in
    /// `parameter_bytes`; absent when none.
    #[serde(default, skip_serializing_if = "Bytes::is_zero")]
    pub quant_state_bytes: Bytes,
    /// What the run does: training, fine_tuning, forward_with_autograd or
    /// inference.
    #[serde(default)]
    pub run_kind: crate::analyzer::RunKind,
    /// Blocks and events in the orchestrated schedule.
    pub n_blocks: u32,
    pub n_events: u32,
    /// The `PYTORCH_CUDA_ALLOC_CONF` string simulated (empty for defaults).
    pub alloc_conf: String,
    /// What each orchestration rule did.
    pub rules: Vec<crate::orchestrator::RuleCount>,
    /// The CPU kernels' private scratch left out of the CUDA run, per op
    /// (rule `cpu_scratch`), largest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_scratch: Vec<crate::orchestrator::OpBytes>,
    /// The run's structure and training recipe: micro-batches per optimizer
    /// step, checkpointing, clipping, torch.compile, distributed, the loop.
    #[serde(default)]
    pub recipe: crate::analyzer::RunRecipe,
    /// What was rebuilt when the job estimated is larger than the traced
    /// one (`--layers`, `--seq-len`); absent for the traced job.
    #[serde(default, skip_serializing_if = "crate::scale::ScaleFacts::is_empty")]
    pub scaled: crate::scale::ScaleFacts,
    /// The traced job's repeated blocks and sequence length (what
    /// `--layers` and `--seq-len` start from).
    #[serde(default, skip_serializing_if = "crate::scale::Traced::is_empty")]
    pub traced: crate::scale::Traced,
    /// A `generate()` run: model calls, the KV cache at the end of the
    /// first generation and its bytes per token; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<crate::analyzer::generation::Generation>,
    /// A mixture-of-experts model: experts per layer, each expert's
    /// weights, the traced routing and what the worst routing could add;
    /// absent for a dense model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<crate::analyzer::moe::Moe>,
    /// What memcast's capture helper wrote into the trace: the model, the
    /// job and the full job's figures the estimate took where the settings
    /// left them as traced; absent for other traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<Box<crate::trace::Capture>>,
    /// How quantized weights are stored, from the bitsandbytes kernels the
    /// trace runs: `bitsandbytes 4-bit` or `bitsandbytes 8-bit (LLM.int8())`;
    /// absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<String>,
}

/// When and where the peak happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakPlace {
    /// Index of the schedule event at which reserved memory first reaches its peak.
    pub event_index: u32,
    pub time_ns: Nanos,
    /// The simulated iteration (0-based), `None` during setup.
    pub iteration: Option<u32>,
    pub phase: Phase,
    pub op: Option<String>,
    pub layer: Option<String>,
}

/// Peak memory of the run without a capacity limit, on the reference GPU's
/// overheads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peak {
    /// Highest reserved memory (segments held by the caching allocator).
    pub reserved_bytes: Bytes,
    /// Highest allocated memory (live blocks, rounded sizes); may happen at
    /// another moment than the reserved peak.
    pub allocated_bytes: Bytes,
    /// Highest reserved memory plus the CUDA context: what the process needs.
    pub total_bytes: Bytes,
    /// The CUDA context included in `total_bytes`.
    pub context_bytes: Bytes,
    pub at: PeakPlace,
}

/// Bytes by category at the peak; the fields sum exactly to
/// [`Peak::total_bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Breakdown {
    pub parameters: Bytes,
    /// The quantized weights' quantisation state (absent when none).
    #[serde(default, skip_serializing_if = "Bytes::is_zero")]
    pub quant_state: Bytes,
    pub buffers: Bytes,
    pub gradients: Bytes,
    pub optimizer_state: Bytes,
    /// DistributedDataParallel's gradient buckets (absent when none).
    #[serde(default, skip_serializing_if = "Bytes::is_zero")]
    pub buckets: Bytes,
    /// A generation's KV cache (absent when none).
    #[serde(default, skip_serializing_if = "Bytes::is_zero")]
    pub kv_cache: Bytes,
    pub activations: Bytes,
    pub batch: Bytes,
    pub temporaries: Bytes,
    /// Reserved but not requested: cached free blocks, block rounding and
    /// segment fragmentation.
    pub cached: Bytes,
    /// CUDA context plus cuBLAS workspaces.
    pub overheads: Bytes,
}

impl Breakdown {
    /// The sum of every category.
    pub fn total(&self) -> Bytes {
        self.parameters
            + self.quant_state
            + self.buffers
            + self.gradients
            + self.optimizer_state
            + self.buckets
            + self.kv_cache
            + self.activations
            + self.batch
            + self.temporaries
            + self.cached
            + self.overheads
    }

    fn add(&mut self, category: Category, size: Bytes) {
        let slot = match category {
            Category::Parameter => &mut self.parameters,
            Category::Buffer => &mut self.buffers,
            Category::Gradient => &mut self.gradients,
            Category::OptimizerState => &mut self.optimizer_state,
            Category::Activation => &mut self.activations,
            Category::Batch => &mut self.batch,
            Category::Temporary => &mut self.temporaries,
            Category::Workspace => &mut self.overheads,
            Category::Bucket => &mut self.buckets,
            Category::KvCache => &mut self.kv_cache,
            Category::QuantState => &mut self.quant_state,
        };
        *slot += size;
    }
}

/// The peaks of one simulated iteration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationPeak {
    pub index: u32,
    /// The captured iteration it was taken from.
    pub source: u32,
    pub start_ns: Nanos,
    pub end_ns: Nanos,
    pub peak_allocated_bytes: Bytes,
    pub peak_reserved_bytes: Bytes,
}

/// What the entries of [`Report::top_layers`] are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKey {
    /// `nn.Module` paths.
    #[default]
    Layer,
    /// Operator names (the innermost op that allocated each block).
    Op,
}

/// Live bytes of one layer (or operator) at the peak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerBytes {
    pub layer: String,
    pub bytes: Bytes,
}

/// The estimate: one plain-data value for the CLI, the worker and the tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// The GPU whose overheads the headline peak uses.
    pub reference_gpu: String,
    pub summary: RunSummary,
    pub peak: Peak,
    pub breakdown_at_peak: Breakdown,
    pub top_layers: Vec<LayerBytes>,
    /// What [`Report::top_layers`] names: model layers, or operators when the
    /// trace has no Python frames to find layers with (`with_stack=False`).
    #[serde(default)]
    pub top_layers_by: LayerKey,
    /// Peaks per simulated iteration: steady state shows as equal peaks.
    pub iterations: Vec<IterationPeak>,
    /// The phases of every simulated iteration, on the timeline's clock (for
    /// shading the timeline).
    pub phases: Vec<PhaseWindow>,
    /// Allocated and reserved over the schedule's time, downsampled.
    pub timeline: Vec<TimelinePoint>,
    pub gpus: Vec<GpuVerdict>,
    pub warnings: Vec<Warning>,
    /// The kind of job, as the measured errors are grouped.
    #[serde(default = "default_kind")]
    pub job_kind: JobKind,
    /// The error measured against real GPU runs of this kind of job, and
    /// the margin a fit needs to be more than thin ([`accuracy`]); absent
    /// when none was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_band: Option<ErrorBand>,
}

fn default_kind() -> JobKind {
    JobKind::Training
}

/// One GPU's simulations: at its capacity, and without a limit (needed for the
/// shortfall when it does not fit).
#[derive(Debug, Clone, Copy)]
pub struct GpuRuns<'a> {
    pub target: &'a GpuTarget,
    pub at_capacity: &'a SimulatedRun,
    pub unlimited: &'a SimulatedRun,
}

/// Everything [`build`] reads.
#[derive(Debug, Clone)]
pub struct ReportInput<'a> {
    pub job: JobRef<'a>,
    /// The GPU whose overheads the headline uses.
    pub reference: &'a GpuTarget,
    /// The reference simulation without a capacity limit.
    pub unlimited: &'a SimulatedRun,
    pub gpus: Vec<GpuRuns<'a>>,
    pub summary: RunSummary,
    pub warnings: Vec<Warning>,
}

/// Errors building a report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    #[error("the trace has no memory events to report on: profile with profile_memory=True and run at least one training step inside the profiler")]
    Empty,
    #[error("the simulation does not match the schedule: this is a bug in memcast, please report it with the trace, samples vs events {0:?}")]
    Mismatch((usize, usize)),
    #[error("a simulation did not come back from the code that ran it: this is a bug in memcast, please report it with the trace")]
    MissingSimulation,
}

/// The time windows whose peaks the report shows, in the order
/// [`RunDetail::windows`] has them: each simulated iteration, then a
/// generation's prompt call and decode steps.
pub fn windows(job: JobRef<'_>, summary: &RunSummary) -> Vec<(Nanos, Nanos)> {
    let mut windows: Vec<(Nanos, Nanos)> = job
        .iterations()
        .iter()
        .map(|span| (span.start, span.end))
        .collect();
    if let Some(g) = &summary.generation {
        windows.push(g.prefill_window);
        windows.push(g.decode_window);
    }
    windows
}

/// The recorder of the headline run of `job` ([`Recorder::detailed`] with
/// the report's windows).
pub fn recorder(job: JobRef<'_>, summary: &RunSummary, max_points: usize) -> Recorder {
    Recorder::detailed(
        job.n_events(),
        job.time_range().unwrap_or_default(),
        max_points,
        windows(job, summary),
    )
}

/// Builds the report.
pub fn build(input: &ReportInput<'_>) -> Result<Report, ReportError> {
    let job = input.job;
    let run = input.unlimited;
    let n_events = job.n_events();
    if n_events == 0 {
        return Err(ReportError::Empty);
    }
    let detail = run
        .detail
        .as_ref()
        .map(|d| RunDetail {
            timeline: d.timeline.clone(),
            windows: d.windows.clone(),
            live_at_peak: None,
        })
        .unwrap_or_default();
    let n_windows = windows(job, &input.summary).len();
    if run.events != n_events || detail.windows.len() != n_windows {
        return Err(ReportError::Mismatch((
            usize::try_from(run.events).unwrap_or(usize::MAX),
            usize::try_from(n_events).unwrap_or(usize::MAX),
        )));
    }
    let overheads = input.reference.overheads;
    let peak_index = run.peak_index;
    let peak_reserved = run.max_reserved;
    let total = peak_reserved + overheads.context_bytes;

    let found;
    let (live, at_peak) = match run.detail.as_ref().and_then(|d| d.live_at_peak.as_ref()) {
        Some(live) => live,
        None => {
            found = job.live_after(peak_index);
            &found
        }
    };
    let mut breakdown = Breakdown::default();
    let mut layers: BTreeMap<String, Bytes> = BTreeMap::new();
    // Without Python frames no block has a layer: the same figures by op.
    let mut ops: BTreeMap<String, Bytes> = BTreeMap::new();
    let mut requested = Bytes::ZERO;
    for event in live {
        let size = event.size_on(input.reference);
        breakdown.add(event.category, size);
        requested += size;
        let Some(facts) = job.block_facts(event.facts) else {
            continue;
        };
        if let Some(layer) = facts.layer {
            *layers.entry(layer).or_default() += size;
        }
        if let Some(op) = facts.op {
            *ops.entry(op).or_default() += size;
        }
    }
    let top_layers_by = if layers.is_empty() && !ops.is_empty() {
        layers = ops;
        LayerKey::Op
    } else {
        LayerKey::Layer
    };
    breakdown.cached = peak_reserved.saturating_sub(requested);
    breakdown.overheads += overheads.context_bytes;
    // Requested bytes never exceed reserved bytes in a correct simulation; if
    // they did, the categories would over-count and the sum would be off.
    debug_assert!(
        requested <= peak_reserved,
        "live requested bytes exceed reserved bytes at the peak"
    );

    let mut top_layers: Vec<LayerBytes> = layers
        .into_iter()
        .map(|(layer, bytes)| LayerBytes { layer, bytes })
        .collect();
    top_layers.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.layer.cmp(&b.layer)));
    top_layers.truncate(TOP_LAYERS);

    let spans = job.iterations();
    let at = place(job, &spans, peak_index, *at_peak);
    let mut window_peaks = detail.windows.into_iter();
    let iterations = spans
        .iter()
        .map(|span| {
            let peak = window_peaks.next().flatten().unwrap_or_default();
            IterationPeak {
                index: span.index,
                source: span.source,
                start_ns: span.start,
                end_ns: span.end,
                peak_allocated_bytes: peak.allocated,
                peak_reserved_bytes: peak.reserved,
            }
        })
        .collect();
    // A generation: the live bytes' peak in its prompt call and in its
    // decode steps (reserved memory only grows from one to the next).
    let mut summary = input.summary.clone();
    if let Some(g) = summary.generation.as_mut() {
        g.prefill_peak_allocated_bytes = window_peaks.next().flatten().map(|s| s.allocated);
        g.decode_peak_allocated_bytes = window_peaks.next().flatten().map(|s| s.allocated);
    }
    let job_kind = JobKind::of(&summary);
    let error_band =
        accuracy::Accuracy::shipped().and_then(|a| ErrorBand::new(&a, job_kind, peak_reserved));
    let kernels = job.kernels();
    let gpus = input
        .gpus
        .iter()
        .map(|runs| {
            let mut gpu = verdict(runs, &kernels);
            gpu.margin = Margin::of(gpu.headroom_bytes, error_band.as_ref());
            gpu
        })
        .collect();
    Ok(Report {
        schema: SCHEMA.to_owned(),
        reference_gpu: input.reference.name.clone(),
        summary,
        peak: Peak {
            reserved_bytes: peak_reserved,
            allocated_bytes: run.max_allocated,
            total_bytes: total,
            context_bytes: overheads.context_bytes,
            at,
        },
        breakdown_at_peak: breakdown,
        top_layers,
        top_layers_by,
        iterations,
        phases: job.phases().into_owned(),
        timeline: detail.timeline,
        gpus,
        warnings: input.warnings.clone(),
        job_kind,
        error_band,
    })
}

/// Where event `index` (`event`) happens.
fn place(
    job: JobRef<'_>,
    spans: &[IterationSpan],
    index: u64,
    event: Option<JobEvent>,
) -> PeakPlace {
    let time = event.map_or(Nanos::ZERO, |e| e.time);
    let facts = event.and_then(|e| job.block_facts(e.facts));
    let iteration = spans
        .iter()
        .find(|span| span.start <= time && time <= span.end)
        .map(|span| span.index)
        .or_else(|| facts.as_ref().and_then(|f| f.iteration));
    PeakPlace {
        event_index: u32::try_from(index).unwrap_or(u32::MAX),
        time_ns: time,
        iteration,
        phase: facts.as_ref().map_or(Phase::Other, |f| f.phase),
        op: facts.as_ref().and_then(|f| f.op.clone()),
        layer: facts.and_then(|f| f.layer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::{
        BlockId, EventKind, IterationSpan, Schedule, ScheduleEvent, ScheduledBlock,
    };
    use crate::presets::parse_gpu;
    use crate::simulator::Sample;

    fn block(size: u64, category: Category, layer: &str) -> ScheduledBlock {
        ScheduledBlock {
            size: Bytes(size),
            category,
            iteration: Some(0),
            phase: Phase::Forward,
            op: Some("aten::op".into()),
            layer: (!layer.is_empty()).then(|| layer.to_owned()),
            on: crate::kernels::ArchSet::ALL,
            per_gpu: None,
        }
    }

    fn event(time: i64, kind: EventKind, block: u32) -> ScheduleEvent {
        ScheduleEvent {
            time: Nanos(time),
            kind,
            block: BlockId(block),
        }
    }

    fn sample(allocated: u64, reserved: u64) -> Sample {
        Sample {
            allocated: Bytes(allocated),
            reserved: Bytes(reserved),
        }
    }

    /// The run of `schedule` whose samples are `samples`, as a recorder
    /// gathers it.
    fn run(schedule: &Schedule, samples: &[Sample], detailed: bool) -> SimulatedRun {
        let job = JobRef::Schedule(schedule);
        let mut recorder = if detailed {
            recorder(job, &RunSummary::default(), DEFAULT_MAX_POINTS)
        } else {
            Recorder::maxima()
        };
        for (e, s) in schedule.events.iter().zip(samples) {
            recorder.record(e.time, *s);
        }
        recorder.finish()
    }

    fn schedule() -> Schedule {
        Schedule {
            blocks: vec![
                block(1000, Category::Parameter, ""),
                block(0, Category::Workspace, ""),
                block(3000, Category::Activation, "layer1"),
                block(500, Category::Temporary, "layer2"),
            ],
            events: vec![
                event(0, EventKind::Alloc, 0),
                event(1, EventKind::Alloc, 1),
                event(2, EventKind::Alloc, 2),
                event(3, EventKind::Alloc, 3),
                event(4, EventKind::Free, 3),
                event(5, EventKind::Free, 2),
            ],
            iterations: vec![IterationSpan {
                index: 0,
                source: 0,
                start: Nanos(0),
                end: Nanos(5),
            }],
            phases: Vec::new(),
            kernels: Vec::new(),
        }
    }

    /// The breakdown adds up to the peak total exactly, and the peak
    /// names its event, time, iteration and phase.
    #[test]
    fn breakdown_sums_to_the_peak_total_and_names_the_place() {
        let schedule = schedule();
        schedule.check().unwrap();
        let gpu = parse_gpu("a100-80gb").unwrap();
        let ws = gpu.overheads.cublas_workspace_bytes.get();
        let reserved = 2 * Bytes::MIB + 20 * Bytes::MIB;
        let samples = [
            sample(1024, 2 * Bytes::MIB),
            sample(1024 + ws, 2 * Bytes::MIB + 20 * Bytes::MIB),
            sample(1024 + ws + 3072, reserved),
            sample(1024 + ws + 3584, reserved),
            sample(1024 + ws + 3072, reserved),
            sample(1024 + ws, reserved),
        ];
        let run = run(&schedule, &samples, true);
        // The report with `headline` as the run it is about.
        let build_with = |headline: &SimulatedRun| {
            build(&ReportInput {
                job: JobRef::Schedule(&schedule),
                reference: &gpu,
                unlimited: headline,
                gpus: vec![GpuRuns {
                    target: &gpu,
                    at_capacity: &run,
                    unlimited: &run,
                }],
                summary: RunSummary::default(),
                warnings: vec![],
            })
            .unwrap()
        };
        let report = build_with(&run);
        assert_eq!(report.schema, SCHEMA);
        assert_eq!(report.peak.reserved_bytes, Bytes(reserved));
        assert_eq!(report.peak.allocated_bytes, Bytes(1024 + ws + 3584));
        assert_eq!(
            report.peak.total_bytes,
            Bytes(reserved) + gpu.overheads.context_bytes
        );
        // Reserved first peaks at event 1 (the workspace segment).
        assert_eq!(report.peak.at.event_index, 1);
        assert_eq!(report.breakdown_at_peak.total(), report.peak.total_bytes);
        assert_eq!(report.breakdown_at_peak.parameters, Bytes(1000));
        assert_eq!(
            report.breakdown_at_peak.overheads,
            Bytes(ws) + gpu.overheads.context_bytes
        );
        assert_eq!(report.breakdown_at_peak.activations, Bytes::ZERO);
        assert_eq!(report.timeline.len(), 6);
        assert_eq!(report.iterations.len(), 1);
        assert_eq!(report.iterations[0].peak_reserved_bytes, Bytes(reserved));
        assert_eq!(
            report.iterations[0].peak_allocated_bytes,
            Bytes(1024 + ws + 3584)
        );
        let verdict = &report.gpus[0];
        assert!(verdict.fits);
        assert_eq!(
            verdict.headroom_bytes,
            Some(gpu.capacity.saturating_sub(report.peak.total_bytes))
        );
        assert_eq!(verdict.shortfall_bytes, None);
        // The blocks at the peak found beside the run are the report's own;
        // other ones would show (here, none: the breakdown loses its
        // parameters and keeps the overheads).
        let with_live = |live: LiveAtPeak| {
            let mut found = run.clone();
            if let Some(detail) = found.detail.as_mut() {
                detail.live_at_peak = Some(live);
            }
            build_with(&found)
        };
        let live = JobRef::Schedule(&schedule).live_after(1);
        assert_eq!(with_live(live.clone()), report);
        let other = with_live((Vec::new(), live.1));
        assert_eq!(other.breakdown_at_peak.parameters, Bytes::ZERO);
    }

    #[test]
    fn an_out_of_memory_run_reports_the_shortfall() {
        let gpu = parse_gpu("1GiB").unwrap();
        let schedule = schedule();
        let unlimited = run(&schedule, &[sample(0, 2 * Bytes::GIB); 6], false);
        let mut recorder = Recorder::maxima();
        recorder.record(Nanos(0), sample(0, 512 * Bytes::MIB));
        recorder.out_of_memory();
        let failed = recorder.finish();
        assert_eq!(failed.oom_at, Some(0));
        let runs = GpuRuns {
            target: &gpu,
            at_capacity: &failed,
            unlimited: &unlimited,
        };
        let verdict = verdict(&runs, &[]);
        assert!(!verdict.fits);
        assert_eq!(verdict.headroom_bytes, None);
        assert_eq!(
            verdict.shortfall_bytes,
            Some(
                (Bytes(2 * Bytes::GIB) + gpu.overheads.context_bytes)
                    .saturating_sub(Bytes(Bytes::GIB))
            )
        );
    }

    #[test]
    fn mismatched_or_empty_input_is_an_error() {
        let gpu = parse_gpu("t4").unwrap();
        let empty = Schedule::default();
        let run = SimulatedRun::default();
        let input = ReportInput {
            job: JobRef::Schedule(&empty),
            reference: &gpu,
            unlimited: &run,
            gpus: vec![],
            summary: RunSummary::default(),
            warnings: vec![],
        };
        assert_eq!(build(&input), Err(ReportError::Empty));
        let schedule = schedule();
        let input = ReportInput {
            job: JobRef::Schedule(&schedule),
            ..input
        };
        assert_eq!(build(&input), Err(ReportError::Mismatch((0, 6))));
    }

    #[test]
    fn live_blocks_at_an_event_come_in_allocation_order() {
        let schedule = schedule();
        let (live, at) = JobRef::Schedule(&schedule).live_after(3);
        let blocks: Vec<(u64, Bytes)> = live.iter().map(|e| (e.block, e.size)).collect();
        assert_eq!(
            blocks,
            vec![
                (0, Bytes(1000)),
                (1, Bytes(0)),
                (2, Bytes(3000)),
                (3, Bytes(500))
            ]
        );
        assert_eq!(at.map(|e| e.time), Some(Nanos(3)));
        let (live, _) = JobRef::Schedule(&schedule).live_after(5);
        assert_eq!(live.len(), 2);
    }

    #[test]
    fn windows_keep_the_peak_of_the_events_inside_them() {
        let mut recorder = Recorder::detailed(
            4,
            (Nanos(0), Nanos(30)),
            DEFAULT_MAX_POINTS,
            vec![
                (Nanos(10), Nanos(20)),
                (Nanos(0), Nanos(30)),
                (Nanos(40), Nanos(50)),
            ],
        );
        for (t, a) in [(0, 5), (10, 9), (20, 7), (30, 8)] {
            recorder.record(Nanos(t), sample(a, a));
        }
        let run = recorder.finish();
        let peaks: Vec<Option<u64>> = run
            .detail
            .unwrap()
            .windows
            .iter()
            .map(|w| w.map(|s| s.allocated.get()))
            .collect();
        assert_eq!(peaks, [Some(9), Some(9), None]);
        assert_eq!((run.peak_index, run.max_reserved), (1, Bytes(9)));
    }
}
