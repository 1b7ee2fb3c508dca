//! A rebuilt job as a [`Program`] (issue 33): the job that `--layers` and
//! `--new-tokens` ask for is described once, from the same job rebuilt at
//! four small counts of copies of the dimension it grows in, and streamed
//! to the simulator, so its memory is bounded by the trace, not by the job.
//!
//! The small rebuilds go through the stages as any trace does (the copy
//! engine, the analyzer, the orchestrator's rules): shapes, lifetimes,
//! categories, parameters and rules are decided on their events, and
//! [`crate::program`] finds how each copy adds to the schedule and to the
//! facts the report repeats, checked on all four.
//!
//! - A generation asked for more decode steps is derived in its steps, from
//!   four rebuilds at the depth asked for. Where that depth is itself far
//!   past the traced one, each of the four is made from a derivation in
//!   depth at its length (four rebuilds of a few blocks each) and held
//!   whole: sixteen small rebuilds instead of four deep ones.
//! - A job asked for more blocks only (training, a forward, a generation
//!   at its traced length) is derived in depth; the autocast what-if's job
//!   is derived beside it and held whole.
//!
//! A job that does not grow copy by copy that way is built whole, as
//! before; so is one with few copies (nothing to gain), and the autocast
//! what-if's job of a streamed generation.

use super::{prepare_trace, Config, Error, Parallel, Prepared, Progress, Stage};
use crate::diag::Warning;
use crate::orchestrator::{ScheduleEvent, ScheduledBlock};
use crate::program::{grown_text, Dim, Grid, Program};
use crate::scale::{self, work::Counts, Target};
use crate::trace::Trace;

/// Copies past the traced ones in the smallest rebuild a program is
/// derived from (decode steps, blocks per stack).
const FIRST: u32 = 1;

/// The rebuilds of a program: four consecutive counts.
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
    parallel: &dyn Parallel,
) -> Result<Option<Prepared>, Error> {
    let target = config.scale;
    if config.materialize {
        return Ok(None);
    }
    scale::validate(&target)?;
    let Some(first) = traces.first() else {
        return Ok(None);
    };
    let counts = scale::count(traces, &target);
    let layers = target.layers.unwrap_or(counts.layers);
    let tokens = target.new_tokens.unwrap_or(counts.tokens);
    // Only where building the job whole is the larger work: the rebuilds
    // take about as long per event as the whole job would.
    let events = |layers: u32, tokens: u32| {
        scale::work::estimate(&counts, layers, tokens, config.work_budget()).events
    };
    let rebuilds = |cell: &dyn Fn(u32) -> (u32, u32)| {
        (0..COUNTS)
            .map(|t| {
                let (l, n) = cell(t);
                events(l, n)
            })
            .fold(0u64, u64::saturating_add)
    };
    if let Some(traced) = scale::traced_new_tokens(first) {
        if let Some(asked) = target.new_tokens.filter(|&n| n >= traced + FIRST + COUNTS) {
            if events(layers, asked) <= rebuilds(&|t| (layers, traced + FIRST + t)) {
                return Ok(None);
            }
            // The four steps' jobs are held whole at the depth asked for:
            // the longest must fit the budget as a rebuild would.
            let longest = Target {
                new_tokens: Some(traced + FIRST + COUNTS - 1),
                ..target
            };
            scale::work::check(&counts, &longest, config.work_budget()).map_err(|e| match e {
                scale::ScaleError::OverBudget {
                    needed,
                    budget,
                    fits,
                    ..
                } => scale::ScaleError::OverBudget {
                    asked: scale::work::describe(&target),
                    needed,
                    budget,
                    fits,
                },
                other => other,
            })?;
            let derived = Derivation::from_traces(
                traces,
                warnings,
                config,
                &counts,
                Dim::Tokens,
                progress,
                parallel,
            )?;
            return Ok(derived.and_then(|d| d.prepared(asked)));
        }
    }
    let Some(first_layers) = first_depth(&counts, layers) else {
        return Ok(None);
    };
    if events(layers, tokens) <= rebuilds(&|t| (first_layers + t, tokens)) {
        return Ok(None);
    }
    let derived = Derivation::from_traces(
        traces,
        warnings,
        config,
        &counts,
        Dim::Depth,
        progress,
        parallel,
    )?;
    Ok(derived.and_then(|d| d.prepared(layers)))
}

