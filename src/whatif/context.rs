//! What-if — **the longest context** a `generate()` run can reach on each
//! GPU: the most new tokens (and so prompt + new tokens positions) before
//! it no longer fits.
//!
//! Each point is a full estimate of the generation extended to that many
//! new tokens (`--new-tokens`: the decode steps copied, the KV cache grown
//! a position a step, every block through the caching allocator), so the
//! fragmentation that growing caches cause is simulated, not assumed. Past
//! the traced length a point is each GPU's run at its capacity alone
//! ([`crate::pipeline::at_capacity`]: its verdict's figures, without the
//! report's unlimited run, whose reserved bytes a long dynamic cache grows
//! far past any GPU).
//!
//! The search ([`Bounds::next`]) tries every GPU that fits the traced
//! length at the longest length first: a GPU that fits there needs nothing
//! else, and a run at capacity that runs out stops where it does, so a
//! small GPU's try costs its own limit's length, not the budget's. A run
//! that runs out in the first `generate()` call's decode steps shows where
//! every longer generation runs out: up to that step they make the same
//! events (where nothing before depends on the length, as a cache grown a
//! step at a time: [`crate::program::Program::first_steps_fixed`]), so the
//! allocator decides the same, and the length one token shorter is tried
//! next. Where a run runs out in a later call, the length whose call would
//! end just before that step is tried; hints and bisection take turns, so
//! the search is never longer than twice a bisection. Every answer is a
//! length simulated to fit with one token more known not to: simulated, or
//! shown so; none is extrapolated. The GPUs that try the same length share
//! its simulation, and the lengths of a round run side by side where the
//! shell has cores.
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
use crate::pipeline::{
    at_capacity_from, at_capacity_keeping, estimate_with, prepare_parsed, CapacityRun, Config,
    GenerationJob, InTurn, Parallel, Resume, Task,
};
use crate::program::{JobRef, StepRun};
use crate::report::AtCapacity;
use crate::trace::Trace;

/// The version tag of [`ContextSweep`].
pub const SCHEMA: &str = "memcast.context/5";

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
    /// It still fits at the most new tokens memcast rebuilds at all
    /// ([`crate::scale::MAX_NEW_TOKENS`]), below the position limit or the
    /// budget asked for: at least that many fit.
    MostNewTokens,
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
            Found::MostNewTokens => "fits at the most new tokens memcast simulates",
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
    /// The fewest new tokens known not to fit (`None`: it fits at the most
    /// simulated, or not even the traced generation does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_out_at: Option<u64>,
    /// Where `runs_out_at` was not simulated itself: the longer length
    /// simulated whose first `generate()` call ran out of memory at that
    /// many new tokens. Every generation at least that long makes the same
    /// events up to there (a cache grown a step at a time), so it runs out
    /// there too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_by: Option<u32>,
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
    points: BTreeMap<u32, ContextPoint>,
    reference_gpu: String,
    presets: Vec<String>,
    warnings: Vec<Warning>,
    /// The generation derived once for every length past the traced one
    /// (`None` inside: it does not derive, each length is built whole),
    /// made on the first length asked for.
    derived: Option<Option<GenerationJob>>,
    /// Per GPU, the last checkpoint of its last run that ran out, to take
    /// a shorter length's run up from ([`crate::pipeline::at_capacity_from`]).
    resumes: Vec<Option<Resume>>,
}

/// The traced generation's point: its estimate's report, whose verdicts
/// are its runs at capacity.
struct Traced {
    generation: Option<Generation>,
    peak: PeakFigures,
}

/// A length simulated on some GPUs.
struct Simulated {
    new_tokens: u32,
    positions: Option<u64>,
    /// Per GPU simulated (its index in the config's): its run at capacity,
    /// what its running out shows, and its last checkpoint.
    runs: Vec<(usize, AtCapacity, RanOut, Option<Resume>)>,
}

