//! **What-ifs**: answers to "what would change if …?" questions, each a small
//! named transformation of the orchestrated [`Schedule`] (or of the allocator
//! configuration) followed by the same simulation and report path as
//! [`crate::pipeline::estimate`]. None of them is a formula on the peak alone.
//!
//! One entry per what-if, each taking a [`Prepared`] and a [`Config`] and
//! returning a plain serde result with its own versioned `schema`:
//! - [`alloc_settings::compare`] — `memcast.whatif.alloc/1`: the job under
//!   several `PYTORCH_CUDA_ALLOC_CONF` settings, the best one named;
//! - [`zero_grad::compare`] — `memcast.whatif.zero_grad/1`: gradient frees
//!   moved to the other `zero_grad` placement, `set_to_none` toggled;
//! - [`batch::sweep`] — `memcast.batch/1`: a block-by-block model of the
//!   schedule as a function of the batch size, fitted on two or more traces,
//!   simulated at any batch size, and the largest batch that fits each GPU;
//! - [`planned::compare`] — `memcast.whatif.plan/1`: offline, lifetime-aware
//!   allocation plans of the same sequence (STWeaver's grouped planner and a
//!   best-fit one, both checked valid, the smaller kept) between the
//!   live-tensor lower bound and the caching allocator's reserved memory;
//! - [`distributed::compare`] — `memcast.whatif.distributed/1`: per-GPU
//!   memory under DDP, ZeRO-1/2/3 (FSDP) and 1-D tensor parallel, with the
//!   modelling assumptions (NCCL included) listed;
//! - [`precision::compare`] — `memcast.whatif.precision/1`: the fp32 job under
//!   bf16/fp16 autocast, an approximation with its rules listed.
//!
//! For a UI: every entry takes the [`Prepared`] that [`crate::pipeline::prepare`] made
//! (so the trace is read once) and the same [`Config`] as [`crate::pipeline::estimate`]
//! (its `reference` GPU gives the overheads of the peaks, its `gpus` the
//! per-GPU fits); the batch what-if takes one [`Prepared`] per trace with its
//! batch size ([`Prepared::batch_size`] when the trace shows it,
//! [`batch::complete_batch_sizes`] fills in the rest).
//!
//! Invariants: pure and deterministic like every core stage; each result
//! reports peaks with the meaning of the estimate's `peak` (reserved plus the
//! reference GPU's CUDA context).

pub mod alloc_settings;
pub mod batch;
pub mod context;
pub mod distributed;
pub mod planned;
pub mod precision;
pub mod zero_grad;

use serde::{Deserialize, Serialize};

use crate::diag::Setting;
use crate::orchestrator::{Schedule, ScheduleEvent};
use crate::pipeline::{Config, Error, Prepared};
use crate::report::Report;
use crate::simulator::{self, AllocatorConfig, Simulation};
use crate::units::{Bytes, Nanos};

