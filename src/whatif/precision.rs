//! What-if 6 — **mixed precision** (an approximation): the fp32 trace's
//! sequence as it would be under `torch.autocast` with bf16 or fp16, by rules
//! on each block's category and op, re-simulated like the estimate.
//!
//! Rules (listed in the result too):
//! 1. parameters, gradients, optimizer state, buffers, batch tensors and
//!    workspaces keep their size (fp32 master weights, fp32 `.grad`, fp32
//!    optimizer state, fp32 data);
//! 2. activations and temporaries made in forward or backward are halved
//!    (`ceil(size/2)`), unless their op or module autocasts to fp32 (softmax,
//!    log_softmax, layer/group norm, losses, sum/prod/cumsum, exp/log/pow,
//!    rsqrt, norm; `LayerNorm`, `GroupNorm`, `Softmax`, `*Loss` modules) —
//!    those keep their size;
//! 3. the autocast weight cast: each iteration gets one block of half the
//!    bytes of every parameter whose layer runs a matrix product or
//!    convolution (`Conv*`/`*Linear*` modules or such ops), from the first forward allocation to the last backward
//!    allocation (the cast copies are cached for forward and kept alive by
//!    autograd for backward);
//! 4. fp16 with `GradScaler` adds only scalars (scale, found_inf), so bf16 and
//!    fp16 give the same figure here.
//!
//! It assumes the trace is fp32; it cannot see the dtype of activations, so
//! ops that autocast does not touch but that receive 16-bit inputs are
//! counted as 16-bit too.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::alloc_settings::signed_delta;
use super::distributed::{landmarks, At, Edit};
use super::{estimate_schedule, fits_of, peak_only, Fit, PeakFigures, WhatIfError};
use crate::orchestrator::{Category, Phase, Schedule, ScheduledBlock};
use crate::pipeline::{Config, Prepared};
use crate::units::Bytes;

/// The version tag of [`PrecisionComparison`].
pub const SCHEMA: &str = "memcast.whatif.precision/1";

/// Op-name fragments of ops that autocast runs in fp32.
pub const FP32_OPS: &[&str] = &[
    "softmax",
    "layer_norm",
    "group_norm",
    "loss",
    "nll",
    "cross_entropy",
    "aten::sum",
    "aten::prod",
    "aten::cumsum",
    "aten::cumprod",
    "aten::exp",
    "aten::log",
    "aten::pow",
    "aten::rsqrt",
    "aten::norm",
];

/// Op-name fragments of ops that autocast runs in 16-bit and whose layer's
/// weights it casts.
pub const LOW_PRECISION_OPS: &[&str] = &[
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::matmul",
    "aten::linear",
    "conv",
    "aten::_scaled_dot_product",
];

/// The rules, as the result lists them.
pub const RULES: &[&str] = &[
    "parameters, gradients, optimizer state, buffers, batch tensors and workspaces keep their fp32 size",
    "activations and temporaries of forward and backward are halved unless their op or module autocasts to fp32 (softmax, norms, losses, sum/prod/cumsum, exp/log/pow, rsqrt; LayerNorm, GroupNorm, Softmax, *Loss modules)",
    "one weight-cast block per iteration: half the bytes of the parameters of Conv/Linear layers (or layers running a matrix product), from the first forward to the last backward allocation",
    "fp16 with GradScaler adds only scalars, so bf16 and fp16 give the same figure",
    "an approximation: the trace is assumed fp32 and the dtype of each activation is inferred from its op only",
];

/// The fp32 job and its autocast variant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrecisionComparison {
    /// Always [`SCHEMA`].
    pub schema: String,
    pub fp32: PeakFigures,
    pub autocast_16bit: PeakFigures,
    /// autocast minus fp32 peak total.
    pub delta_total_bytes: i64,
    /// Blocks halved and bytes of the weight-cast blocks added (per iteration).
    pub halved_blocks: u32,
    pub weight_cast_bytes: Bytes,
    pub fits: Vec<Fit>,
    /// Always true: this is an approximation.
    pub approximate: bool,
    pub rules: Vec<String>,
}

/// Module classes that autocast runs in fp32.
pub const FP32_MODULES: &[&str] = &["LayerNorm", "GroupNorm", "Softmax", "Loss"];

/// Module classes whose weights autocast casts to 16-bit.
pub const CAST_MODULES: &[&str] = &["Conv", "Linear"];

fn has(op: Option<&str>, fragments: &[&str]) -> bool {
    op.is_some_and(|op| fragments.iter().any(|f| op.contains(f)))
}

/// The module class of a layer path: `A_0/B_1/Conv2d_3` → `Conv2d`.
fn module_class(layer: Option<&str>) -> Option<&str> {
    let last = layer?.rsplit('/').next()?;
    Some(match last.rsplit_once('_') {
        Some((class, index)) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => {
            class
        }
        _ => last,
    })
}