/// What a run that ran out of memory shows of other lengths.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct RanOut {
    /// Every length of at least this many new tokens runs out too: the run
    /// ran out in the first `generate()` call's decode steps, before
    /// anything that depends on the length (`first_steps_fixed`).
    bound: Option<u32>,
    /// The length whose call it ran out in would end just before the step
    /// it ran out at: a length to try.
    hint: Option<u32>,
}

impl RanOut {
    /// What running out at event `at` of `job` (the generation at
    /// `new_tokens`) shows; nothing where it was not in a decode step.
    fn of(job: JobRef<'_>, new_tokens: u32, at: u64) -> RanOut {
        // The step of a run of steps the event is in, and the new tokens of
        // the length whose run of steps has just that many.
        let step = |run: &StepRun| -> Option<(u64, u64)> {
            let past = at.checked_sub(run.start)?;
            let step = past.checked_div(run.events)?;
            let before = u64::from(new_tokens).checked_sub(run.copies)?;
            (step < run.copies).then_some((step, before))
        };
        let hint = job
            .step_runs()
            .iter()
            .find_map(step)
            .and_then(|(step, before)| u32::try_from(step.saturating_add(before)).ok());
        let bound = job.first_steps_fixed().and_then(|run| {
            let first = if at < run.start {
                // Before the steps: every length runs out there.
                u64::from(new_tokens).checked_sub(run.copies)?
            } else {
                let (step, before) = step(&run)?;
                step.saturating_add(1).saturating_add(before)
            };
            u32::try_from(first).ok()
        });
        RanOut { bound, hint }
    }
}

/// What a GPU's search knows of its limit.
#[derive(Debug, Clone, Copy, Default)]
struct Bounds {
    /// The most new tokens simulated to fit (`None`: not even the traced
    /// generation).
    fits: Option<u32>,
    /// The fewest new tokens known not to fit, and the length simulated
    /// that showed it (that length itself, or a longer one that ran out in
    /// the first call's steps: [`RanOut::bound`]).
    runs_out: Option<(u32, u32)>,
    /// A length to try next ([`RanOut::hint`]).
    hint: Option<u32>,
    /// The last length tried was the hint.
    hinted: bool,
}

impl Bounds {
    /// The next length to simulate, and whether it is the hint; `None`
    /// when the limit is found or the GPU fits at `top`. The first try is
    /// `top`: a GPU that fits there needs no other, one that runs out
    /// does so at its limit's length (a run at capacity stops there), and
    /// shows where to look. Then a hint, where one falls between the
    /// bounds, and the middle in turn: at most twice the bisection's
    /// tries, however poor the hints.
    fn next(&self, top: u32) -> Option<(u32, bool)> {
        let lo = self.fits?;
        match self.runs_out {
            None => (lo < top).then_some((top, false)),
            Some((hi, _)) if hi <= lo.saturating_add(1) => None,
            Some((hi, _)) => match self.hint.filter(|&h| h > lo && h < hi && !self.hinted) {
                Some(h) => Some((h, true)),
                None => Some((lo + (hi - lo) / 2, false)),
            },
        }
    }

    /// Learns the run at capacity at `n` new tokens.
    fn learn(&mut self, n: u32, run: AtCapacity, ran_out: RanOut) {
        if run.fits {
            self.fits = self.fits.max(Some(n));
            return;
        }
        let lo = self.fits.unwrap_or(0);
        let mut hi = self.runs_out.map_or((n, n), |h| h.min((n, n)));
        // Shown by a longer run: only where it says more (and agrees with
        // what fits).
        if let Some(b) = ran_out.bound.filter(|&b| b > lo && b < hi.0) {
            hi = (b, n);
        }
        self.runs_out = Some(hi);
        self.hint = ran_out.hint;
    }
}

