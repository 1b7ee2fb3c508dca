//! What-if — **the longest context** a `generate()` run can reach on each
//! GPU: the most new tokens (and so prompt + new tokens positions) before
//! it no longer fits.
//!
//! Each point is a full estimate of the generation extended to that many
//! new tokens (`--new-tokens`: the decode steps copied, the KV cache grown
//! a position a step, every block through the caching allocator), so the
//! fragmentation that growing caches cause is simulated, not assumed. The
//! search doubles the new tokens from the traced count while some GPU still
//! fits, then bisects each GPU's limit between the last point that fits and
//! the first that does not: every answer is simulated, none extrapolated.
//! A length is simulated only on the GPUs whose answer it can change: while
//! doubling, those that fit every shorter length; while bisecting, the GPU
//! bisected. Past the traced length a point is each GPU's run at its
//! capacity alone ([`crate::pipeline::at_capacity`]: its verdict's figures,
//! without the report's unlimited run, whose reserved bytes a long dynamic
//! cache grows far past any GPU).
//!
//! The search stops at the model's **position limit** when the trace shows
//! one ([`position_limit`]: the capture helper's `max_positions`, or the rows
//! of a learned position table the model reads, as GPT-2's `wpe`): a GPU that
//! still fits there gets the limit, marked so. Without one it stops at the
//! simulation budget (`--budget` new tokens), and a GPU that still fits
//! there is marked "no limit in the trace": it fits at least that many.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{PeakFigures, WhatIfError};
use crate::analyzer::generation::Generation;
use crate::diag::Warning;
use crate::pipeline::{at_capacity, estimate, prepare_parsed, Config, GenerationJob};
use crate::report::{AtCapacity, GpuVerdict};
use crate::trace::Trace;

/// The version tag of [`ContextSweep`].
pub const SCHEMA: &str = "memcast.context/3";

/// New tokens simulated at most, by default: a few seconds of copying and
/// simulating decode steps for a small model.
pub const DEFAULT_BUDGET: u32 = 1024;

/// One simulated generation length.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextPoint {
    pub new_tokens: u32,
    /// Positions in the KV cache at the end (prompt + new tokens − 1).
    pub positions: Option<u64>,
    /// Per GPU: its run at its capacity — whether it fits, and its peak
    /// (reserved plus context; up to the failure where it does not fit);
    /// `None` where this length was not simulated on that GPU, its answer
    /// being known without it (it ran out of memory at a shorter length, or
    /// the point was simulated for another GPU's bisection).
    pub runs: Vec<Option<AtCapacity>>,
}

/// How a GPU's limit was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Found {
    /// Between two simulated lengths a token apart.
    Simulated,
    /// It still fits at the model's position limit, simulated.
    PositionLimit,
    /// It still fits at the most new tokens simulated (the budget), and the
    /// trace shows no position limit: at least that many fit.
    NoLimitInTrace,
    /// It still fits at the most new tokens the memory budget lets memcast
    /// rebuild and simulate (below the position limit or the budget asked
    /// for): at least that many fit.
    MemoryBudget,
    /// Not even the traced generation fits.
    DoesNotFit,
}

impl Found {
    /// How the limit was found, in words (the page's and the CLI's).
    pub fn label(self) -> &'static str {
        match self {
            Found::Simulated => "simulated",
            Found::PositionLimit => "fits up to the model's position limit (simulated)",
            Found::NoLimitInTrace => {
                "fits at the most new tokens simulated; no position limit in the trace"
            }
            Found::MemoryBudget => {
                "fits at the most new tokens the memory budget lets memcast simulate"
            }
            Found::DoesNotFit => "the traced generation does not fit",
        }
    }
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
    /// The traced generation's peak on the reference GPU, without a
    /// capacity limit (the estimate's headline).
    pub traced_peak: PeakFigures,
    /// The most new tokens simulated (the budget asked for, or less).
    pub budget_new_tokens: u32,
    /// The model's position limit (prompt + new tokens), when the trace
    /// shows one, and where it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position_limit_from: Option<String>,
    /// Every simulated length, ascending.
    pub points: Vec<ContextPoint>,
    pub gpus: Vec<GpuContext>,
    pub warnings: Vec<Warning>,
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
    /// The first point's peak on the reference GPU (its report's).
    traced_peak: Option<PeakFigures>,
    /// The generation derived once for every length past the traced one
    /// (`None` inside: it does not derive, each length is built whole),
    /// made on the first length asked for.
    derived: Option<Option<GenerationJob>>,
}