fn halves(block: &ScheduledBlock) -> bool {
    matches!(block.category, Category::Activation | Category::Temporary)
        && matches!(block.phase, Phase::Forward | Phase::Backward)
        && !has(block.op.as_deref(), FP32_OPS)
        && !has(module_class(block.layer.as_deref()), FP32_MODULES)
}

fn casts(block: &ScheduledBlock) -> bool {
    has(block.op.as_deref(), LOW_PRECISION_OPS)
        || has(module_class(block.layer.as_deref()), CAST_MODULES)
}

/// The autocast sequence, the number of halved blocks and the weight-cast
/// bytes per iteration.
pub fn autocast(schedule: &Schedule) -> Result<(Schedule, u32, Bytes), WhatIfError> {
    let marks = landmarks(schedule);
    let mut edit = Edit::new(schedule);
    edit.shard(2, halves);
    let halved = schedule.blocks.iter().filter(|b| halves(b)).count();
    let cast_layers: BTreeSet<&str> = schedule
        .blocks
        .iter()
        .filter(|b| b.phase == Phase::Forward && casts(b))
        .filter_map(|b| b.layer.as_deref())
        .collect();
    let cast: u64 = schedule
        .blocks
        .iter()
        .filter(|b| b.category == Category::Parameter)
        .filter(|b| b.layer.as_deref().is_some_and(|l| cast_layers.contains(l)))
        .map(|b| b.size.get().div_ceil(2))
        .sum();
    if cast > 0 {
        for (iteration, &first) in &marks.forward_first {
            let last = marks.backward_last.get(iteration).copied().unwrap_or(first);
            edit.add(
                Bytes(cast),
                Category::Activation,
                Phase::Forward,
                "autocast_weight_cast",
                At::Before(first),
                Some(At::After(last)),
            );
        }
    }
    Ok((
        edit.build()?,
        u32::try_from(halved).unwrap_or(u32::MAX),
        Bytes(cast),
    ))
}

/// Simulates the fp32 job and its autocast variant.
pub fn compare(prepared: &Prepared, config: &Config) -> Result<PrecisionComparison, WhatIfError> {
    let schedule = &prepared.orchestrated.schedule;
    let fp32 = PeakFigures::of(&estimate_schedule(
        prepared,
        schedule.clone(),
        &peak_only(config),
    )?);
    let (low, halved_blocks, weight_cast_bytes) = autocast(schedule)?;
    let report = estimate_schedule(prepared, low, config)?;
    let autocast_16bit = PeakFigures::of(&report);
    Ok(PrecisionComparison {
        schema: SCHEMA.to_owned(),
        fp32,
        autocast_16bit,
        delta_total_bytes: signed_delta(autocast_16bit.total_bytes, fp32.total_bytes),
        halved_blocks,
        weight_cast_bytes,
        fits: fits_of(&report),
        approximate: true,
        rules: RULES.iter().map(|r| (*r).to_owned()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(category: Category, phase: Phase, op: &str) -> ScheduledBlock {
        ScheduledBlock {
            size: Bytes(1000),
            category,
            iteration: Some(0),
            phase,
            op: Some(op.to_owned()),
            layer: None,
        }
    }

    #[test]
    fn module_classes_drop_the_instance_counter() {
        assert_eq!(
            module_class(Some("ResNet_0/Sequential_0/Conv2d_3")),
            Some("Conv2d")
        );
        assert_eq!(module_class(Some("GPT2Model_0/Conv1D")), Some("Conv1D"));
        assert_eq!(module_class(None), None);
        let mut ln = block(Category::Activation, Phase::Forward, "aten::empty");
        ln.layer = Some("Bert_0/LayerNorm_2".to_owned());
        assert!(!halves(&ln));
        ln.layer = Some("Bert_0/Linear_2".to_owned());
        assert!(halves(&ln) && casts(&ln));
    }

    #[test]
    fn only_low_precision_activations_are_halved() {
        assert!(halves(&block(
            Category::Activation,
            Phase::Forward,
            "aten::addmm"
        )));
        assert!(halves(&block(
            Category::Temporary,
            Phase::Backward,
            "aten::mm"
        )));
        assert!(!halves(&block(
            Category::Activation,
            Phase::Forward,
            "aten::_log_softmax"
        )));
        assert!(!halves(&block(
            Category::Activation,
            Phase::Forward,
            "aten::native_layer_norm"
        )));
        assert!(!halves(&block(
            Category::Gradient,
            Phase::Backward,
            "aten::mm"
        )));
        assert!(!halves(&block(
            Category::Batch,
            Phase::DataLoading,
            "aten::stack"
        )));
        assert!(!halves(&block(
            Category::Temporary,
            Phase::OptimizerStep,
            "aten::mul"
        )));
    }
}