impl Search<'_> {
    /// The generation as traced, on every GPU: a whole estimate, whose
    /// report names the GPUs, gives the warnings and the traced peak.
    fn traced(&mut self, parallel: &dyn Parallel) -> Result<Traced, WhatIfError> {
        let prepared = prepare_parsed(self.traces, Vec::new(), self.config, &mut |_| {})?;
        let report = estimate_with(&prepared, self.config, &mut |_| {}, parallel)?.value;
        self.reference_gpu = report.reference_gpu.clone();
        self.presets = report.gpus.iter().map(|g| g.preset.clone()).collect();
        self.warnings = report.warnings.clone();
        let generation = prepared.generation.clone();
        let n = generation.as_ref().map_or(0, |g| g.calls);
        self.keep(Simulated {
            new_tokens: n,
            positions: generation.as_ref().and_then(|g| g.positions),
            runs: report
                .gpus
                .iter()
                .enumerate()
                .map(|(i, g)| (i, g.at_capacity(), RanOut::default(), None))
                .collect(),
        });
        Ok(Traced {
            generation,
            peak: PeakFigures::of(&report),
        })
    }

    /// Each GPU's run at capacity at `new_tokens` on the GPUs `on`
    /// (indices into the config's), through `parallel`. A GPU's run is its
    /// own, whichever others run beside it: the runs of one estimate never
    /// change each other's decisions. A GPU whose longer run ran out is
    /// taken up from that run's last checkpoint where this length makes the
    /// events before it (the same run, [`crate::pipeline::at_capacity_from`]).
    fn simulate(
        &self,
        new_tokens: u32,
        on: &[usize],
        parallel: &dyn Parallel,
    ) -> Result<Simulated, WhatIfError> {
        let mut cfg = self.config.clone();
        cfg.scale.new_tokens = Some(new_tokens);
        cfg.gpus = on
            .iter()
            .filter_map(|&i| self.config.gpus.get(i).cloned())
            .collect();
        let streamed = self
            .derived
            .as_ref()
            .and_then(Option::as_ref)
            .filter(|job| new_tokens >= job.first_tokens())
            .and_then(|job| job.prepared(new_tokens));
        let prepared = match streamed {
            Some(prepared) => prepared,
            None => prepare_parsed(self.traces, Vec::new(), &cfg, &mut |_| {})?,
        };
        let mut found: Vec<(usize, (CapacityRun, Option<Resume>))> = Vec::new();
        let mut rest: Vec<usize> = Vec::new();
        for &i in on {
            let resume = self.resumes.get(i).and_then(Option::as_ref);
            let taken_up = match (resume, self.config.gpus.get(i)) {
                (Some(resume), Some(gpu)) => at_capacity_from(&prepared, gpu, resume),
                _ => None,
            };
            match taken_up {
                Some(run) => found.push((i, run)),
                None => rest.push(i),
            }
        }
        if !rest.is_empty() {
            cfg.gpus = rest
                .iter()
                .filter_map(|&i| self.config.gpus.get(i).cloned())
                .collect();
            let runs = at_capacity_keeping(&prepared, &cfg, &mut |_| {}, parallel, true)?;
            found.extend(rest.into_iter().zip(runs));
        }
        found.sort_by_key(|(i, _)| *i);
        let job = prepared.job();
        let runs = found
            .into_iter()
            .map(|(i, (run, resume))| {
                let ran_out = run
                    .ran_out_at
                    .map(|at| RanOut::of(job, new_tokens, at))
                    .unwrap_or_default();
                (i, run.at, ran_out, resume.filter(|_| !run.at.fits))
            })
            .collect();
        Ok(Simulated {
            new_tokens,
            positions: prepared.generation.as_ref().and_then(|g| g.positions),
            runs,
        })
    }

    /// Simulates each length of `probes` on its GPUs: one length with
    /// `parallel` across its GPUs' runs, several side by side where the
    /// job streams (a job built whole at each length holds the memory
    /// budget: one at a time).
    fn simulate_each(
        &self,
        probes: &BTreeMap<u32, Vec<usize>>,
        streams: bool,
        parallel: &dyn Parallel,
    ) -> Result<Vec<Simulated>, WhatIfError> {
        if probes.len() < 2 || !streams {
            return probes
                .iter()
                .map(|(&n, on)| self.simulate(n, on, parallel))
                .collect();
        }
        let mut done: Vec<Option<Result<Simulated, WhatIfError>>> =
            probes.iter().map(|_| None).collect();
        let tasks: Vec<Task<'_>> = probes
            .iter()
            .zip(done.iter_mut())
            .map(|((&n, on), slot)| {
                let task: Task<'_> = Box::new(move || *slot = Some(self.simulate(n, on, &InTurn)));
                task
            })
            .collect();
        parallel.run_tasks(tasks, &mut |_| {});
        // A length the shell did not simulate is simulated here.
        done.into_iter()
            .zip(probes)
            .map(|(d, (&n, on))| d.unwrap_or_else(|| self.simulate(n, on, &InTurn)))
            .collect()
    }

    /// Whether GPU `gpu` was simulated at `n` new tokens and fits.
    fn fits(&self, n: u32, gpu: usize) -> bool {
        self.points
            .get(&n)
            .and_then(|p| p.runs.get(gpu).copied().flatten())
            .is_some_and(|r| r.fits)
    }

    /// Records a simulated length's runs at capacity.
    fn keep(&mut self, simulated: Simulated) {
        let every = self.presets.len();
        let point = self
            .points
            .entry(simulated.new_tokens)
            .or_insert_with(|| ContextPoint {
                new_tokens: simulated.new_tokens,
                positions: simulated.positions,
                runs: vec![None; every],
            });
        for (i, run, _, resume) in simulated.runs {
            if let Some(slot) = point.runs.get_mut(i) {
                *slot = Some(run);
            }
            if resume.is_some() {
                if let Some(slot) = self.resumes.get_mut(i) {
                    *slot = resume;
                }
            }
        }
    }

    /// The generation derived for every length (the same job as
    /// `prepare_parsed` streams), derived on the first call with
    /// `parallel`; `None` where it does not derive (or its rebuilds fail:
    /// each length then says why).
    fn derived(&mut self, config: &Config, parallel: &dyn Parallel) -> Option<&GenerationJob> {
        if self.derived.is_none() {
            let job = GenerationJob::derive(self.traces, config, parallel)
                .ok()
                .flatten();
            self.derived = Some(job);
        }
        self.derived.as_ref().and_then(Option::as_ref)
    }
}

