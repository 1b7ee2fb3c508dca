//! Stage 2 — **orchestrator**: CPU lifetimes → the allocation sequence a CUDA run
//! of the same script would produce (xMem §3.3, VeritasEst §III-C).
//!
//! Input: an `Analysis` and an orchestration config. Output: a schedule of
//! allocations and frees for the simulator, each tagged with its category
//! (parameter, gradient, optimizer state, activation, batch, temporary) and layer.
//!
//! Every adjustment is a named, documented rule (see [`rules`] and
//! [`RuleId`]): parameters
//! (absent from the trace, inferred and allocated first), batch hand-over,
//! CPU-only kernel scratch dropped, gradients live until the `zero_grad` that
//! frees them, optimizer state persistent from the first step (or added by
//! calculation when built before profiling), the CUDA `foreach` optimizer path,
//! several iterations.
//!
//! Invariants: pure and deterministic; every block of the schedule is freed at
//! most once and never before it is allocated.

pub mod rules;
mod schedule;

use serde::{Deserialize, Serialize};

pub use rules::autocast::{AutocastConfig, AutocastMode};
pub use rules::{foreach_temporary_lists, RuleId, CUBLAS_OPS};
pub use schedule::{
    bytes_on, BlockId, Category, EventKind, IterationSpan, Phase, PhaseWindow, Schedule,
    ScheduleEvent, ScheduledBlock,
};

use crate::analyzer::Analysis;
use crate::diag::{Setting, Warned, Warning};
use crate::units::Bytes;

/// The op name of DistributedDataParallel's gradient-bucket blocks in a
/// schedule (made before the trace or rebuilt inside it); the distributed
/// what-if finds them by it.
pub const BUCKET_OP: &str = "ddp_gradient_bucket";

/// Which optimizer implementation the simulated CUDA run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerPath {
    /// What PyTorch picks on CUDA: `torch.optim` optimizers left at their
    /// default use the multi-tensor (`foreach`) path; its temporaries are
    /// modelled in place of the captured per-tensor ones.
    CudaDefault,
    /// Keep the optimizer step exactly as captured.
    Captured,
}

/// Settings of the orchestrator. Build one with [`OrchestratorConfig::standard`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrchestratorConfig {
    /// Training iterations to simulate; the last captured steady-state
    /// iteration is repeated when more are asked for than were captured.
    pub iterations: u32,
    pub optimizer_path: OptimizerPath,
    /// How the trace's autocast regions run on CUDA.
    #[serde(default)]
    pub autocast: AutocastConfig,
    /// The user's figures for the parameters, in place of what the trace
    /// shows (a model with weights the forward never reads, quantized
    /// storage, a trace without shapes).
    #[serde(default)]
    pub parameters: ParameterOverride,
    /// Model a `torch.optim` step captured on the foreach path as the rule
    /// does (lists over every parameter) instead of as captured: set for a
    /// trace rebuilt with more blocks, whose captured step only holds the
    /// traced blocks' share of each list.
    #[serde(default)]
    pub remodel_foreach: bool,
}

/// Parameter bytes the user gives. `total` is every parameter, `frozen` the
/// part that gets no gradient; either may be given alone (the other part
/// then comes from the trace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParameterOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen: Option<Bytes>,
}

impl ParameterOverride {
    /// Whether the user gave any figure.
    pub fn is_set(&self) -> bool {
        self.total.is_some() || self.frozen.is_some()
    }
}

impl OrchestratorConfig {
    /// Three iterations (so stateful optimizers reach steady state) and the
    /// CUDA default optimizer path.
    pub fn standard() -> OrchestratorConfig {
        OrchestratorConfig {
            iterations: 3,
            optimizer_path: OptimizerPath::CudaDefault,
            autocast: AutocastConfig::standard(),
            parameters: ParameterOverride::default(),
            remodel_foreach: false,
        }
    }
}

/// Facts the orchestrator established, repeated in the report.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OrchestrationFacts {
    pub iterations_captured: u32,
    pub iterations_simulated: u32,
    /// Whether the `foreach` optimizer temporaries were modelled.
    pub foreach_modelled: bool,
    /// How many blocks each rule added, dropped or moved, in rule order.
    pub rule_counts: Vec<RuleCount>,
    /// What the autocast rules changed in the captured iterations, in bytes
    /// per rule (negative: removed), in rule order; empty without autocast.
    #[serde(default)]
    pub autocast_bytes: Vec<RuleBytes>,
    /// The model's state as scheduled (the trace's, or the user's figures).
    #[serde(default)]
    pub state: StateFacts,
    /// The CPU kernels' private scratch the `cpu_scratch` rule dropped, per
    /// op that made and freed it, largest first (each traced block once).
    #[serde(default)]
    pub cpu_scratch: Vec<OpBytes>,
}

/// Blocks and bytes of one op.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpBytes {
    pub op: String,
    pub blocks: u32,
    pub bytes: Bytes,
}

