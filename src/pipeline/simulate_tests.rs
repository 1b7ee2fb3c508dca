//! The simulation glue's tests: schedules against the simulator, runs at
//! capacity handed over against runs alone.
#![cfg(test)]

use super::*;
use crate::orchestrator::{BlockId, Phase, ScheduleEvent, ScheduledBlock};
use crate::presets::parse_gpu;
use crate::units::Nanos;
use proptest::prelude::*;

/// A schedule of `sizes` (bytes) allocated in order, each freed where
/// `frees` says: `frees[i]` blocks are freed (the oldest live first,
/// then every other) after the i-th allocation.
fn schedule(sizes: &[u64], frees: &[usize]) -> Schedule {
    let blocks = sizes
        .iter()
        .map(|&size| ScheduledBlock {
            size: Bytes(size),
            category: Category::Temporary,
            iteration: Some(0),
            phase: Phase::Forward,
            op: None,
            layer: None,
            on: crate::kernels::ArchSet::ALL,
            per_gpu: None,
        })
        .collect();
    let mut events = Vec::new();
    let mut live: Vec<u32> = Vec::new();
    let mut time = 0i64;
    let mut push = |events: &mut Vec<ScheduleEvent>, kind, block| {
        time += 1;
        events.push(ScheduleEvent {
            time: Nanos(time),
            kind,
            block: BlockId(block),
        });
    };
    for (i, _) in sizes.iter().enumerate() {
        push(&mut events, EventKind::Alloc, i as u32);
        live.push(i as u32);
        for k in 0..frees.get(i).copied().unwrap_or(0) {
            if live.is_empty() {
                break;
            }
            let at = (k * 2) % live.len();
            let block = live.remove(at);
            push(&mut events, EventKind::Free, block);
        }
    }
    for block in live {
        push(&mut events, EventKind::Free, block);
    }
    Schedule {
        blocks,
        events,
        ..Schedule::default()
    }
}

/// The unlimited run with `caps` (allocator bytes) sharing it, and each
/// cap's run from the first event.
fn runs(
    schedule: &Schedule,
    caps: &[u64],
) -> (SimulatedRun, Vec<Option<Parted>>, Vec<SimulatedRun>) {
    runs_keeping(schedule, caps, Bytes(u64::MAX))
}

/// [`runs`], the runs set aside holding at most `keep` bytes.
fn runs_keeping(
    schedule: &Schedule,
    caps: &[u64],
    keep: Bytes,
) -> (SimulatedRun, Vec<Option<Parted>>, Vec<SimulatedRun>) {
    let (unlimited, parted) = shared(schedule, caps, keep, false);
    let (target, conf) = (parse_gpu("a100-80gb").unwrap(), AllocatorConfig::default());
    let job = JobRef::Schedule(schedule);
    let alone = caps
        .iter()
        .map(|&cap| GpuMemory::new(Bytes(cap), Bytes::ZERO))
        .map(|d| simulate_job(job, &target, &conf, &d, Recorder::maxima(), &mut |_| {}))
        .collect();
    (unlimited, parted, alone)
}

/// Where each run set aside parted.
fn parted_at(parts: &[Option<Parted>]) -> Vec<Option<usize>> {
    parts.iter().map(|p| p.as_ref().map(|p| p.at)).collect()
}

/// The unlimited run with `caps` (allocator bytes) sharing it, the
/// runs set aside holding at most `keep` bytes (only for what it hands
/// on: `sharing_only`), and the runs it set aside.
fn shared(
    schedule: &Schedule,
    caps: &[u64],
    keep: Bytes,
    sharing_only: bool,
) -> (SimulatedRun, Vec<Option<Parted>>) {
    let handoffs = Handoffs::new(caps.len(), keep);
    let handoffs = if sharing_only {
        handoffs.sharing_only()
    } else {
        handoffs
    };
    let target = parse_gpu("a100-80gb").unwrap();
    let devices: Vec<GpuMemory> = caps
        .iter()
        .map(|&cap| GpuMemory::new(Bytes(cap), Bytes::ZERO))
        .collect();
    let start = Start {
        runner: Runner::new(&AllocatorConfig::default(), &GpuMemory::unlimited(), 0),
        recorder: Recorder::maxima(),
        at: 0,
        walked: None,
    };
    let job = JobRef::Schedule(schedule);
    let unlimited = simulate_from(job, &target, start, &devices, &handoffs, &mut |_| {});
    (unlimited, handoffs.into_parts())
}