impl Search<'_> {
    /// Simulates the generation at `new_tokens` (`None`: as traced) on the
    /// GPUs `on` (indices into the config's; every one for `None`), records
    /// their runs at capacity at the point and returns the generation it
    /// shows. The first point is a whole estimate (its report names the
    /// GPUs and the traced peak); the others are the runs at capacity
    /// alone. A GPU's run is its own, whichever others run beside it: the
    /// runs of one estimate never change each other's decisions.
    fn record(
        &mut self,
        new_tokens: Option<u32>,
        on: Option<&[usize]>,
    ) -> Result<Option<Generation>, WhatIfError> {
        let mut cfg = self.config.clone();
        cfg.scale.new_tokens = new_tokens;
        if let Some(on) = on {
            cfg.gpus = on
                .iter()
                .filter_map(|&i| self.config.gpus.get(i).cloned())
                .collect();
        }
        let streamed = match new_tokens {
            Some(n) => self
                .derived(&cfg)
                .and_then(|job| (n >= job.first_tokens()).then(|| job.prepared(n)).flatten()),
            None => None,
        };
        let prepared = match streamed {
            Some(prepared) => prepared,
            None => prepare_parsed(self.traces, Vec::new(), &cfg, &mut |_| {})?,
        };
        let found: Vec<AtCapacity> = if self.points.is_empty() {
            let report = estimate(&prepared, &cfg, &mut |_| {})?.value;
            self.reference_gpu = report.reference_gpu.clone();
            self.presets = report.gpus.iter().map(|g| g.preset.clone()).collect();
            self.warnings = report.warnings.clone();
            self.traced_peak = Some(PeakFigures::of(&report));
            report.gpus.iter().map(GpuVerdict::at_capacity).collect()
        } else {
            at_capacity(&prepared, &cfg, &mut |_| {})?
        };
        let generation = prepared.generation.clone();
        let n = new_tokens
            .or(generation.as_ref().map(|g| g.calls))
            .unwrap_or(0);
        let every = self.presets.len();
        let point = self.points.entry(n).or_insert_with(|| ContextPoint {
            new_tokens: n,
            positions: generation.as_ref().and_then(|g| g.positions),
            runs: vec![None; every],
        });
        let indices: Vec<usize> = match on {
            Some(on) => on.to_vec(),
            None => (0..found.len()).collect(),
        };
        for (i, run) in indices.into_iter().zip(found) {
            if let Some(slot) = point.runs.get_mut(i) {
                *slot = Some(run);
            }
        }
        Ok(generation)
    }

    /// The generation derived for every length (the same job as
    /// `prepare_parsed` streams), derived on the first call; `None` where
    /// it does not derive (or its rebuilds fail: each length then says why).
    fn derived(&mut self, config: &Config) -> Option<&GenerationJob> {
        if self.derived.is_none() {
            let job = GenerationJob::derive(self.traces, config).ok().flatten();
            self.derived = Some(job);
        }
        self.derived.as_ref().and_then(Option::as_ref)
    }

    /// GPU `gpu`'s run at capacity at `n` new tokens, where it was simulated.
    fn known(&self, n: u32, gpu: usize) -> Option<AtCapacity> {
        self.points.get(&n)?.runs.get(gpu).copied().flatten()
    }

    /// Whether GPU `gpu` was simulated at `n` new tokens and fits.
    fn fits(&self, n: u32, gpu: usize) -> bool {
        self.known(n, gpu).is_some_and(|r| r.fits)
    }

    /// Whether GPU `gpu` fits at `n` new tokens, simulated on it alone
    /// unless the point already has it.
    fn fits_at(&mut self, n: u32, gpu: usize) -> Result<bool, WhatIfError> {
        if self.known(n, gpu).is_none() {
            self.record((n != self.traced).then_some(n), Some(&[gpu]))?;
        }
        Ok(self.fits(n, gpu))
    }
}