/// The parameters and buffers the schedule holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFacts {
    pub n_parameters: u32,
    /// Every parameter, with or without a gradient.
    pub parameter_bytes: Bytes,
    /// The parameters that get a gradient.
    pub trainable_bytes: Bytes,
    /// The parameters that get none.
    pub frozen_bytes: Bytes,
    /// The model's buffers.
    pub buffer_bytes: Bytes,
    /// Of the frozen parameters, those stored quantized (integer storage:
    /// int8, packed 4-bit), as the trace shows them.
    #[serde(default)]
    pub quantized_bytes: Bytes,
    /// Their quantisation state, not in `parameter_bytes`.
    #[serde(default)]
    pub quant_state_bytes: Bytes,
}

/// The bytes one rule added to (negative: removed from) the captured
/// iterations: resized blocks count their change, dropped blocks their size,
/// added blocks theirs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleBytes {
    pub rule: RuleId,
    pub bytes: i64,
}

/// How many blocks one rule added, dropped or moved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleCount {
    pub rule: RuleId,
    pub blocks: u32,
}

/// The orchestrated schedule with its facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orchestrated {
    pub schedule: Schedule,
    pub facts: OrchestrationFacts,
}

/// Why orchestration failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OrchestrateError {
    #[error("the trace has no memory blocks to orchestrate: profile at least one training iteration with profile_memory=True")]
    NoBlocks,
    #[error("at least one iteration must be simulated: set the number of iterations to 1 or more, got {0:?}")]
    NoIterations(u32),
    #[error("too many iterations: peak memory is steady after the first few, set the number of iterations to {MAX_ITERATIONS} or fewer, got {0:?}")]
    TooManyIterations(u32),
    #[error("the orchestrated schedule is inconsistent, which is a bug in memcast: please report it with the trace, details {0:?}")]
    Inconsistent(String),
    #[error("the model's parameters cannot be recovered from this trace: it was recorded without shapes (record_shapes=False) and no backward pass sized them by their gradients, so the estimate would leave out every weight; profile with torch.profiler.profile(record_shapes=True), or give the parameter bytes yourself")]
    ParametersUnknown,
    #[error("the frozen parameter bytes ({frozen} B) cannot exceed the parameter bytes ({total} B): give every parameter's bytes as the parameter bytes and the part without gradients as the frozen parameter bytes")]
    ParameterOverrideInconsistent { total: u64, frozen: u64 },
}

impl OrchestrateError {
    /// The setting the message asks the user to change, if any.
    pub fn setting(&self) -> Option<Setting> {
        match self {
            OrchestrateError::NoIterations(_) | OrchestrateError::TooManyIterations(_) => {
                Some(Setting::Iterations)
            }
            OrchestrateError::ParametersUnknown
            | OrchestrateError::ParameterOverrideInconsistent { .. } => {
                Some(Setting::ParameterBytes)
            }
            OrchestrateError::NoBlocks | OrchestrateError::Inconsistent(_) => None,
        }
    }
}

/// The most iterations [`orchestrate`] simulates: memory is in steady state
/// after the second, and each repeated iteration grows the schedule.
pub const MAX_ITERATIONS: u32 = 64;

/// The job of an fp32 trace as it runs with its forward under CUDA autocast
/// (bf16; `config.autocast` gives the policy version), for the
/// mixed-precision what-if. `None` for a trace that already ran under
/// autocast (its estimate translates it) or has no forward to run under it.
pub fn orchestrate_under_autocast(
    analysis: &Analysis,
    config: &OrchestratorConfig,
) -> Option<Warned<Orchestrated>> {
    let translated = !rules::autocast::trace_regions(analysis).is_empty();
    if translated || rules::autocast::forward_regions(analysis).is_empty() {
        return None;
    }
    let mut config = config.clone();
    config.autocast.mode = AutocastMode::Forward;
    config.autocast.dtype = Some(crate::autocast::Dtype::Bf16);
    orchestrate(analysis, &config).ok()
}

/// Turns the analyzer's CPU lifetimes into a CUDA allocation sequence.
pub fn orchestrate(
    analysis: &Analysis,
    config: &OrchestratorConfig,
) -> Result<Warned<Orchestrated>, OrchestrateError> {
    if config.iterations == 0 {
        return Err(OrchestrateError::NoIterations(config.iterations));
    }
    if config.iterations > MAX_ITERATIONS {
        return Err(OrchestrateError::TooManyIterations(config.iterations));
    }
    if analysis.blocks.is_empty() {
        return Err(OrchestrateError::NoBlocks);
    }
    let mut warnings: Vec<Warning> = Vec::new();
    let (schedule, facts) = rules::apply_all(analysis, config, &mut warnings)?;
    schedule.check().map_err(OrchestrateError::Inconsistent)?;
    Ok(Warned {
        value: Orchestrated { schedule, facts },
        warnings,
    })
}
