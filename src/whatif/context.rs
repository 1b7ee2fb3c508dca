//! What-if — **the longest context** a `generate()` run can reach on each
//! GPU: the most new tokens (and so prompt + new tokens positions) before
//! it no longer fits.
//!
//! Each point is a full estimate of the generation extended to that many
//! new tokens (`--new-tokens`: the decode steps copied, the KV cache grown
//! a position a step, every block through the caching allocator), so the
//! fragmentation that growing caches cause is simulated, not assumed. The
//! search doubles the new tokens from the traced count while some GPU still
//! fits and the count stays within the simulation budget, then bisects
//! each GPU's limit between the last point that fits and the first that
//! does not. A GPU that still fits at the budget gets its limit
//! *extrapolated* past the largest point (see [`extrapolate`]; the result
//! says so): simulating far past the budget would copy that many decode
//! steps. Growing caches fragment the allocator more at longer lengths, so
//! an extrapolated limit can be optimistic: raise the budget to simulate
//! up to it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{PeakFigures, WhatIfError};
use crate::analyzer::generation::Generation;
use crate::diag::Warning;
use crate::pipeline::{estimate, prepare_parsed, Config};
use crate::report::Report;
use crate::trace::Trace;

/// The version tag of [`ContextSweep`].
pub const SCHEMA: &str = "memcast.context/1";

/// New tokens simulated at most, by default: a few seconds of copying and
/// simulating decode steps for a small model.
pub const DEFAULT_BUDGET: u32 = 1024;

/// One simulated generation length.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextPoint {
    pub new_tokens: u32,
    /// Positions in the KV cache at the end (prompt + new tokens − 1).
    pub positions: Option<u64>,
    pub peak: PeakFigures,
    /// Per GPU: capacity left at the peak (negative: what is missing).
    pub margins: Vec<i64>,
}

/// How a GPU's limit was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Found {
    /// Between two simulated lengths a token apart.
    Simulated,
    /// Beyond the simulation budget, along the last two points' line.
    Extrapolated,
    /// Not even the traced generation fits.
    DoesNotFit,
    /// The peak did not grow between the two largest points: no limit.
    NoGrowth,
}

/// One GPU's longest generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuContext {
    pub preset: String,
    /// The most new tokens that fit (`None` when none does).
    pub max_new_tokens: Option<u64>,
    /// Prompt + those new tokens.
    pub max_context_tokens: Option<u64>,
    pub found: Found,
}

/// The longest-context sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextSweep {
    pub schema: String,
    pub reference_gpu: String,
    pub prompt_tokens: Option<u64>,
    pub traced_new_tokens: u32,
    /// The most new tokens simulated (the budget asked for, or less).
    pub budget_new_tokens: u32,
    /// Every simulated length, ascending.
    pub points: Vec<ContextPoint>,
    pub gpus: Vec<GpuContext>,
    pub warnings: Vec<Warning>,
}

/// The capacity left on each GPU (negative: the shortfall).
fn margins(report: &Report) -> Vec<i64> {
    report
        .gpus
        .iter()
        .map(|g| match (g.headroom_bytes, g.shortfall_bytes) {
            (Some(h), _) => i64::try_from(h.get()).unwrap_or(i64::MAX),
            (None, Some(s)) => -i64::try_from(s.get()).unwrap_or(i64::MAX),
            (None, None) => {
                if g.fits {
                    0
                } else {
                    -1
                }
            }
        })
        .collect()
}

/// The simulated points, by new tokens, and what the first one showed.
struct Search<'a> {
    traces: &'a [Trace],
    config: &'a Config,
    traced: u32,
    points: BTreeMap<u32, ContextPoint>,
    reference_gpu: String,
    presets: Vec<String>,
    warnings: Vec<Warning>,
}

impl Search<'_> {
    /// Estimates the generation at `new_tokens` (`None`: as traced),
    /// records the point and returns the generation it shows.
    fn record(&mut self, new_tokens: Option<u32>) -> Result<Option<Generation>, WhatIfError> {
        let mut cfg = self.config.clone();
        cfg.scale.new_tokens = new_tokens;
        let prepared = prepare_parsed(self.traces, Vec::new(), &cfg, &mut |_| {})?;
        let report = estimate(&prepared, &cfg, &mut |_| {})?.value;
        if self.points.is_empty() {
            self.reference_gpu = report.reference_gpu.clone();
            self.presets = report.gpus.iter().map(|g| g.preset.clone()).collect();
            self.warnings = report.warnings.clone();
        }
        let generation = report.summary.generation.clone();
        let n = new_tokens
            .or(generation.as_ref().map(|g| g.calls))
            .unwrap_or(0);
        self.points.insert(
            n,
            ContextPoint {
                new_tokens: n,
                positions: generation.as_ref().and_then(|g| g.positions),
                peak: PeakFigures::of(&report),
                margins: margins(&report),
            },
        );
        Ok(generation)
    }

    /// The margins of the generation extended to `n` new tokens.
    fn margins_at(&mut self, n: u32) -> Result<Vec<i64>, WhatIfError> {
        if !self.points.contains_key(&n) {
            self.record((n != self.traced).then_some(n))?;
        }
        Ok(self
            .points
            .get(&n)
            .map(|p| p.margins.clone())
            .unwrap_or_default())
    }

    /// GPU `gpu`'s margin at `n` new tokens.
    fn margin(&mut self, n: u32, gpu: usize) -> Result<i64, WhatIfError> {
        Ok(self.margins_at(n)?.get(gpu).copied().unwrap_or(-1))
    }
}

