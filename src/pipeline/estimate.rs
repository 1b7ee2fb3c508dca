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
/// compared GPUs' runs at capacity simulated there: those of `early` (by
/// index in the config) from the start, and, once the unlimited runs are
/// done, those `hand` returns of the compared GPUs whose runs at capacity
/// are still to simulate, given with the event each goes on alone from and
/// the job's events ([`Split`]). Their runs are left out here, to be
/// simulated elsewhere with [`runs_at_capacity`] (the same runs) and given
/// to [`Pending::finish`]; but for a GPU of `early` whose run at capacity
/// turns out to be the unlimited run (it never leaves it), which is taken
/// from that run ([`Pending::elsewhere`] leaves it out).
pub fn estimate_split(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
    early: &[usize],
    hand: Split<'_>,
) -> Result<Pending, Error> {
    simulate_estimate(prepared, config, progress, parallel, Some((early, hand)))
}

/// An estimate's simulations, with the runs handed elsewhere early and
/// the split after the unlimited runs where `handing` is given.
fn simulate_estimate(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    parallel: &dyn Parallel,
    handing: Option<(&[usize], Split<'_>)>,
) -> Result<Pending, Error> {
    let allocator = config.allocator()?;
    let summary = runs::summary(prepared, config);
    let mut simulated = runs::simulate_here(
        prepared, &summary, config, &allocator, progress, parallel, handing,
    );
    simulated.fill_unparted(config, allocator.per_process_memory_fraction.is_none());
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

/// Which compared GPUs a shell with one other worker hands it before any
/// simulation ([`estimate_split`]'s `early`), for a job of `events` events
/// (none under `min_events`, or with fewer than two GPUs): the GPUs with
/// the least room (in a job whose reserved bytes grow, they leave the
/// unlimited run first and have the most left to simulate), as many as
/// split the runs evenly, the unlimited run counted as one more run of
/// this worker's, the other worker taking the larger half: (GPUs + 2) / 2,
/// rounded down (the unlimited run costs more an event than a run at
/// capacity, which collects its cache at the GPU's room: twice as much in
/// the browser on gen-L80-32768; a measured case, not a rule). Which runs
/// leave the unlimited run, and where, is not known before; a GPU handed
/// that never leaves it costs this worker nothing (its run is the
/// unlimited run) and the other worker a run it did in vain. `rooms` are
/// the GPUs' rooms (what each leaves the allocator, `None`: none).
pub fn share_early(rooms: &[Option<u64>], events: u64, min_events: u64) -> Vec<usize> {
    if rooms.len() < 2 || events < min_events {
        return Vec::new();
    }
    let mut by_room: Vec<(u64, usize)> = rooms
        .iter()
        .enumerate()
        .filter_map(|(gpu, room)| room.map(|room| (room, gpu)))
        .collect();
    by_room.sort_unstable();
    let take = (rooms.len() + 2) / 2;
    let mut early: Vec<usize> = by_room.into_iter().take(take).map(|(_, gpu)| gpu).collect();
    early.sort_unstable();
    early
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
    use crate::pipeline::tests::{gpus, TINY};
    use crate::pipeline::{prepare, InTurn};

    /// Runs at capacity handed to another worker ([`estimate_split`]) and
    /// simulated there ([`runs_at_capacity`]) make the report [`estimate`]
    /// makes: on GPUs that part from the unlimited run and one that never
    /// does (never handed), with and without a memory fraction (every GPU
    /// runs alone from the first event).
    #[test]
    fn runs_handed_elsewhere_make_the_same_report() {
        // Past a 256 MiB context: no room, rooms of 6 to 20 MiB (the job
        // reserves 22 MiB) and plenty.
        let sizes = ["1MiB", "262MiB", "270MiB", "276MiB", "t4"];
        for alloc_conf in ["", "per_process_memory_fraction:0.5"] {
            let config = Config {
                alloc_conf: alloc_conf.to_owned(),
                ..Config::for_gpus("t4", &gpus(&sizes)).unwrap()
            };
            let prepared = prepare(TINY, &config, &mut |_| {}).unwrap();
            let whole = estimate(&prepared, &config, &mut |_| {}).unwrap().value;
            for every in [1, 2] {
                let mut offered: Vec<Parting> = Vec::new();
                let mut hand = |partings: &[Parting], events: u64| {
                    assert!(partings.iter().all(|p| p.from < events));
                    offered = partings.to_vec();
                    partings.iter().step_by(every).map(|p| p.gpu).collect()
                };
                let mut last = Progress::start(Stage::Parsing);
                let pending = estimate_split(
                    &prepared,
                    &config,
                    &mut |p| last = p,
                    &InTurn,
                    &[],
                    &mut hand,
                )
                .unwrap();
                // Short of the total by the runs handed elsewhere.
                assert_eq!(last.stage, Stage::Simulating);
                assert!(last.done < last.total, "{last:?}");
                let handed: Vec<usize> = offered.iter().step_by(every).map(|p| p.gpu).collect();
                assert_eq!(pending.elsewhere(), &handed[..], "{alloc_conf}");
                assert!(!handed.is_empty(), "{alloc_conf}");
                // The t4 never leaves the unlimited run, but where a memory
                // fraction has its allocator collect garbage sooner.
                let t4_offered = offered.iter().any(|p| p.gpu == 4);
                assert_eq!(t4_offered, !alloc_conf.is_empty(), "{offered:?}");
                // Without one, some run leaves the unlimited run part-way.
                let parted = offered.iter().any(|p| p.from > 0);
                assert_eq!(parted, alloc_conf.is_empty(), "{offered:?}");
                let given =
                    runs_at_capacity(&prepared, &config, &handed, &mut |_| {}, &InTurn).unwrap();
                let gpus: Vec<usize> = given.iter().map(|(gpu, _)| *gpu).collect();
                assert_eq!(gpus, handed);
                // A run missing is an error, not a report.
                let mut again = |p: &[Parting], _| p.iter().step_by(every).map(|p| p.gpu).collect();
                let missing =
                    estimate_split(&prepared, &config, &mut |_| {}, &InTurn, &[], &mut again)
                        .unwrap()
                        .finish(&prepared, &config, given[1..].to_vec(), &mut |_| {});
                assert!(missing.is_err());
                let report = pending
                    .finish(&prepared, &config, given, &mut |_| {})
                    .unwrap()
                    .value;
                assert_eq!(report, whole, "{alloc_conf} every {every}");
            }
            // Handed before any simulation: those that leave the unlimited
            // run (or, with a memory fraction, every one) are missing, the
            // t4 otherwise taken from the unlimited run.
            let early = [0, 2, 4];
            let mut none = |_: &[Parting], _| Vec::new();
            let mut last = Progress::start(Stage::Parsing);
            let pending = estimate_split(
                &prepared,
                &config,
                &mut |p| last = p,
                &InTurn,
                &early,
                &mut none,
            )
            .unwrap();
            assert!(last.done < last.total, "{last:?}");
            let missing: &[usize] = if alloc_conf.is_empty() {
                &[0, 2]
            } else {
                &early
            };
            assert_eq!(pending.elsewhere(), missing, "{alloc_conf}");
            let given =
                runs_at_capacity(&prepared, &config, missing, &mut |_| {}, &InTurn).unwrap();
            let report = pending
                .finish(&prepared, &config, given, &mut |_| {})
                .unwrap()
                .value;
            assert_eq!(report, whole, "{alloc_conf} early");
        }
    }

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

    /// Before any simulation: the least room first, the larger half of the
    /// runs with the unlimited one.
    #[test]
    fn the_gpus_with_least_room_go_first() {
        let rooms = [Some(80), Some(15), Some(22), Some(24), Some(40), Some(80)];
        assert_eq!(share_early(&rooms, 100, 0), vec![1, 2, 3, 4]);
        assert_eq!(share_early(&rooms[..3], 100, 0), vec![1, 2]);
        // A GPU without room takes none.
        assert_eq!(
            share_early(&[Some(8), None, Some(4), Some(9)], 100, 0),
            vec![0, 2, 3]
        );
        assert!(share_early(&rooms, 100, 1000).is_empty());
        assert!(share_early(&rooms[..1], 100, 0).is_empty());
    }
}