/// Why a what-if could not be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WhatIfError {
    #[error(transparent)]
    Pipeline(#[from] Error),
    #[error("the schedule has no gradient blocks, so zero_grad cannot be moved: profile at least two training iterations with backward and optimizer.zero_grad(), got {0:?} gradient blocks")]
    NoGradients(usize),
    #[error("a batch-size model needs at least two traces of the same job at different batch sizes: pass two or more traces, got {0:?}")]
    TooFewTraces(usize),
    #[error("the traces must have different batch sizes to fit a batch model: profile the job at another batch size, got batch sizes {0:?}")]
    SameBatch(Vec<u32>),
    #[error("a what-if produced an inconsistent schedule, which is a bug in memcast: please report it with the trace, details {0:?}")]
    Inconsistent(String),
    #[error("the traces do not have the same sequence of blocks, so they are not the same job at different batch sizes: profile the same script with only the batch size changed, got block counts {0:?}")]
    DifferentJobs(Vec<usize>),
    #[error(
        "a distributed job needs at least one GPU: set the number of GPUs to 1 or more, got {0:?}"
    )]
    ZeroWorld(u32),
    #[error(
        "a batch size must be at least 1: set the batch size to evaluate to 1 or more, got {0:?}"
    )]
    ZeroBatch(u32),
    #[error("the batch size of a trace could not be identified from its data loader: give the batch size of each trace, trace {0:?}")]
    UnknownBatch(String),
    #[error("this trace already ran under torch.autocast (its ops ran in bf16 or fp16), and its estimate already applies CUDA autocast's policy; to compare with fp32, profile the job without autocast")]
    AlreadyAutocast,
    #[error("no forward pass of this trace could be run under autocast: none was found (profile with Python stacks so that forward passes are found), or the trace was prepared without the mixed-precision what-if")]
    NoAutocastJob,
    #[error("the longest-generation what-if estimates the job at other lengths, so it needs the trace itself, not only its prepared estimate: run it with the trace")]
    NeedsTrace,
    #[error("this what-if changes the job's schedule, so it holds the rebuilt job whole, and {events} allocator events would need about {needed} of memory, more than this estimate may use ({budget}): ask it for fewer layers or new tokens, or raise the memory budget")]
    TooLargeToHold {
        events: u64,
        needed: crate::units::Bytes,
        budget: crate::units::Bytes,
    },
}

/// Memory per event of a job held whole as a schedule, with the copies a
/// what-if makes of it (a generous figure: an event and half a block with
/// its names, twice).
const HELD_BYTES_PER_EVENT: u64 = 512;

impl WhatIfError {
    /// The setting the message asks the user to give, if any.
    pub fn setting(&self) -> Option<Setting> {
        match self {
            WhatIfError::Pipeline(err) => err.setting(),
            WhatIfError::ZeroWorld(_) => Some(Setting::WorldSize),
            WhatIfError::ZeroBatch(_) => Some(Setting::TargetBatch),
            WhatIfError::UnknownBatch(_) => Some(Setting::BatchSizes),
            WhatIfError::TooLargeToHold { .. } => Some(Setting::MemoryBudget),
            WhatIfError::NoGradients(_)
            | WhatIfError::TooFewTraces(_)
            | WhatIfError::SameBatch(_)
            | WhatIfError::Inconsistent(_)
            | WhatIfError::DifferentJobs(_)
            | WhatIfError::AlreadyAutocast
            | WhatIfError::NoAutocastJob
            | WhatIfError::NeedsTrace => None,
        }
    }
}

/// The peak of one simulated variant, as `memcast estimate` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakFigures {
    /// Peak reserved plus the reference GPU's CUDA context (`peak.total_bytes`).
    pub total_bytes: Bytes,
    /// Peak reserved by the caching allocator.
    pub reserved_bytes: Bytes,
    /// Peak allocated (live blocks, rounded).
    pub allocated_bytes: Bytes,
}

impl PeakFigures {
    /// The peak figures of a report.
    pub fn of(report: &Report) -> PeakFigures {
        PeakFigures {
            total_bytes: report.peak.total_bytes,
            reserved_bytes: report.peak.reserved_bytes,
            allocated_bytes: report.peak.allocated_bytes,
        }
    }
}

/// Whether a variant fits one GPU of the config (at its capacity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fit {
    pub preset: String,
    pub fits: bool,
}

fn fits_of(report: &Report) -> Vec<Fit> {
    report
        .gpus
        .iter()
        .map(|gpu| Fit {
            preset: gpu.preset.clone(),
            fits: gpu.fits,
        })
        .collect()
}

/// Runs the estimate's simulation and report path on another schedule of the
/// same job.
pub fn estimate_schedule(
    prepared: &Prepared,
    schedule: Schedule,
    config: &Config,
) -> Result<Report, Error> {
    let variant = Prepared {
        orchestrated: crate::orchestrator::Orchestrated {
            schedule,
            facts: prepared.orchestrated.facts.clone(),
        },
        optimizer: prepared.optimizer.clone(),
        parameter_bytes: prepared.parameter_bytes,
        n_parameters: prepared.n_parameters,
        state: prepared.state,
        run_kind: prepared.run_kind,
        batch_size: prepared.batch_size,
        recipe: prepared.recipe.clone(),
        // The warnings of the trace stages belong to the input, not the variant.
        warnings: Vec::new(),
        autocast: None,
        scaled: prepared.scaled.clone(),
        traced: prepared.traced.clone(),
        generation: prepared.generation.clone(),
        moe: prepared.moe.clone(),
        program: None,
        capture: prepared.capture.clone(),
        quantization: prepared.quantization.clone(),
    };
    Ok(crate::pipeline::estimate(&variant, config, &mut |_| {})?.value)
}

