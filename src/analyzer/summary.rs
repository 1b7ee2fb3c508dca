//! The analysis as the user reads it: the versioned `memcast.analyze/1`
//! summary that `memcast analyze --json` prints (and its text form is made
//! from). Built here, in the core, so that every shell shows the same figures.
//!
//! To add a field: add it to [`AnalysisSummary`] (or one of its parts) and
//! fill it in [`summarize`]; additions keep the schema version, a renamed or
//! removed field needs a new one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::resident::RunKind;
use super::{Analysis, BlockRole, OptimizerFacts, Phase, ZeroGradFacts};
use crate::diag::Warning;
use crate::units::{Bytes, Nanos};

/// The version tag of [`AnalysisSummary`].
pub const SUMMARY_SCHEMA: &str = "memcast.analyze/1";

/// How many layers the summary lists.
pub const SUMMARY_TOP_LAYERS: usize = 10;

/// What the analyzer found in a trace (schema [`SUMMARY_SCHEMA`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnalysisSummary {
    pub schema: String,
    pub iterations: usize,
    pub blocks: usize,
    pub persistent_blocks: usize,
    /// Frees of memory allocated before profiling.
    pub unmatched_frees: usize,
    pub parameters: ParameterSummary,
    /// Model buffers the forward reads (BatchNorm running statistics,
    /// position ids, rotary caches).
    pub buffers: BufferSummary,
    /// What the run does: `training`, `fine_tuning`,
    /// `forward_with_autograd` or `inference` ([`RunKind`]).
    pub run_kind: RunKind,
    /// State made before the trace besides the model: activations (an
    /// earlier batch, a KV cache), optimizer state, DDP's buckets.
    pub before_trace: BeforeTraceSummary,
    pub recorded_on_cuda: bool,
    /// The peak of the trace's own allocations.
    pub peak_bytes: Bytes,
    pub allocated_by_phase: Vec<PhaseBytes>,
    pub iteration_details: Vec<IterationSummary>,
    pub zero_grad: ZeroGradFacts,
    pub optimizer: OptimizerFacts,
    pub roles: RoleTotals,
    /// A `generate()` run: its calls and KV cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<super::generation::Generation>,
    /// The run's structure and training recipe.
    #[serde(default)]
    pub recipe: super::RunRecipe,
    /// The layers with the most live bytes at the peak, at most
    /// [`SUMMARY_TOP_LAYERS`].
    pub top_layers: Vec<LayerSummary>,
    /// The warnings of the trace reader and the analyzer.
    pub warnings: Vec<Warning>,
}

/// The parameters found in the trace (see [`super::resident`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParameterSummary {
    /// Every parameter, with or without a gradient.
    pub count: usize,
    pub bytes: Bytes,
    /// Those that get a gradient (from `AccumulateGrad`).
    pub trainable_count: usize,
    pub trainable_bytes: Bytes,
    /// Those that get none (frozen, or every one in a forward-only run).
    pub frozen_bytes: Bytes,
    /// Of those, the ones stored quantized (int8, packed 4-bit).
    #[serde(default, skip_serializing_if = "Bytes::is_zero")]
    pub quantized_bytes: Bytes,
}

/// The buffers found in the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferSummary {
    pub bytes: Bytes,
}

/// Tensors made before the trace that are not the model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeforeTraceSummary {
    pub activation_bytes: Bytes,
    pub optimizer_state_bytes: Bytes,
    pub bucket_bytes: Bytes,
}

/// Bytes allocated in one phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseBytes {
    /// [`Phase::label`].
    pub phase: String,
    pub bytes: Bytes,
}

/// When one phase of an iteration ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseTime {
    /// [`Phase::label`].
    pub phase: String,
    pub start_ns: Nanos,
    pub end_ns: Nanos,
}

/// One training iteration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationSummary {
    /// The `ProfilerStep#N` annotation, if any.
    pub label: Option<String>,
    pub start_ns: Nanos,
    pub end_ns: Nanos,
    pub n_allocs: usize,
    pub n_frees: usize,
    pub peak_bytes: Bytes,
    /// Forward/backward passes (micro-batches) in this optimizer step.
    #[serde(default)]
    pub micro_batches: u32,
    pub phases: Vec<PhaseTime>,
    pub allocated_by_phase: Vec<PhaseBytes>,
}