/// How a GPU's search ended, from its bounds and what stopped the search
/// at the top length: the memory budget, memcast's most new tokens, else
/// the position limit where the trace shows one, or the budget asked for.
fn found(b: &Bounds, memory_bound: bool, capped: bool, position_limit: bool) -> Found {
    match (b.fits, b.runs_out) {
        (None, _) => Found::DoesNotFit,
        (Some(_), Some(_)) => Found::Simulated,
        (Some(_), None) if memory_bound => Found::MemoryBudget,
        (Some(_), None) if capped => Found::MostNewTokens,
        (Some(_), None) if position_limit => Found::PositionLimit,
        (Some(_), None) => Found::NoLimitInTrace,
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
    parallel: &dyn Parallel,
) -> Result<ContextSweep, WhatIfError> {
    let mut search = Search {
        traces,
        config,
        points: BTreeMap::new(),
        reference_gpu: String::new(),
        presets: Vec::new(),
        warnings: Vec::new(),
        derived: None,
        resumes: Vec::new(),
    };
    // The generation as traced: its point, and what it is.
    let traced_point = search.traced(parallel)?;
    search.resumes = vec![None; search.presets.len()];
    let Some(generation) = traced_point.generation else {
        return Err(WhatIfError::Pipeline(
            crate::scale::ScaleError::NoGeneration.into(),
        ));
    };
    let traced = generation.calls;
    let prompt = generation.prompt_tokens.unwrap_or(0);
    let limit = position_limit(traces, prompt + u64::from(traced));
    // With a limit the search goes to it (however far the budget); without
    // one, to the budget; never past the most new tokens memcast rebuilds.
    let asked = match &limit {
        Some((positions, _)) => u32::try_from(positions.saturating_sub(prompt)).unwrap_or(u32::MAX),
        None => budget,
    };
    let most = crate::scale::MAX_NEW_TOKENS;
    let wanted = asked.clamp(traced, most);
    let capped = asked > most;
    if capped {
        let why = limit
            .as_ref()
            .map_or("the budget asked for".to_owned(), |(n, from)| {
                format!("to the model's position limit, {n} positions ({from})")
            });
        search.warnings.push(Warning::new(
            "context_new_tokens_capped",
            format!(
                "{asked} new tokens were to be simulated ({why}), and memcast rebuilds a generation of at most {most}: a GPU that still fits at {most} fits at least that many"
            ),
        ));
    }
    // A generation that derives is streamed at every length, in the memory
    // of its short rebuilds (made within the budget already). One built
    // whole at each length goes no further than the memory budget lets
    // memcast rebuild and simulate (issue 33: a request is sized before it
    // is built).
    let streams = {
        let mut cfg = config.clone();
        cfg.scale.new_tokens = Some(wanted);
        search
            .derived(&cfg, parallel)
            .is_some_and(|job| wanted < job.first_tokens() || job.prepared(wanted).is_some())
    };
    let fits = if streams {
        wanted
    } else {
        crate::scale::most_new_tokens(traces, &config.scale, config.work_budget()).unwrap_or(traced)
    };
    let top = wanted.min(fits).max(traced);
    let memory_bound = top < wanted;
    if memory_bound {
        search.warnings.push(Warning::asking(
            "context_memory_budget",
            &format!(
                "{wanted} new tokens were to be simulated, and at most {top} fit the memory budget: a GPU that still fits at {top} fits at least that many; to simulate further, "
            ),
            crate::diag::Setting::MemoryBudget,
        ));
    }
    // Each GPU from what the traced length showed; then, round by round,
    // each GPU still searching tries its next length ([`Bounds::next`]),
    // the GPUs that try the same length in one simulation of it.
    let mut bounds: Vec<Bounds> = (0..search.presets.len())
        .map(|gi| Bounds {
            fits: search.fits(traced, gi).then_some(traced),
            ..Bounds::default()
        })
        .collect();
    loop {
        let mut probes: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (gi, b) in bounds.iter_mut().enumerate() {
            if let Some((n, hinted)) = b.next(top) {
                b.hinted = hinted;
                probes.entry(n).or_default().push(gi);
            }
        }
        if probes.is_empty() {
            break;
        }
        for simulated in search.simulate_each(&probes, streams, parallel)? {
            for &(gi, run, ran_out, _) in &simulated.runs {
                if let Some(b) = bounds.get_mut(gi) {
                    b.learn(simulated.new_tokens, run, ran_out);
                }
            }
            search.keep(simulated);
        }
    }
    let gpus = search
        .presets
        .iter()
        .zip(&bounds)
        .map(|(preset, b)| {
            let found = found(b, memory_bound, capped, limit.is_some());
            let max = b.fits.map(u64::from);
            GpuContext {
                preset: preset.clone(),
                max_new_tokens: max,
                max_context_tokens: max.and_then(|m| generation.prompt_tokens.map(|p| p + m)),
                found,
                runs_out_at: b.runs_out.map(|(hi, _)| u64::from(hi)),
                shown_by: b.runs_out.and_then(|(hi, by)| (by != hi).then_some(by)),
            }
        })
        .collect();
    Ok(ContextSweep {
        schema: SCHEMA.to_owned(),
        reference_gpu: search.reference_gpu,
        prompt_tokens: generation.prompt_tokens,
        traced_new_tokens: traced,
        traced_peak: traced_point.peak,
        budget_new_tokens: top,
        position_limit: limit.as_ref().map(|(n, _)| *n),
        position_limit_from: limit.map(|(_, from)| from),
        points: search.points.into_values().collect(),
        gpus,
        warnings: search.warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::EventKind::{Alloc, Free};
    use crate::program::Program;
    use crate::units::Bytes;

    fn run(fits: bool) -> AtCapacity {
        AtCapacity {
            fits,
            peak_total_bytes: Bytes(1),
        }
    }

    /// A GPU that still fits at the top length fits at least that many, for
    /// what stopped the search there: the memory budget, then memcast's
    /// most new tokens (a position limit past it is not reached).
    #[test]
    fn a_gpu_that_fits_at_the_top_says_what_the_top_was() {
        let fits = Bounds {
            fits: Some(131_072),
            ..Bounds::default()
        };
        assert_eq!(found(&fits, true, true, true), Found::MemoryBudget);
        assert_eq!(found(&fits, false, true, true), Found::MostNewTokens);
        assert_eq!(found(&fits, false, true, false), Found::MostNewTokens);
        assert_eq!(found(&fits, false, false, true), Found::PositionLimit);
        assert_eq!(found(&fits, false, false, false), Found::NoLimitInTrace);
        let runs_out = Some((40_000, 131_072));
        assert_eq!(
            found(&Bounds { runs_out, ..fits }, false, true, true),
            Found::Simulated
        );
        assert_eq!(
            found(&Bounds::default(), false, true, true),
            Found::DoesNotFit
        );
    }

    /// Running out in the first run of steps bounds every longer length
    /// (before the steps: every length); in a later run it only hints;
    /// after the steps it says nothing.
    #[test]
    fn running_out_in_the_first_steps_bounds_every_longer_length() {
        let prefix = [(Alloc, 1 << 20), (Alloc, 4096)];
        let body = [(Alloc, 4096, 512), (Free, 1, 0)];
        // 20 new tokens, 12 of them the run's steps: 8 before it.
        let program = Program::of_events(&prefix, &body, 12, &[(Free, 30)]);
        let job = JobRef::Program(&program);
        let step_5 = 2 + 5 * 2 + 1;
        assert_eq!(
            RanOut::of(job, 20, step_5),
            RanOut {
                bound: Some(8 + 5 + 1),
                hint: Some(8 + 5)
            }
        );
        assert_eq!(
            RanOut::of(job, 20, 1),
            RanOut {
                bound: Some(8),
                hint: None
            }
        );
        assert_eq!(RanOut::of(job, 20, 2 + 24), RanOut::default());
    }

    /// The budget first; a bound from the first call closes the search in
    /// one more try; hints and the middle take turns; an inconsistent
    /// bound (below a length that fits) is not believed.
    #[test]
    fn a_search_tries_the_top_then_hints_and_halves_in_turn() {
        let mut b = Bounds {
            fits: Some(16),
            ..Bounds::default()
        };
        assert_eq!(b.next(512), Some((512, false)));
        b.learn(
            512,
            run(false),
            RanOut {
                bound: Some(300),
                hint: Some(299),
            },
        );
        assert_eq!(b.runs_out, Some((300, 512)));
        assert_eq!(b.next(512), Some((299, true)));
        b.hinted = true;
        b.learn(299, run(true), RanOut::default());
        assert_eq!(b.next(512), None);

        let mut b = Bounds {
            fits: Some(16),
            ..Bounds::default()
        };
        b.learn(
            512,
            run(false),
            RanOut {
                bound: None,
                hint: Some(400),
            },
        );
        assert_eq!(b.next(512), Some((400, true)));
        b.hinted = true;
        b.learn(
            400,
            run(false),
            RanOut {
                bound: None,
                hint: Some(390),
            },
        );
        // A hint that did not close it: the middle next, then the hint.
        assert_eq!(b.next(512), Some((208, false)));
        b.hinted = false;
        b.learn(208, run(true), RanOut::default());
        assert_eq!(b.next(512), Some((390, true)));
        // A bound below what fits says nothing.
        b.learn(
            390,
            run(false),
            RanOut {
                bound: Some(100),
                hint: None,
            },
        );
        assert_eq!(b.runs_out, Some((390, 390)));

        let fits_top = Bounds {
            fits: Some(512),
            ..Bounds::default()
        };
        assert_eq!(fits_top.next(512), None);
        assert_eq!(Bounds::default().next(512), None);
    }
}