/// Simulates a schedule without a capacity limit on the reference GPU's
/// overheads and returns the allocator's full statistics.
pub fn simulate_stats(
    schedule: &Schedule,
    config: &Config,
    allocator: &AllocatorConfig,
) -> Simulation {
    let (ops, _) = crate::pipeline::schedule_ops(schedule, &config.reference);
    simulator::simulate(&ops, allocator, &simulator::GpuMemory::unlimited())
}

/// Where a retimed event goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Anchor {
    /// At this time, before every unmoved event of the same time (a
    /// `zero_grad` runs before the op that follows it).
    Before(Nanos),
    /// Right after the event with this index, at its time.
    After(usize),
}

/// Rebuilds a schedule's event order after some events moved.
///
/// `moved` pairs an event index with its new place; unmoved events keep their
/// relative order. Events whose `drop` flag is set are removed. The result is
/// checked against the schedule invariants.
pub(crate) fn retime(
    schedule: &Schedule,
    moved: &[(usize, Anchor)],
    drop: &[bool],
) -> Result<Schedule, WhatIfError> {
    let mut anchor: Vec<Option<Anchor>> = vec![None; schedule.events.len()];
    for &(index, place) in moved {
        if let Some(slot) = anchor.get_mut(index) {
            *slot = Some(place);
        }
    }
    let mut keyed: Vec<(Nanos, usize, ScheduleEvent)> = Vec::with_capacity(schedule.events.len());
    for (index, event) in schedule.events.iter().enumerate() {
        if drop.get(index).copied().unwrap_or(false) {
            continue;
        }
        let (time, seq) = match anchor.get(index).copied().flatten() {
            None => (event.time, 2 * index + 1),
            Some(Anchor::Before(time)) => (time, 0),
            Some(Anchor::After(other)) => {
                let time = schedule.events.get(other).map_or(event.time, |e| e.time);
                (time, 2 * other + 2)
            }
        };
        keyed.push((
            time,
            seq,
            ScheduleEvent {
                time,
                kind: event.kind,
                block: event.block,
            },
        ));
    }
    keyed.sort_by_key(|&(time, seq, _)| (time, seq));
    let schedule = Schedule {
        blocks: schedule.blocks.clone(),
        events: keyed.into_iter().map(|(_, _, event)| event).collect(),
        iterations: schedule.iterations.clone(),
        phases: schedule.phases.clone(),
        kernels: schedule.kernels.clone(),
    };
    schedule.check().map_err(WhatIfError::Inconsistent)?;
    Ok(schedule)
}

/// A copy of the config that gives no per-GPU verdicts (the unlimited
/// reference run only), for what-ifs that only need the peak.
pub(crate) fn peak_only(config: &Config) -> Config {
    let mut config = config.clone();
    config.gpus.clear();
    config
}

/// Which what-if to run on a prepared trace (the worker's request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum WhatIfKind {
    /// [`alloc_settings::compare`] over the standard settings.
    Alloc,
    /// [`zero_grad::compare`].
    ZeroGrad,
    /// [`planned::compare`].
    Plan,
    /// [`distributed::compare`] at `world_size` GPUs.
    Distributed { world_size: u32 },
    /// [`precision::compare`].
    Precision,
    /// [`batch::sweep`] from the one prepared trace (the single-trace model).
    Batch,
    /// [`context::longest`]: the longest generation, simulating at most
    /// `budget` new tokens (it reads the trace again: [`run_on_traces`]).
    Context { budget: u32 },
}

