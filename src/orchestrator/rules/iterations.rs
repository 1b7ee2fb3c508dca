//! Rule `iterations`: which captured iteration each simulated iteration
//! repeats, and where the copies go on the schedule's clock; the phase
//! windows and iteration spans of the simulated run.

use crate::analyzer::{Analysis, Block};
use crate::diag::Warning;
use crate::orchestrator::schedule::{IterationSpan, PhaseWindow};
use crate::units::Nanos;

/// One simulated iteration: the captured iteration it repeats, shifted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IterationCopy {
    /// Its index among the simulated iterations.
    pub simulated: u32,
    /// The captured iteration it repeats.
    pub source: usize,
    /// How far it is shifted from the captured one.
    pub offset: Nanos,
}

/// The captured iteration that is repeated and its period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Repeated {
    pub source: usize,
    pub period: Nanos,
}

/// The simulated iterations: which captured iteration each repeats, and the
/// time shift of the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct IterationPlan {
    pub copies: Vec<IterationCopy>,
    /// Blocks allocated at or after this time are not simulated (fewer
    /// iterations than captured).
    pub cut: Option<Nanos>,
    pub repeated: Option<Repeated>,
}

/// Rule `iterations`: plans `wanted` iterations from the captured ones.
/// Repeating needs two captured steady-state iterations (the last two) with
/// the same allocation sizes in the same order; otherwise only the captured
/// iterations are simulated.
pub(super) fn plan_iterations(
    analysis: &Analysis,
    wanted: u32,
    warnings: &mut Vec<Warning>,
) -> IterationPlan {
    let captured = analysis.iterations.len();
    let wanted_usize = wanted as usize;
    let mut copies: Vec<IterationCopy> = (0..captured.min(wanted_usize))
        .map(|i| IterationCopy {
            simulated: i as u32,
            source: i,
            offset: Nanos::ZERO,
        })
        .collect();
    if wanted_usize <= captured {
        let cut = analysis.iterations.get(wanted_usize).map(|it| it.start);
        return IterationPlan {
            copies,
            cut,
            repeated: None,
        };
    }
    let steady = captured
        .checked_sub(1)
        .zip(captured.checked_sub(2))
        .filter(|&(last, previous)| previous >= 1 && same_allocations(analysis, previous, last));
    let Some((last, previous)) = steady else {
        if captured > 0 {
            warnings.push(Warning::new(
                "iterations_not_repeated",
                format!(
                    "{wanted} iterations were asked for but the trace has {captured} and no two steady-state iterations that match, so only the captured ones are simulated; profile at least 3 iterations"
                ),
            ));
        }
        return IterationPlan {
            copies,
            cut: None,
            repeated: None,
        };
    };
    let (Some(last_it), Some(previous_it)) = (
        analysis.iterations.get(last),
        analysis.iterations.get(previous),
    ) else {
        return IterationPlan {
            copies,
            cut: None,
            repeated: None,
        };
    };
    // Copies follow each other without overlap: the repeated iteration's
    // length plus the gap that separated it from the one before.
    let gap = last_it.start.saturating_sub(previous_it.end).max(Nanos(1));
    let period = last_it
        .end
        .saturating_sub(last_it.start)
        .saturating_add(gap);
    for k in 1..=(wanted_usize - captured) {
        copies.push(IterationCopy {
            simulated: (last + k) as u32,
            source: last,
            offset: Nanos(period.get().saturating_mul(k as i64)),
        });
    }
    warnings.push(Warning::new(
        "iterations_repeated",
        format!(
            "{captured} iterations were captured; iterations {captured} to {} repeat captured iteration {last}",
            wanted - 1
        ),
    ));
    IterationPlan {
        copies,
        cut: None,
        repeated: Some(Repeated {
            source: last,
            period,
        }),
    }
}

/// The blocks allocated in a captured iteration, in trace order.
pub(super) fn allocations_of(analysis: &Analysis, iteration: usize) -> Vec<&Block> {
    analysis
        .blocks
        .iter()
        .filter(|b| b.alloc_iteration == Some(iteration))
        .collect()
}

fn same_allocations(analysis: &Analysis, a: usize, b: usize) -> bool {
    let first = allocations_of(analysis, a);
    let second = allocations_of(analysis, b);
    first.len() == second.len()
        && !first.is_empty()
        && first.iter().zip(&second).all(|(x, y)| x.size == y.size)
}

/// The phase windows of every simulated iteration on the schedule's clock,
/// by start time (then iteration).
pub(super) fn phase_windows(analysis: &Analysis, plan: &IterationPlan) -> Vec<PhaseWindow> {
    let mut out = Vec::new();
    for copy in &plan.copies {
        let Some(iteration) = analysis.iterations.get(copy.source) else {
            continue;
        };
        for span in &iteration.phases {
            out.push(PhaseWindow {
                iteration: copy.simulated,
                phase: span.phase,
                start: span.start.saturating_add(copy.offset),
                end: span.end.saturating_add(copy.offset),
            });
        }
    }
    out.sort_by_key(|w| (w.start, w.iteration));
    out
}

/// The simulated iterations' spans on the schedule's clock.
pub(super) fn iteration_spans(analysis: &Analysis, plan: &IterationPlan) -> Vec<IterationSpan> {
    plan.copies
        .iter()
        .filter_map(|copy| {
            let it = analysis.iterations.get(copy.source)?;
            Some(IterationSpan {
                index: copy.simulated,
                source: copy.source as u32,
                start: it.start.saturating_add(copy.offset),
                end: it.end.saturating_add(copy.offset),
            })
        })
        .collect()
}