/// Blocks per stack of the smallest depth rebuild of a job of `layers`
/// blocks, where that is deep enough to be derived in depth.
fn first_depth(counts: &Counts, layers: u32) -> Option<u32> {
    let first = counts.layers.checked_add(FIRST)?;
    (counts.layers > 0 && layers >= first.checked_add(COUNTS)?).then_some(first)
}

/// A job at any number of copies of one dimension (new tokens or blocks
/// per stack), derived once from four rebuilds at small counts
/// ([`Derivation::of`]), then made at each count without rebuilding
/// ([`Derivation::prepared`]): what a search over lengths (`whatif
/// context`) reuses.
#[derive(Debug, Clone)]
pub struct Derivation {
    dim: Dim,
    /// The count of the first rebuild.
    first: u32,
    /// The facts of the four rebuilds as JSON, grown to each count.
    texts: Grid<String>,
    /// The events, at the first rebuild's count.
    program: Program,
    /// The autocast what-if's events, where that job was made (a job
    /// derived in depth, for a config that asks for it).
    autocast: Option<Program>,
}

impl Derivation {
    /// Derives the generation of `traces` in its decode steps, at the
    /// depth `config.scale` asks for (its number of new tokens left
    /// aside); `None` where the trace is no generation or its decode steps
    /// do not grow step by step.
    pub fn of(
        traces: &[Trace],
        warnings: &[Warning],
        config: &Config,
        progress: &mut dyn FnMut(Progress),
        parallel: &dyn Parallel,
    ) -> Result<Option<Derivation>, Error> {
        if traces.is_empty() {
            return Ok(None);
        }
        let counts = scale::count(traces, &config.scale);
        Derivation::from_traces(
            traces,
            warnings,
            config,
            &counts,
            Dim::Tokens,
            progress,
            parallel,
        )
    }

    /// [`Derivation::in_dim`] with rebuilds of its own.
    fn from_traces(
        traces: &[Trace],
        warnings: &[Warning],
        config: &Config,
        counts: &Counts,
        dim: Dim,
        progress: &mut dyn FnMut(Progress),
        parallel: &dyn Parallel,
    ) -> Result<Option<Derivation>, Error> {
        let mut rebuilds = scale::Rebuilds::new(traces);
        Derivation::in_dim(
            &mut rebuilds,
            warnings,
            config,
            counts,
            dim,
            progress,
            parallel,
        )
    }

    /// Derives the job of `traces` that `config.scale` asks for in `dim`
    /// (that dimension's count left aside); `counts`: the work of the
    /// job ([`scale::count`]); `rebuilds`: the trace's rebuilds, which
    /// share what their targets share.
    fn in_dim(
        rebuilds: &mut scale::Rebuilds<'_>,
        warnings: &[Warning],
        config: &Config,
        counts: &Counts,
        dim: Dim,
        progress: &mut dyn FnMut(Progress),
        parallel: &dyn Parallel,
    ) -> Result<Option<Derivation>, Error> {
        let mut config = config.clone();
        // A generation's mixed-precision what-if job is not derived: it is
        // not made. A job derived in depth makes it beside its own.
        if dim == Dim::Tokens {
            config.orchestrator.autocast.what_if = false;
        }
        let config = &config;
        let Some(trace) = rebuilds.traces().first() else {
            return Ok(None);
        };
        let first = match dim {
            // Each rebuild is at the depth asked for: a decode step holds
            // one call of every block, so the steps' growth is found on
            // the job's own blocks.
            Dim::Tokens => match scale::traced_new_tokens(trace) {
                Some(traced) => traced + FIRST,
                None => return Ok(None),
            },
            Dim::Depth => match counts.layers {
                0 => return Ok(None),
                traced => traced + FIRST,
            },
        };
        let cells: Vec<Target> = (0..COUNTS)
            .map(|t| at_count(config.scale, dim, first + t))
            .collect();
        let rebuilt = match dim {
            // Each step count's job is a derivation in depth of its own.
            Dim::Tokens => held_whole(
                rebuilds, warnings, config, counts, &cells, progress, parallel,
            )?,
            Dim::Depth => rebuild_all(
                rebuilds, warnings, config, counts, &cells, progress, parallel,
            )?,
        };
        progress(Progress {
            stage: Stage::Orchestrating,
            done: 0,
            total: 1,
        });
        Ok(Derivation::from_rebuilt(dim, first, rebuilt))
    }