/// The model's position limit the traces show, and where it was read:
/// the capture helper's `max_positions` (the config's
/// `max_position_embeddings`), else the rows of a learned position table —
/// an `aten::embedding` weight other than the first call's (the token
/// table) with at least as many rows as the positions the trace already
/// used (a relative-position or token-type table has fewer).
pub fn position_limit(traces: &[Trace], used: u64) -> Option<(u64, String)> {
    let first = traces.first()?;
    if let Some(n) = first.header.capture.as_ref().and_then(|c| c.max_positions) {
        return Some((
            u64::from(n),
            "max_position_embeddings in the capture".to_owned(),
        ));
    }
    let mut tables: Vec<u64> = Vec::new();
    for op in &first.ops {
        if first.name(op.name) != "aten::embedding" {
            continue;
        }
        let Some(weight) = first.tensor_args(op).iter().find(|a| a.position == 0) else {
            continue;
        };
        let rows = first
            .numbers(weight.dims)
            .first()
            .and_then(|&r| u64::try_from(r).ok());
        if let Some(rows) = rows {
            if !tables.contains(&rows) {
                tables.push(rows);
            }
        }
    }
    // The first table is the tokens'; the first later one that holds every
    // position used is the positions'.
    let rows = tables.iter().skip(1).copied().find(|&r| r >= used)?;
    Some((rows, format!("the {rows}-row learned position table")))
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
        traced_peak: None,
        derived: None,
    };
    // The generation as traced: its point, and what it is.
    let Some(generation) = search.record(None, None)? else {
        return Err(WhatIfError::Pipeline(
            crate::scale::ScaleError::NoGeneration.into(),
        ));
    };
    let traced = generation.calls;
    let Some(traced_peak) = search.traced_peak else {
        return Err(WhatIfError::Pipeline(
            crate::scale::ScaleError::NoGeneration.into(),
        ));
    };
    search.traced = traced;
    let prompt = generation.prompt_tokens.unwrap_or(0);
    let limit = position_limit(traces, prompt + u64::from(traced));
    // With a limit the search goes to it (however far the budget); without
    // one, to the budget.
    let wanted = match &limit {
        Some((positions, _)) => u32::try_from(positions.saturating_sub(prompt)).unwrap_or(u32::MAX),
        None => budget,
    }
    .clamp(traced, crate::scale::MAX_NEW_TOKENS);
    // A generation that derives is streamed at every length, in the memory
    // of its short rebuilds (made within the budget already). One built
    // whole at each length goes no further than the memory budget lets
    // memcast rebuild and simulate (issue 33: a request is sized before it
    // is built).
    let streams = {
        let mut cfg = config.clone();
        cfg.scale.new_tokens = Some(wanted);
        search
            .derived(&cfg)
            .is_some_and(|job| wanted < job.first_tokens() || job.prepared(wanted).is_some())
    };
    let fits = if streams {
        wanted
    } else {
        crate::scale::most_new_tokens(traces, &config.scale, config.work_budget()).unwrap_or(traced)
    };
    let budget = wanted.min(fits).max(traced);
    let memory_bound = budget < wanted;
    if memory_bound {
        search.warnings.push(Warning::asking(
            "context_memory_budget",
            &format!(
                "{wanted} new tokens were to be simulated, and at most {budget} fit the memory budget: a GPU that still fits at {budget} fits at least that many; to simulate further, "
            ),
            crate::diag::Setting::MemoryBudget,
        ));
    }
    // Doubling while some GPU fits, within the budget; each length
    // simulated on the GPUs that fit every shorter one (a GPU's first
    // length that does not fit bounds its bisection; longer ones are not
    // needed for it).
    let mut open: Vec<usize> = (0..search.presets.len())
        .filter(|&gi| search.fits(traced, gi))
        .collect();
    let mut n = traced;
    while !open.is_empty() && n < budget {
        n = n.saturating_mul(2).max(n + 1).min(budget);
        search.record(Some(n), Some(&open))?;
        open.retain(|&gi| search.fits(n, gi));
    }
    let presets = search.presets.clone();
    let mut gpus = Vec::with_capacity(presets.len());
    for (gi, preset) in presets.into_iter().enumerate() {
        let fits = |p: &ContextPoint| p.runs.get(gi).copied().flatten().map(|r| r.fits);
        let first_fail = search
            .points
            .values()
            .find(|p| fits(p) == Some(false))
            .map(|p| p.new_tokens);
        let last_fit = search
            .points
            .values()
            .filter(|p| fits(p) == Some(true) && first_fail.is_none_or(|f| p.new_tokens < f))
            .map(|p| p.new_tokens)
            .max();
        let (max, found) = match (last_fit, first_fail) {
            (None, _) => (None, Found::DoesNotFit),
            (Some(lo), Some(hi)) => {
                let (mut lo, mut hi) = (lo, hi);
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if search.fits_at(mid, gi)? {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                (Some(u64::from(lo)), Found::Simulated)
            }
            (Some(lo), None) if memory_bound => (Some(u64::from(lo)), Found::MemoryBudget),
            (Some(lo), None) if limit.is_some() => (Some(u64::from(lo)), Found::PositionLimit),
            (Some(lo), None) => (Some(u64::from(lo)), Found::NoLimitInTrace),
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
        traced_peak,
        budget_new_tokens: budget,
        position_limit: limit.as_ref().map(|(n, _)| *n),
        position_limit_from: limit.map(|(_, from)| from),
        points: search.points.into_values().collect(),
        gpus,
        warnings: search.warnings,
    })
}
