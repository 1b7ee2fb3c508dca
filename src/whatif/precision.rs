//! What-if 6 — **mixed precision**: an fp32 trace's job with its forward
//! (model and loss) under `torch.autocast("cuda", dtype=torch.bfloat16)`,
//! re-simulated like the estimate.
//!
//! The autocast sequence is made by the orchestrator's autocast rules with
//! PyTorch's CUDA policy ([`crate::autocast`]), the same rules that
//! translate a trace recorded under CPU autocast, at prepare time
//! ([`crate::pipeline::Prepared::autocast`]): outputs of the lower-precision
//! ops (matrix products, convolutions) take 16 bits and the ops after them
//! follow by type promotion, the fp32 ops (softmax, norms, losses, exp, ...)
//! stay fp32, the input copies autocast makes are added, each parameter's
//! 16-bit copy stays in the cast cache for the forward, and backward
//! follows the forward's types. Parameters, gradients and optimizer state
//! keep fp32. fp16 has bf16's sizes; a `GradScaler` adds
//! [`GRAD_SCALER_BYTES`] at most (its scale, growth tracker and per-step
//! flags). The result lists what each rule changed.

use serde::{Deserialize, Serialize};

use super::alloc_settings::signed_delta;
use super::{estimate_schedule, fits_of, peak_only, Fit, PeakFigures, WhatIfError};
use crate::orchestrator::RuleId;
use crate::pipeline::{Config, Prepared};
use crate::units::Bytes;

/// The version tag of [`PrecisionComparison`].
pub const SCHEMA: &str = "memcast.whatif.precision/2";

/// The most a `GradScaler` adds to an fp16 run: four one-element tensors
/// (scale, growth tracker, inverse scale, found-inf), each rounded to the
/// allocator's 512-byte minimum block.
pub const GRAD_SCALER_BYTES: Bytes = Bytes(4 * 512);

/// What one autocast rule changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleChange {
    pub rule: RuleId,
    /// Blocks it changed, dropped or added over the simulated iterations.
    pub blocks: u32,
    /// Bytes it added to the captured iterations (negative: removed).
    pub bytes: i64,
    /// Why, as the rule's summary says it.
    pub reason: String,
}

/// The fp32 job and its autocast variant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrecisionComparison {
    /// Always [`SCHEMA`].
    pub schema: String,
    pub fp32: PeakFigures,
    /// Under CUDA autocast with bf16 (fp16 has the same sizes).
    pub autocast_16bit: PeakFigures,
    /// autocast minus fp32 peak total.
    pub delta_total_bytes: i64,
    /// The PyTorch versions whose policy was applied.
    pub policy: String,
    /// What each autocast rule changed, in rule order.
    pub changes: Vec<RuleChange>,
    pub fits: Vec<Fit>,
}

/// Simulates the fp32 job and its autocast variant.
pub fn compare(prepared: &Prepared, config: &Config) -> Result<PrecisionComparison, WhatIfError> {
    let Some(autocast) = prepared.autocast.as_deref() else {
        let translated = !prepared.orchestrated.facts.autocast_bytes.is_empty();
        return Err(if translated {
            WhatIfError::AlreadyAutocast
        } else {
            WhatIfError::NoAutocastJob
        });
    };
    let fp32 = PeakFigures::of(&estimate_schedule(
        prepared,
        prepared.orchestrated.schedule.clone(),
        &peak_only(config),
    )?);
    let report = estimate_schedule(prepared, autocast.schedule.clone(), config)?;
    let autocast_16bit = PeakFigures::of(&report);
    let facts = &autocast.facts;
    let changes = RuleId::AUTOCAST
        .iter()
        .filter_map(|&rule| {
            let blocks = facts
                .rule_counts
                .iter()
                .find(|c| c.rule == rule)
                .map_or(0, |c| c.blocks);
            let bytes = facts
                .autocast_bytes
                .iter()
                .find(|b| b.rule == rule)
                .map_or(0, |b| b.bytes);
            (blocks > 0).then(|| RuleChange {
                rule,
                blocks,
                bytes,
                reason: rule.summary().to_owned(),
            })
        })
        .collect();
    let version = config
        .orchestrator
        .autocast
        .policy()
        .unwrap_or_else(crate::autocast::PolicyVersion::latest);
    Ok(PrecisionComparison {
        schema: SCHEMA.to_owned(),
        fp32,
        autocast_16bit,
        delta_total_bytes: signed_delta(autocast_16bit.total_bytes, fp32.total_bytes),
        policy: version.torch.to_owned(),
        changes,
        fits: fits_of(&report),
    })
}