    /// The derivation from the four rebuilds at `first` copies and the
    /// three after; `None` where it does not hold.
    fn from_rebuilt(dim: Dim, first: u32, rebuilt: Vec<Prepared>) -> Option<Derivation> {
        // The facts: every field but the events (the what-if job's too).
        let mut rebuilt = rebuilt;
        let texts =
            <[String; 4]>::try_from(rebuilt.iter_mut().map(facts_text).collect::<Vec<_>>()).ok()?;
        let texts = Grid { dim, at: texts };
        let four = <[&Prepared; 4]>::try_from(rebuilt.iter().collect::<Vec<_>>()).ok()?;
        let grid = Grid { dim, at: four };
        let schedules = grid.map(|p| &p.orchestrated.schedule);
        let program = Program::derive(&schedules)?;
        let autocast = match grid.at.each_ref().map(|p| p.autocast.as_deref()) {
            [Some(a), Some(b), Some(c), Some(d)] => {
                let schedules = Grid {
                    dim,
                    at: [&a.schedule, &b.schedule, &c.schedule, &d.schedule],
                };
                Some(Program::derive(&schedules)?)
            }
            [None, None, None, None] => None,
            _ => return None,
        };
        let derived = Derivation {
            dim,
            first,
            texts,
            program,
            autocast,
        };
        // Checked where it is known: the first rebuild's facts.
        derived.grown(0).is_some().then_some(derived)
    }

    /// The fewest new tokens (or blocks) it makes (the first rebuild's).
    pub fn first_tokens(&self) -> u32 {
        self.first
    }

    /// The copies added per dimension at `extra` past the first rebuild.
    fn extra(&self, extra: i64) -> [i64; 2] {
        match self.dim {
            Dim::Depth => [extra, 0],
            Dim::Tokens => [0, extra],
        }
    }

    /// The facts at `extra` copies past the first rebuild.
    fn grown(&self, extra: i64) -> Option<Prepared> {
        let text = grown_text(&self.texts, self.extra(extra))?;
        serde_json::from_str::<Prepared>(&text).ok()
    }

    /// The job with `count` new tokens (or blocks per stack; at least
    /// [`Derivation::first_tokens`]), streamed; `None` where its facts do
    /// not grow so far. The what-if's job is held whole.
    pub fn prepared(&self, count: u32) -> Option<Prepared> {
        let added = i64::from(count.checked_sub(self.first)?);
        let extra = self.extra(added);
        let mut prepared = self.grown(added)?;
        let program = self.program.at(extra, &prepared.orchestrated.schedule);
        if let (Some(autocast), Some(job)) = (&self.autocast, prepared.autocast.as_deref_mut()) {
            job.schedule = autocast.at(extra, &job.schedule).schedule()?;
        }
        prepared.program = Some(Box::new(program));
        Some(prepared)
    }
}

/// A rebuild's facts as JSON: every field but its schedule's blocks and
/// events (the what-if job's too), which are set aside while it is
/// written, not copied.
fn facts_text(p: &mut Prepared) -> String {
    fn set_aside(
        o: &mut crate::orchestrator::Orchestrated,
    ) -> (Vec<ScheduledBlock>, Vec<ScheduleEvent>) {
        (
            std::mem::take(&mut o.schedule.blocks),
            std::mem::take(&mut o.schedule.events),
        )
    }
    fn put_back(
        o: &mut crate::orchestrator::Orchestrated,
        (blocks, events): (Vec<ScheduledBlock>, Vec<ScheduleEvent>),
    ) {
        o.schedule.blocks = blocks;
        o.schedule.events = events;
    }
    let own = set_aside(&mut p.orchestrated);
    let autocast = p.autocast.as_deref_mut().map(set_aside);
    let text = serde_json::to_string(&*p).unwrap_or_default();
    put_back(&mut p.orchestrated, own);
    if let (Some(job), Some(parts)) = (p.autocast.as_deref_mut(), autocast) {
        put_back(job, parts);
    }
    text
}

/// `scale` with `count` copies of `dim`.
fn at_count(scale: Target, dim: Dim, count: u32) -> Target {
    match dim {
        Dim::Depth => Target {
            layers: Some(count),
            ..scale
        },
        Dim::Tokens => Target {
            new_tokens: Some(count),
            ..scale
        },
    }
}

/// The job at `cell` rebuilt as a trace and prepared.
fn rebuild(
    rebuilds: &mut scale::Rebuilds<'_>,
    warnings: &[Warning],
    config: &Config,
    counts: &Counts,
    cell: Target,
) -> Result<Prepared, Error> {
    let scaled = rebuilds.rebuild(&cell, config.work_budget(), counts)?;
    let mut w = warnings.to_vec();
    w.extend(scaled.warnings);
    let (trace, facts) = scaled.value;
    prepare_trace(&trace, facts, w, config, &mut |_| {})
}

