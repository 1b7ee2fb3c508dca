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

/// Copies of a dimension in the smallest rebuild a program is derived from.
const FIRST: u32 = 1;

/// The rebuilds of a program: four counts of decode steps.
const COUNTS: u32 = 4;

/// The job `config.scale` asks for of `traces` as a program, when it adds
/// more copies than the rebuilds it is derived from (`None`: build it
/// whole). Errors are the rebuild's: a rebuild that fails for one of the
/// small counts fails for the job.
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
    // The mixed-precision what-if's job is not derived: it is not made.
    let mut config = config.clone();
    config.orchestrator.autocast.what_if = false;
    let config = &config;
    scale::validate(&target)?;
    let Some(first) = traces.first() else {
        return Ok(None);
    };
    // The decode steps a generation adds, when past the rebuilds'. Each
    // rebuild is at the depth asked for: a decode step holds one call of
    // every block, so the steps' growth is found on the job's own blocks.
    let Some(traced) = scale::traced_new_tokens(first) else {
        return Ok(None);
    };
    let Some(copies) = target
        .new_tokens
        .and_then(|n| n.checked_sub(traced))
        .filter(|&k| k >= FIRST + COUNTS)
    else {
        return Ok(None);
    };
    let budget = config.work_budget();
    let cells: Vec<Target> = (0..COUNTS)
        .map(|t| Target {
            new_tokens: Some(traced + FIRST + t),
            ..target
        })
        .collect();
    // Only where building the job whole is the larger work: the rebuilds
    // take about as long per event as the whole job would.
    let counts = scale::work::Counts::of(first);
    let events = |t: &Target| {
        let layers = t.layers.unwrap_or(counts.layers);
        let tokens = t.new_tokens.unwrap_or(counts.tokens);
        scale::work::estimate(&counts, layers, tokens, budget).events
    };
    let rebuilds = cells.iter().map(events).fold(0u64, u64::saturating_add);
    if events(&target) <= rebuilds {
        return Ok(None);
    }
    let total = cells.len() as u64;
    let mut rebuilt = Vec::with_capacity(cells.len());
    for (done, cell) in cells.iter().enumerate() {
        progress(Progress {
            stage: Stage::Rebuilding,
            done: done as u64,
            total,
        });
        let scaled = scale::scale_within(traces, cell, budget)?;
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
    let grid = Grid::One(Dim::Tokens, four);
    let extra = [0, i64::from(copies - FIRST)];
    // The facts: every field but the events, grown to the job.
    let texts = grid.map(|p| {
        let mut facts = Prepared::clone(p);
        facts.orchestrated.schedule.blocks.clear();
        facts.orchestrated.schedule.events.clear();
        facts.autocast = None;
        serde_json::to_string(&facts).unwrap_or_default()
    });
    let Some(text) = grown_text(&texts, extra) else {
        return Ok(None);
    };
    let Ok(mut prepared) = serde_json::from_str::<Prepared>(&text) else {
        return Ok(None);
    };
    let schedules = grid.map(|p| &p.orchestrated.schedule);
    let schedule = &prepared.orchestrated.schedule;
    let Some(program) = Program::derive(&schedules, extra, schedule) else {
        return Ok(None);
    };
    prepared.program = Some(Box::new(program));
    Ok(Some(prepared))
}
