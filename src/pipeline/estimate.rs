//! The estimate: a prepared job simulated on the reference GPU (without a
//! capacity limit) and on every compared GPU at its capacity, then
//! reported; its runs at capacity made here, or some of them by another of
//! the shell's workers ([`estimate_split`], [`runs_at_capacity`],
//! [`Pending::finish`]), the report the same either way.

use super::runs::{self, InTurn, Parallel, Parting, Split};
use super::{Config, Error, Prepared, Progress, Stage};
use crate::diag::Warned;
use crate::report::{self, Report};

/// Simulates a prepared schedule on the reference GPU (without a capacity
/// limit) and on every GPU of `config` (at its capacity), and builds the report.
pub fn estimate(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> Result<Warned<Report>, Error> {
    estimate_with(prepared, config, progress, &InTurn)
}

/// Estimates like [`estimate`], running the simulations (the reference
/// GPU's and each GPU's) with `parallel`. The report does not depend on how
/// they were run.
pub fn estimate_with(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Warned<Report>, Error> {
    simulate_estimate(prepared, config, progress, parallel, None)?.finish(
        prepared,
        config,
        Vec::new(),
        progress,
    )
}

/// An estimate whose simulations are done here, but for the runs at
/// capacity handed elsewhere ([`estimate_split`]): [`Pending::finish`]
/// takes them and builds the report.
pub struct Pending {
    simulated: runs::Simulated,
    summary: report::RunSummary,
    elsewhere: Vec<usize>,
}

/// [`estimate_with`], where a shell with other workers may have some
/// compared GPUs' runs at capacity simulated there: once the unlimited
/// runs are done, `hand` is given each compared GPU whose run at capacity
/// is still to simulate, with the event it goes on alone from, and the
/// job's events ([`Split`]); the GPUs it returns are left out here, to be
/// simulated elsewhere with [`runs_at_capacity`] (the same runs) and given
/// to [`Pending::finish`].
pub fn estimate_split(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
    hand: Split<'_>,
) -> Result<Pending, Error> {
    simulate_estimate(prepared, config, progress, parallel, Some(hand))
}

/// An estimate's simulations, with `hand` where runs may go elsewhere.
fn simulate_estimate(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
    hand: Option<Split<'_>>,
) -> Result<Pending, Error> {
    let allocator = config.allocator()?;
    let summary = runs::summary(prepared, config);
    let simulated = runs::simulate_here(
        prepared, &summary, config, &allocator, progress, parallel, hand,
    );
    let elsewhere = simulated.elsewhere(config);
    Ok(Pending {
        simulated,
        summary,
        elsewhere,
    })
}

impl Pending {
    /// The compared GPUs (by index in the config) whose runs at capacity
    /// were handed elsewhere.
    pub fn elsewhere(&self) -> &[usize] {
        &self.elsewhere
    }

    /// The report, with the runs at capacity made elsewhere (by GPU index;
    /// an error where one handed elsewhere is missing).
    pub fn finish(
        self,
        prepared: &Prepared,
        config: &Config,
        given: Vec<(usize, report::SimulatedRun)>,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Warned<Report>, Error> {
        let runs = self.simulated.runs(config, given)?;
        progress(Progress::start(Stage::Reporting));
        let mut warnings = prepared.warnings.clone();
        warnings.extend(config.context_advice());
        let input = runs.report_input(prepared, config, self.summary, warnings);
        let report = report::build(&input)?;
        Ok(Warned {
            warnings: report.warnings.clone(),
            value: report,
        })
    }
}

/// The runs at capacity of the compared GPUs `gpus` (indices in the
/// config), for [`Pending::finish`]: each the run [`estimate`] gives that
/// GPU, the unlimited runs simulated only as far as one of them shares
/// them.
pub fn runs_at_capacity(
    prepared: &Prepared,
    config: &Config,
    gpus: &[usize],
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
) -> Result<Vec<(usize, report::SimulatedRun)>, Error> {
    let allocator = config.allocator()?;
    runs::simulate_only(prepared, config, &allocator, gpus, progress, parallel)
}

/// Which of the runs at capacity still to simulate ([`Split`]) a shell
/// with one other worker hands it, so that both finish about together:
/// none where they leave fewer than `min_events` events to simulate, or
/// only one run (the other worker would simulate its shared part again
/// for nothing). The other worker simulates the unlimited run again up to
/// where the last run it takes leaves it, then each run it takes; so it
/// takes the runs that leave the unlimited run first (each the longest
/// left), as many as keep its share of the events under this worker's.
/// A run that runs out of memory for certain stays here (it may stop soon
/// after it leaves; the other worker would simulate its shared part for
/// little), counted as nothing. A model of the work (events, each the same
/// cost), not a measurement.
pub fn share_with_one(partings: &[Parting], events: u64, min_events: u64) -> Vec<usize> {
    let partings: Vec<Parting> = partings.iter().filter(|p| !p.runs_out).copied().collect();
    let partings = &partings[..];
    let left = |p: &Parting| events.saturating_sub(p.from);
    let total = partings.iter().map(left).fold(0u64, u64::saturating_add);
    if partings.len() < 2 || total < min_events {
        return Vec::new();
    }
    let mut by_start: Vec<&Parting> = partings.iter().collect();
    by_start.sort_by_key(|p| (p.from, p.gpu));
    let mut best: Option<(u64, usize)> = None;
    let mut theirs = 0u64;
    for (k, p) in by_start.iter().enumerate().take(by_start.len() - 1) {
        theirs = theirs.saturating_add(left(p));
        let there = p.from.saturating_add(theirs);
        let here = total.saturating_sub(theirs);
        let longest = there.max(here);
        if best.is_none_or(|(b, _)| longest < b) {
            best = Some((longest, k + 1));
        }
    }
    match best {
        // Worth it only where it shortens the longest of the two.
        Some((longest, k)) if longest < total => by_start.iter().take(k).map(|p| p.gpu).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(gpu: usize, from: u64) -> Parting {
        Parting {
            gpu,
            from,
            runs_out: false,
        }
    }

    /// Six GPUs of a generation whose cache grows (events in percent of
    /// the job's): the two that leave first go (the other worker shares
    /// the unlimited run to 36, then simulates 71 + 64: 171), the others
    /// stay (63 + 52 + 32 + 32: 179; a third handed would make it 235
    /// there against 116 here).
    #[test]
    fn the_runs_that_leave_first_go_to_the_other_worker() {
        let partings = [
            at(5, 68),
            at(1, 29),
            at(4, 68),
            at(2, 36),
            at(3, 48),
            at(0, 37),
        ];
        assert_eq!(share_with_one(&partings, 100, 0), vec![1, 2]);
        // Too little to share, or a single run.
        assert!(share_with_one(&partings, 100, 1000).is_empty());
        assert!(share_with_one(&[at(0, 10)], 100, 0).is_empty());
        // Two runs from the first event: one each.
        assert_eq!(share_with_one(&[at(3, 0), at(1, 0)], 100, 0), vec![1]);
        // Two runs that leave late: sharing it again costs the other
        // worker more than this one simulating both.
        assert!(share_with_one(&[at(0, 90), at(1, 95)], 100, 0).is_empty());
        // Runs that run out of memory stay.
        let out = |p: Parting| Parting {
            runs_out: true,
            ..p
        };
        assert_eq!(
            share_with_one(&[out(at(3, 0)), at(1, 0), at(2, 0)], 100, 0),
            vec![1]
        );
        assert!(share_with_one(&[out(at(3, 0)), at(1, 0)], 100, 0).is_empty());
    }
}