/// New tokens past the largest point until GPU `gpu`'s margin is spent,
/// at the steeper of two rates per token: the total's (reserved + context)
/// from the first point to the largest (reserved memory grows in segment
/// steps, so nearby points can show none), and the live bytes' (allocated)
/// from the point at half the largest to it, which reserved memory cannot
/// grow slower than for long; and never below the KV cache's bytes per
/// token, which every new position keeps. `None` when nothing grows.
fn extrapolate(points: &BTreeMap<u32, ContextPoint>, gpu: usize, kv_per_token: u64) -> Option<u64> {
    let (&last_n, last) = points.iter().next_back()?;
    let (&first_n, first) = points.iter().next()?;
    let (&half_n, half) = points
        .range(..=last_n / 2)
        .next_back()
        .or(Some((&first_n, first)))?;
    let rate = |from: u64, to: u64, span: u32| -> f64 {
        if span == 0 {
            0.0
        } else {
            to.saturating_sub(from) as f64 / f64::from(span)
        }
    };
    let total = rate(
        first.peak.total_bytes.get(),
        last.peak.total_bytes.get(),
        last_n - first_n,
    );
    let live = rate(
        half.peak.allocated_bytes.get(),
        last.peak.allocated_bytes.get(),
        last_n - half_n,
    );
    let per_token = total.max(live).max(kv_per_token as f64);
    let margin = last.margins.get(gpu).copied().unwrap_or(-1);
    (per_token > 0.0 && margin >= 0).then(|| (margin as f64 / per_token).floor() as u64)
}

/// Finds each GPU's longest generation for the job `traces` record (one
/// `generate()` trace, or its `--layers` rebuild: `config.scale` is kept
/// but its number of new tokens is the search's), simulating at most
/// `budget` new tokens.
pub fn longest(
    traces: &[Trace],
    config: &Config,
    budget: u32,
) -> Result<ContextSweep, WhatIfError> {
    let mut search = Search {
        traces,
        config,
        traced: 0,
        points: BTreeMap::new(),
        reference_gpu: String::new(),
        presets: Vec::new(),
        warnings: Vec::new(),
    };
    // The generation as traced: its point, and what it is.
    let Some(generation) = search.record(None)? else {
        return Err(WhatIfError::Pipeline(
            crate::scale::ScaleError::NoGeneration.into(),
        ));
    };
    let traced = generation.calls;
    search.traced = traced;
    let kv_per_token = generation.bytes_per_token.map_or(0, |b| b.get());
    // Within the memory budget: past it the limits are extrapolated.
    let fits = crate::scale::most_new_tokens(traces, &config.scale, config.work_budget())
        .unwrap_or(traced);
    let asked = budget;
    let budget = budget
        .min(crate::scale::MAX_NEW_TOKENS)
        .min(fits)
        .max(traced);
    if budget < asked.min(crate::scale::MAX_NEW_TOKENS) {
        search.warnings.push(Warning::asking(
            "context_memory_budget",
            &format!(
                "{asked} new tokens were to be simulated, and at most {budget} fit the memory budget: each GPU's limit past {budget} is extrapolated; to simulate further, "
            ),
            crate::diag::Setting::MemoryBudget,
        ));
    }
    // Doubling while some GPU fits, within the budget.
    let mut n = traced;
    loop {
        let m = search.margins_at(n)?;
        if m.iter().all(|&x| x < 0) || n >= budget {
            break;
        }
        n = n.saturating_mul(2).min(budget);
    }
    let presets = search.presets.clone();
    let mut gpus = Vec::with_capacity(presets.len());
    for (gi, preset) in presets.into_iter().enumerate() {
        let margin = |p: &ContextPoint| p.margins.get(gi).copied().unwrap_or(-1);
        let first_fail = search
            .points
            .values()
            .find(|p| margin(p) < 0)
            .map(|p| p.new_tokens);
        let last_fit = search
            .points
            .values()
            .filter(|p| margin(p) >= 0 && first_fail.is_none_or(|f| p.new_tokens < f))
            .map(|p| p.new_tokens)
            .max();
        let (max, found) = match (last_fit, first_fail) {
            (None, _) => (None, Found::DoesNotFit),
            (Some(lo), Some(hi)) => {
                let (mut lo, mut hi) = (lo, hi);
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if search.margin(mid, gi)? >= 0 {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                (Some(u64::from(lo)), Found::Simulated)
            }
            (Some(lo), None) => match extrapolate(&search.points, gi, kv_per_token) {
                Some(more) => (
                    Some(u64::from(lo).saturating_add(more)),
                    Found::Extrapolated,
                ),
                None => (None, Found::NoGrowth),
            },
        };
        gpus.push(GpuContext {
            preset,
            max_new_tokens: max,
            max_context_tokens: max.and_then(|m| generation.prompt_tokens.map(|p| p + m)),
            found,
        });
    }
    Ok(ContextSweep {
        schema: SCHEMA.to_owned(),
        reference_gpu: search.reference_gpu,
        prompt_tokens: generation.prompt_tokens,
        traced_new_tokens: traced,
        budget_new_tokens: budget,
        points: search.points.into_values().collect(),
        gpus,
        warnings: search.warnings,
    })
}
