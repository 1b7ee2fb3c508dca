//! A rebuilt job as a [`Program`] (issue 33): the job that `--layers` and
//! `--new-tokens` ask for is described once, from the same job rebuilt at
//! four small counts of copies per dimension it grows in, and streamed to
//! the simulator, so its memory is bounded by the trace, not by the job.
//!
//! The small rebuilds go through the stages as any trace does (the copy
//! engine, the analyzer, the orchestrator's rules): shapes, lifetimes,
//! categories, parameters and rules are decided on their events, and
//! [`crate::program`] finds how each copy adds to the schedule and to the
//! facts the report repeats, checked on all four (or sixteen). A job that
//! does not grow copy by copy that way is built whole, as before; so is
//! one with few copies (nothing to gain), and the autocast what-if's job.

use super::{prepare_trace, Config, Error, Prepared, Progress, Stage};
use crate::diag::Warning;
use crate::program::{grown_text, Dim, Grid, Program};
use crate::scale::{self, Target};
use crate::trace::Trace;

/// Decode steps past the traced ones in the shortest rebuild a program is
/// derived from.
const FIRST: u32 = 1;

/// The rebuilds of a program: four counts of decode steps.
const COUNTS: u32 = 4;

/// The job `config.scale` asks for of `traces` as a program, when it adds
/// more copies than the rebuilds it is derived from and building it whole
/// is the larger work (`None`: build it whole). Errors are the rebuild's:
/// a rebuild that fails for one of the small counts fails for the job.
pub(super) fn prepare(
    traces: &[Trace],
    warnings: &[Warning],
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> Result<Option<Prepared>, Error> {
    let target = config.scale;
    if config.materialize {
        return Ok(None);
    }
    scale::validate(&target)?;
    let Some(first) = traces.first() else {
        return Ok(None);
    };
    let Some(traced) = scale::traced_new_tokens(first) else {
        return Ok(None);
    };
    let Some(asked) = target.new_tokens.filter(|&n| n >= traced + FIRST + COUNTS) else {
        return Ok(None);
    };
    // Only where building the job whole is the larger work: the rebuilds
    // take about as long per event as the whole job would.
    let counts = scale::work::Counts::of(first);
    let events = |tokens: u32| {
        let layers = target.layers.unwrap_or(counts.layers);
        scale::work::estimate(&counts, layers, tokens, config.work_budget()).events
    };
    let rebuilds = (0..COUNTS)
        .map(|t| events(traced + FIRST + t))
        .fold(0u64, u64::saturating_add);
    if events(asked) <= rebuilds {
        return Ok(None);
    }
    let Some(derived) = Derivation::of(traces, warnings, config, progress)? else {
        return Ok(None);
    };
    Ok(derived.prepared(asked))
}

/// A generation's job at any number of new tokens, derived once from four
/// short rebuilds at the depth `config.scale` asks for ([`Derivation::of`]),
/// then made at each length without rebuilding ([`Derivation::prepared`]):
/// what a search over lengths (`whatif context`) reuses.
#[derive(Debug, Clone)]
pub struct Derivation {
    /// New tokens of the traced generation.
    traced: u32,
    /// The facts of the four rebuilds as JSON, grown to each length.
    texts: Grid<String>,
    /// The events, at the first rebuild's length.
    program: Program,
}

impl Derivation {
    /// Derives the generation of `traces` at the depth `config.scale` asks
    /// for (its number of new tokens left aside); `None` where the trace is
    /// no generation or its decode steps do not grow step by step.
    pub fn of(
        traces: &[Trace],
        warnings: &[Warning],
        config: &Config,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Option<Derivation>, Error> {
        // The mixed-precision what-if's job is not derived: it is not made.
        let mut config = config.clone();
        config.orchestrator.autocast.what_if = false;
        let config = &config;
        let Some(first) = traces.first() else {
            return Ok(None);
        };
        // Each rebuild is at the depth asked for: a decode step holds one
        // call of every block, so the steps' growth is found on the job's
        // own blocks.
        let Some(traced) = scale::traced_new_tokens(first) else {
            return Ok(None);
        };
        let budget = config.work_budget();
        let mut rebuilt = Vec::with_capacity(COUNTS as usize);
        for t in 0..COUNTS {
            progress(Progress {
                stage: Stage::Rebuilding,
                done: u64::from(t),
                total: u64::from(COUNTS),
            });
            let cell = Target {
                new_tokens: Some(traced + FIRST + t),
                ..config.scale
            };
            let scaled = scale::scale_within(traces, &cell, budget)?;
            let mut w = warnings.to_vec();
            w.extend(scaled.warnings);
            let (trace, facts) = scaled.value;
            rebuilt.push(prepare_trace(&trace, facts, w, config, &mut |_| {})?);
        }
        progress(Progress {
            stage: Stage::Orchestrating,
            done: 0,
            total: 1,
        });
        let Ok(four) = <[&Prepared; 4]>::try_from(rebuilt.iter().collect::<Vec<_>>()) else {
            return Ok(None);
        };
        let grid = Grid {
            dim: Dim::Tokens,
            at: four,
        };
        // The facts: every field but the events.
        let texts = grid.map(|p| {
            let mut facts = Prepared::clone(p);
            facts.orchestrated.schedule.blocks.clear();
            facts.orchestrated.schedule.events.clear();
            facts.autocast = None;
            serde_json::to_string(&facts).unwrap_or_default()
        });
        let schedules = grid.map(|p| &p.orchestrated.schedule);
        let Some(program) = Program::derive(&schedules) else {
            return Ok(None);
        };
        let derived = Derivation {
            traced,
            texts,
            program,
        };
        // Checked where it is known: the first rebuild's facts.
        Ok(derived.grown(0).is_some().then_some(derived))
    }

    /// The fewest new tokens it makes (the first rebuild's).
    pub fn first_tokens(&self) -> u32 {
        self.traced + FIRST
    }

    /// The facts at `extra` decode steps past the first rebuild.
    fn grown(&self, extra: i64) -> Option<Prepared> {
        let text = grown_text(&self.texts, [0, extra])?;
        serde_json::from_str::<Prepared>(&text).ok()
    }

    /// The job with `new_tokens` new tokens (at least
    /// [`Derivation::first_tokens`]), streamed; `None` where its facts do
    /// not grow so far.
    pub fn prepared(&self, new_tokens: u32) -> Option<Prepared> {
        let extra = i64::from(new_tokens.checked_sub(self.first_tokens())?);
        let mut prepared = self.grown(extra)?;
        let program = self.program.at([0, extra], &prepared.orchestrated.schedule);
        prepared.program = Some(Box::new(program));
        Some(prepared)
    }
}
