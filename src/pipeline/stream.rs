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

/// The rebuilds of a program: four counts per dimension grown.
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
    // The copies each dimension adds, when past the rebuilds'.
    let grows = |asked: Option<u32>, traced: Option<u32>| -> Option<(u32, u32)> {
        let (asked, traced) = (asked?, traced?);
        let copies = asked.checked_sub(traced)?;
        (copies >= FIRST + COUNTS).then_some((traced, copies))
    };
    let depth = target
        .layers
        .and_then(|l| grows(Some(l), scale::inspect(first).layers));
    let tokens = target
        .new_tokens
        .and_then(|n| grows(Some(n), scale::traced_new_tokens(first)));
    #[allow(clippy::print_stderr)]
    { eprintln!("DEBUG dims {depth:?} {tokens:?}"); }
    if depth.is_none() && tokens.is_none() {
        return Ok(None);
    }
    // The target at the d-th and t-th small counts.
    let at = |d: u32, t: u32| Target {
        layers: match depth {
            Some((traced, _)) => Some(traced + FIRST + d),
            None => target.layers,
        },
        new_tokens: match tokens {
            Some((traced, _)) => Some(traced + FIRST + t),
            None => target.new_tokens,
        },
        ..target
    };
    let cells: Vec<(u32, u32)> = match (depth, tokens) {
        (Some(_), Some(_)) => (0..COUNTS)
            .flat_map(|d| (0..COUNTS).map(move |t| (d, t)))
            .collect(),
        (Some(_), None) => (0..COUNTS).map(|d| (d, 0)).collect(),
        _ => (0..COUNTS).map(|t| (0, t)).collect(),
    };
    let total = cells.len() as u64;
    let mut rebuilt = Vec::with_capacity(cells.len());
    for (done, &(d, t)) in cells.iter().enumerate() {
        progress(Progress {
            stage: Stage::Analyzing,
            done: done as u64,
            total,
        });
        let scaled = scale::scale_many(traces, &at(d, t))?;
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
    let Some(grid) = grid_of(&rebuilt, depth.is_some(), tokens.is_some()) else {
        return Ok(None);
    };
    let extra = [
        depth.map_or(0, |(_, k)| i64::from(k - FIRST)),
        tokens.map_or(0, |(_, k)| i64::from(k - FIRST)),
    ];
    // The facts: every field but the events, grown to the job.
    let texts = grid.map(|p| {
        let mut facts = Prepared::clone(p);
        facts.orchestrated.schedule.blocks.clear();
        facts.orchestrated.schedule.events.clear();
        facts.autocast = None;
        serde_json::to_string(&facts).unwrap_or_default()
    });
    let Some(text) = grown_text(&texts, extra) else {
        #[allow(clippy::print_stderr)]
        { eprintln!("DEBUG facts failed"); }
        return Ok(None);
    };
    let Ok(mut prepared) = serde_json::from_str::<Prepared>(&text) else {
        #[allow(clippy::print_stderr)]
        { eprintln!("DEBUG json failed"); }
        return Ok(None);
    };
    let schedules = grid.map(|p| &p.orchestrated.schedule);
    let schedule = &prepared.orchestrated.schedule;
    let Some(program) = Program::derive(
        &schedules,
        extra,
        schedule.iterations.clone(),
        schedule.phases.clone(),
    ) else {
        #[allow(clippy::print_stderr)]
        { eprintln!("DEBUG program failed"); }
        return Ok(None);
    };
    prepared.program = Some(Box::new(program));
    Ok(Some(prepared))
}

/// The rebuilds as a grid: four by four (depth by tokens), or four of the
/// dimension grown.
fn grid_of(cells: &[Prepared], depth: bool, tokens: bool) -> Option<Grid<&Prepared>> {
    fn four(cells: &[Prepared]) -> Option<[&Prepared; 4]> {
        cells.iter().collect::<Vec<_>>().try_into().ok()
    }
    Some(match (depth, tokens) {
        (true, true) => {
            let rows = cells
                .chunks(COUNTS as usize)
                .map(four)
                .collect::<Option<Vec<_>>>()?;
            Grid::Two(rows.try_into().ok()?)
        }
        (true, false) => Grid::One(Dim::Depth, four(cells)?),
        _ => Grid::One(Dim::Tokens, four(cells)?),
    })
}