/// The answer to a [`WhatIfKind`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum WhatIfResult {
    Alloc(alloc_settings::AllocComparison),
    ZeroGrad(zero_grad::ZeroGradComparison),
    Plan(planned::PlanResult),
    Distributed(distributed::DistributedComparison),
    Precision(precision::PrecisionComparison),
    Batch(batch::BatchSweep),
    Context(context::ContextSweep),
}

impl WhatIfResult {
    /// The result as `memcast whatif … --json` (`memcast batch --json` for
    /// the batch sweep) prints it: the inner result, pretty-printed.
    pub fn to_json_pretty(&self) -> String {
        let json = match self {
            WhatIfResult::Alloc(c) => serde_json::to_string_pretty(c),
            WhatIfResult::ZeroGrad(c) => serde_json::to_string_pretty(c),
            WhatIfResult::Plan(p) => serde_json::to_string_pretty(p),
            WhatIfResult::Distributed(c) => serde_json::to_string_pretty(c),
            WhatIfResult::Precision(c) => serde_json::to_string_pretty(c),
            WhatIfResult::Batch(s) => serde_json::to_string_pretty(s),
            WhatIfResult::Context(s) => serde_json::to_string_pretty(s),
        };
        json.unwrap_or_default()
    }
}

/// Runs one what-if on a prepared trace ([`WhatIfKind::Batch`] needs the
/// trace's batch size, [`Prepared::batch_size`]).
pub fn run(
    prepared: &Prepared,
    what: WhatIfKind,
    config: &Config,
) -> Result<WhatIfResult, WhatIfError> {
    // A job streamed as a program is held whole: every what-if changes or
    // re-reads its schedule.
    let whole;
    let prepared = match prepared.program.as_deref() {
        Some(program) => {
            let events = crate::program::JobRef::Program(program).n_events();
            let needed = crate::units::Bytes(events.saturating_mul(HELD_BYTES_PER_EVENT));
            if needed > config.memory_budget {
                return Err(WhatIfError::TooLargeToHold {
                    events,
                    needed,
                    budget: config.memory_budget,
                });
            }
            whole = prepared.held_whole().ok_or_else(|| {
                WhatIfError::Inconsistent("a streamed job could not be held whole".into())
            })?;
            &whole
        }
        None => prepared,
    };
    Ok(match what {
        WhatIfKind::Alloc => WhatIfResult::Alloc(alloc_settings::compare(prepared, config, &[])?),
        WhatIfKind::ZeroGrad => WhatIfResult::ZeroGrad(zero_grad::compare(prepared, config)?),
        WhatIfKind::Plan => WhatIfResult::Plan(planned::compare(prepared, config)?),
        WhatIfKind::Distributed { world_size } => WhatIfResult::Distributed(distributed::compare(
            prepared,
            config,
            distributed::DistOptions::new(world_size),
        )?),
        WhatIfKind::Precision => WhatIfResult::Precision(precision::compare(prepared, config)?),
        WhatIfKind::Batch => {
            let batch = prepared
                .batch_size
                .ok_or_else(|| WhatIfError::UnknownBatch("this trace".into()))?;
            let inputs = [batch::BatchInput { batch, prepared }];
            WhatIfResult::Batch(batch::sweep_to_capacity(&inputs, config)?)
        }
        WhatIfKind::Context { .. } => return Err(WhatIfError::NeedsTrace),
    })
}

/// Runs one what-if: [`WhatIfKind::Context`] on the job's traces (parsed
/// again: it estimates the job at other lengths; its simulations go
/// through `parallel`), every other one on the prepared trace ([`run`]).
pub fn run_on_traces(
    prepared: &Prepared,
    traces: &[crate::trace::Trace],
    what: WhatIfKind,
    config: &Config,
    parallel: &dyn crate::pipeline::Parallel,
) -> Result<WhatIfResult, WhatIfError> {
    match what {
        WhatIfKind::Context { budget } => Ok(WhatIfResult::Context(context::longest(
            traces, config, budget, parallel,
        )?)),
        other => run(prepared, other, config),
    }
}