/// A run at capacity that goes on from where it parted from the
/// unlimited run is the run at capacity from the first event; one that
/// never parted is the unlimited run.
fn check(schedule: &Schedule, caps: &[u64]) -> Result<usize, TestCaseError> {
    let target = parse_gpu("a100-80gb").unwrap();
    let job = JobRef::Schedule(schedule);
    let (unlimited, parted, alone) = runs(schedule, caps);
    // Wanted only for what it hands on, the run sets the same runs
    // aside at the same events.
    let (_, only) = shared(schedule, caps, Bytes(u64::MAX), true);
    prop_assert_eq!(parted_at(&only), parted_at(&parted));
    let mut n = 0;
    for ((cap, part), alone) in caps.iter().zip(parted).zip(alone) {
        match part {
            Some(part) => {
                n += 1;
                let resumed = simulate_from(
                    job,
                    &target,
                    part.start(),
                    &[],
                    &Handoffs::none(),
                    &mut |_| {},
                );
                prop_assert_eq!(&resumed, &alone, "at {} B", cap);
            }
            None if unlimited.max_reserved.get() <= *cap => {
                prop_assert_eq!(&unlimited, &alone, "at {} B", cap);
            }
            // Left to run alone.
            None => {}
        }
    }
    Ok(n)
}

#[test]
fn a_growing_job_parts_where_each_capacity_is_passed() {
    let mib = 1u64 << 20;
    // Growing blocks, each freed two allocations later, small ones
    // between: the cache serves some, segments grow.
    let sizes: Vec<u64> = (1..200u64)
        .map(|i| {
            if i % 3 == 0 {
                4096 * i
            } else {
                mib * (i % 17 + 1)
            }
        })
        .collect();
    let frees: Vec<usize> = (0..sizes.len())
        .map(|i| usize::from(i % 2 == 1) * 2)
        .collect();
    let s = schedule(&sizes, &frees);
    let (unlimited, _, _) = runs(&s, &[]);
    let top = unlimited.max_reserved.get();
    // Four capacities it passes (one below its first segment's end),
    // one it never does.
    let caps = [top / 8, top / 3, top / 2, top - 1, top];
    let parted = check(&s, &caps).unwrap();
    assert_eq!(
        parted, 4,
        "of the capacities {caps:?} ({top} B reserved at most)"
    );
    // Room for none; then for all but a byte: those left to run alone
    // parted no later than any kept, and the kept ones fit.
    let (_, none, _) = runs_keeping(&s, &caps, Bytes::ZERO);
    assert!(none.iter().all(Option::is_none));
    let (_, all, _) = runs(&s, &caps);
    let footprint = |parts: &[Option<Parted>]| -> u64 {
        parts
            .iter()
            .flatten()
            .map(|p| p.runner.footprint().get())
            .sum()
    };
    let keep = footprint(&all) - 1;
    // An unlimited run wanted only for what it hands on stops at the
    // last capacity it passes, having handed the same runs on; with a
    // capacity it never comes near, it goes to the end.
    let (stopped, parts) = shared(&s, &caps[..4], Bytes(u64::MAX), true);
    let last = parts.iter().flatten().map(|p| p.at).max().unwrap();
    assert_eq!(stopped.events, last as u64 + 1);
    assert!(stopped.events < unlimited.events);
    let (whole, _) = shared(&s, &[top / 8, top * 2], Bytes(u64::MAX), true);
    assert_eq!(whole, unlimited);
    let (_, some, _) = runs_keeping(&s, &caps, Bytes(keep));
    assert!(footprint(&some) <= keep);
    let kept: Vec<usize> = some.iter().flatten().map(|p| p.at).collect();
    assert!(kept.len() < parted, "nothing was left alone: {kept:?}");
    let first_kept = kept.iter().min().copied().unwrap_or(usize::MAX);
    for (a, o) in all.iter().zip(&some) {
        if let (Some(a), None) = (a, o) {
            assert!(a.at <= first_kept, "{} left alone, {kept:?} kept", a.at);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn a_run_at_capacity_goes_on_from_where_it_parts(
        sizes in proptest::collection::vec(
            prop_oneof![1u64..(1 << 20), (1u64 << 20)..(64 << 20)],
            1..120,
        ),
        frees in proptest::collection::vec(0usize..4, 0..120),
        caps in proptest::collection::vec((1u64 << 20)..(512 << 20), 1..6),
    ) {
        check(&schedule(&sizes, &frees), &caps)?;
    }
}