/// The jobs at `cells` rebuilt and prepared, in order: what they share
/// made first (each depth's deeper trace side by side), then each rebuild
/// a task of its own. An error is the first cell's in order.
fn rebuild_all(
    rebuilds: &mut scale::Rebuilds<'_>,
    warnings: &[Warning],
    config: &Config,
    counts: &Counts,
    cells: &[Target],
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Vec<Prepared>, Error> {
    let total = cells.len() as u64;
    let mut told = |done: usize| {
        progress(Progress {
            stage: Stage::Rebuilding,
            done: done as u64,
            total,
        })
    };
    told(0);
    rebuilds.warm(cells, config.work_budget(), counts, |wanted| {
        side_by_side(
            parallel,
            wanted.iter().collect(),
            &|d| d.make(),
            &mut |_| {},
        )
    })?;
    let shared = &*rebuilds;
    let made = side_by_side(
        parallel,
        cells.iter().collect(),
        &|cell| rebuild(&mut shared.clone(), warnings, config, counts, *cell),
        &mut told,
    );
    made.into_iter().collect()
}

/// The jobs at `cells` (decode step counts), their schedules held whole:
/// from a derivation in depth where they are that much deeper than the
/// trace and the derivation holds, else rebuilt. The sixteen rebuilds of
/// the four derivations run as one set of tasks, then the derivations.
fn held_whole(
    rebuilds: &mut scale::Rebuilds<'_>,
    warnings: &[Warning],
    config: &Config,
    counts: &Counts,
    cells: &[Target],
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Vec<Prepared>, Error> {
    // Every cell is at the depth asked for (they differ in steps only).
    let deep = cells
        .first()
        .and_then(|cell| cell.layers)
        .and_then(|layers| first_depth(counts, layers).map(|first| (first, layers)));
    let mut derived: Vec<Option<Prepared>> = match deep {
        Some((first, layers)) => {
            let depth_cells: Vec<Target> = cells
                .iter()
                .flat_map(|cell| (0..COUNTS).map(move |t| at_count(*cell, Dim::Depth, first + t)))
                .collect();
            let mut rebuilt = rebuild_all(
                rebuilds,
                warnings,
                config,
                counts,
                &depth_cells,
                progress,
                parallel,
            )?
            .into_iter();
            let fours: Vec<Vec<Prepared>> = (0..cells.len())
                .map(|_| rebuilt.by_ref().take(COUNTS as usize).collect())
                .collect();
            side_by_side(
                parallel,
                fours,
                &|four| {
                    Derivation::from_rebuilt(Dim::Depth, first, four)
                        .and_then(|d| d.prepared(layers))
                        .and_then(Prepared::into_held_whole)
                },
                &mut |_| {},
            )
        }
        None => Vec::new(),
    };
    derived.resize_with(cells.len(), || None);
    let total = cells.len() as u64;
    cells
        .iter()
        .zip(derived)
        .enumerate()
        .map(|(t, (cell, made))| match made {
            Some(prepared) => Ok(prepared),
            // Not kept among the shared rebuilds: a job this deep is
            // held once.
            None => {
                progress(Progress {
                    stage: Stage::Rebuilding,
                    done: t as u64,
                    total,
                });
                rebuild(
                    &mut scale::Rebuilds::once(rebuilds.traces()),
                    warnings,
                    config,
                    counts,
                    *cell,
                )
            }
        })
        .collect()
}

/// `f` of each of `items`, in order, run as the shell's tasks (side by
/// side where it can; one it did not run is run here); `done(n)` as they
/// finish.
fn side_by_side<T: Send, R: Send>(
    parallel: &dyn Parallel,
    items: Vec<T>,
    f: &(dyn Fn(T) -> R + Sync),
    done: &mut dyn FnMut(usize),
) -> Vec<R> {
    let mut items: Vec<Option<T>> = items.into_iter().map(Some).collect();
    let mut slots: Vec<Option<R>> = items.iter().map(|_| None).collect();
    let tasks: Vec<super::Task<'_>> = items
        .iter_mut()
        .zip(slots.iter_mut())
        .map(|(item, slot)| {
            Box::new(move || {
                if let Some(item) = item.take() {
                    *slot = Some(f(item));
                }
            }) as super::Task<'_>
        })
        .collect();
    parallel.run_tasks(tasks, done);
    slots
        .into_iter()
        .zip(items)
        .filter_map(|(slot, item)| slot.or_else(|| item.map(f)))
        .collect()
}