/// Blocks and bytes by the role the analyzer gave them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleTotals {
    pub gradient_blocks: usize,
    pub gradient_bytes: Bytes,
    pub optimizer_state_blocks: usize,
    pub optimizer_state_bytes: Bytes,
    pub batch_blocks: usize,
    pub batch_bytes: Bytes,
    pub op_internal_blocks: usize,
    pub cpu_scratch_blocks: usize,
    #[serde(default)]
    pub kv_cache_blocks: usize,
    #[serde(default)]
    pub kv_cache_bytes: Bytes,
}

/// One layer's live bytes at the peak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerSummary {
    /// The module path, or `(no layer)`.
    pub layer: String,
    pub bytes: Bytes,
    pub blocks: usize,
}

fn phase_bytes(map: &BTreeMap<Phase, Bytes>) -> Vec<PhaseBytes> {
    map.iter()
        .map(|(phase, &bytes)| PhaseBytes {
            phase: phase.label().to_owned(),
            bytes,
        })
        .collect()
}

fn role_totals(analysis: &Analysis) -> RoleTotals {
    let mut roles = RoleTotals::default();
    for block in &analysis.blocks {
        let size = block.size;
        match block.role {
            BlockRole::Gradient { .. } => {
                roles.gradient_blocks += 1;
                roles.gradient_bytes += size;
            }
            BlockRole::OptimizerState => {
                roles.optimizer_state_blocks += 1;
                roles.optimizer_state_bytes += size;
            }
            BlockRole::Batch => {
                roles.batch_blocks += 1;
                roles.batch_bytes += size;
            }
            BlockRole::KvCache => {
                roles.kv_cache_blocks += 1;
                roles.kv_cache_bytes += size;
            }
            BlockRole::Other
            | BlockRole::Parameter
            | BlockRole::Buffer
            | BlockRole::Bucket
            | BlockRole::CpuRepack => {}
        }
        roles.op_internal_blocks += usize::from(block.op_internal);
        roles.cpu_scratch_blocks += usize::from(block.cpu_scratch);
    }
    roles
}

/// The summary of an analysis, with the warnings of the stages that made it.
pub fn summarize(analysis: &Analysis, warnings: Vec<Warning>) -> AnalysisSummary {
    let totals = &analysis.state.totals;
    AnalysisSummary {
        schema: SUMMARY_SCHEMA.to_owned(),
        iterations: analysis.iterations.len(),
        blocks: analysis.blocks.len(),
        persistent_blocks: analysis.persistent_blocks().count(),
        unmatched_frees: analysis.unmatched_frees.len(),
        parameters: ParameterSummary {
            count: totals.n_parameters,
            bytes: totals.parameters,
            trainable_count: totals.n_trainable,
            trainable_bytes: totals.trainable,
            frozen_bytes: totals.frozen,
            quantized_bytes: totals.quantized,
        },
        buffers: BufferSummary {
            bytes: totals.buffers,
        },
        run_kind: analysis.state.run_kind,
        before_trace: BeforeTraceSummary {
            activation_bytes: totals.activations_before_trace,
            optimizer_state_bytes: totals.optimizer_state_before_trace,
            bucket_bytes: totals.buckets,
        },
        recorded_on_cuda: analysis.devices.recorded_on_cuda,
        peak_bytes: analysis.peak.bytes,
        allocated_by_phase: phase_bytes(&analysis.allocated_by_phase()),
        iteration_details: analysis
            .iterations
            .iter()
            .map(|it| IterationSummary {
                label: it.label.clone(),
                start_ns: it.start,
                end_ns: it.end,
                n_allocs: it.n_allocs,
                n_frees: it.n_frees,
                peak_bytes: it.peak,
                micro_batches: it.micro_batches,
                phases: it
                    .phases
                    .iter()
                    .map(|p| PhaseTime {
                        phase: p.phase.label().to_owned(),
                        start_ns: p.start,
                        end_ns: p.end,
                    })
                    .collect(),
                allocated_by_phase: phase_bytes(&it.allocated_by_phase),
            })
            .collect(),
        zero_grad: analysis.zero_grad.clone(),
        optimizer: analysis.optimizer.clone(),
        roles: role_totals(analysis),
        generation: analysis.generation.clone(),
        recipe: analysis.recipe.clone(),
        top_layers: analysis
            .layers_at_peak
            .iter()
            .take(SUMMARY_TOP_LAYERS)
            .map(|l| LayerSummary {
                layer: l
                    .layer
                    .map_or("(no layer)".to_owned(), |id| analysis.name(id).to_owned()),
                bytes: l.bytes,
                blocks: l.n_blocks,
            })
            .collect(),
        warnings,
    }
}
