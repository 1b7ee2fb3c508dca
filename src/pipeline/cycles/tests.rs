//! The cycles' tests: steps let go by, one by one and in bulk, against
//! the same events simulated one by one.
#![cfg(test)]

use super::*;
use crate::pipeline::simulate::{simulate_from, simulate_job, Handoffs, Start};
use crate::pipeline::Settings;
use crate::presets::parse_gpu;
use crate::report::{Recorder, SimulatedRun};
use crate::simulator::{AllocatorConfig, GpuMemory};

/// Runs `job` without a limit, with runs at `caps` (allocator bytes)
/// sharing it, then each run set aside on its own; and each cap's run
/// from the first event. The small events let go by, counted, and of
/// those the ones let go by a stretch at a time.
fn runs(
    job: JobRef<'_>,
    caps: &[u64],
    config: &AllocatorConfig,
) -> (Vec<SimulatedRun>, (u64, u64)) {
    let target = parse_gpu("a100-80gb").unwrap();
    let devices: Vec<GpuMemory> = caps
        .iter()
        .map(|&cap| GpuMemory::new(Bytes(cap), Bytes::ZERO))
        .collect();
    LET_BY.with(|n| n.set(0));
    IN_BULK.with(|n| n.set(0));
    let (first, last) = job.time_range().unwrap();
    let start = Start {
        runner: Runner::new(config, &GpuMemory::unlimited(), 0),
        recorder: Recorder::detailed(job.n_events(), (first, last), 512, vec![(first, last)]),
        at: 0,
        walked: None,
    };
    let handoffs = Handoffs::new(devices.len(), Bytes(u64::MAX));
    let mut out = vec![simulate_from(
        job,
        &target,
        start,
        &devices,
        &handoffs,
        &mut |_| {},
    )];
    for part in handoffs.into_parts().into_iter().flatten() {
        out.push(simulate_from(
            job,
            &target,
            part.start(),
            &[],
            &Handoffs::none(),
            &mut |_| {},
        ));
    }
    for device in &devices {
        out.push(simulate_job(
            job,
            &target,
            config,
            device,
            Recorder::maxima(),
            &mut |_| {},
        ));
    }
    let counts = (
        LET_BY.with(std::cell::Cell::get),
        IN_BULK.with(std::cell::Cell::get),
    );
    (out, counts)
}

/// A generation long enough that its KV cache leaves the small pool:
/// simulated with the decode steps let go by, every figure of every run
/// (the unlimited one with its timeline, the runs at capacity parting
/// from it, each from the first event, out of memory at some) is the
/// figure of the same events simulated one by one (the job held whole,
/// which has no runs of steps); steps were let go by where the small
/// pool's decisions depend on it alone, and none with expandable
/// segments.
#[test]
fn steps_let_go_by_give_the_figures_of_every_event_simulated() {
    let bytes = include_bytes!("../../../tests/data/traces-llm/llama_gen8_b2_p16.json.gz");
    let settings = Settings {
        new_tokens: Some(600),
        gpus: vec!["a100-80gb".into()],
        ..Settings::default()
    };
    let config = settings.config().unwrap();
    let prepared = crate::pipeline::prepare(bytes, &config, &mut |_| {}).unwrap();
    let program = prepared
        .program
        .as_ref()
        .expect("the generation is streamed");
    let whole = program.schedule().unwrap();
    let (unlimited, _) = runs(JobRef::Schedule(&whole), &[], &AllocatorConfig::default());
    let peak = unlimited[0].max_reserved.get();
    // Capacities passed all along the job, inside the steps let go by.
    let mut caps: Vec<u64> = (16..32).map(|k| peak / 32 * k).collect();
    caps.extend([peak - 1, peak + (2 << 20)]);
    // Garbage collection runs only under a memory limit: the unlimited
    // run lets steps go by, the runs at a fraction of the device not.
    for (conf, lets_by) in [
        ("", Some(true)),
        ("max_split_size_mb:20", Some(true)),
        (
            "garbage_collection_threshold:0.5,per_process_memory_fraction:0.99",
            None,
        ),
        ("expandable_segments:True", Some(false)),
    ] {
        let allocator = AllocatorConfig::parse(conf, crate::simulator::RuleVersion::New).unwrap();
        let (streamed, (let_by, in_bulk)) = runs(JobRef::Program(program), &caps, &allocator);
        let (held, none) = runs(JobRef::Schedule(&whole), &caps, &allocator);
        assert_eq!(none, (0, 0));
        assert!(streamed == held, "{conf:?}: the runs differ");
        if let Some(lets_by) = lets_by {
            assert_eq!(let_by > 0, lets_by, "{conf:?}: {let_by} events let go by");
            // Most of them in bulk.
            assert_eq!(in_bulk > let_by / 2, lets_by, "{conf:?}: {in_bulk} in bulk");
        }
    }
}

/// Decode steps written by hand: temporaries of the small pool (one of
/// a whole segment's half, live while the large block is made), a small
/// block each step makes while the last step's still lives (two places
/// take turns: a cycle of two steps), and a large block that grows a
/// step, made before the last step's is freed, so that segments are
/// drawn inside the steps let go by, runs at capacity part there and
/// release the cache there.
/// Every figure of every run is the figure of the events simulated one
/// by one, and steps were let go by.
#[test]
fn steps_written_by_hand_let_go_by_give_the_figures_of_every_event_simulated() {
    use crate::orchestrator::EventKind::{Alloc, Free};
    let mib = 1i64 << 20;
    // The first small segment half full, so that the temporary of a
    // megabyte takes a segment of its own.
    let prefix = [
        (Alloc, mib),
        (Alloc, 65536),
        (Alloc, 1024),
        (Alloc, 3 * mib),
        (Alloc, 2048),
        (Alloc, 4096),
        (Alloc, 1536),
        (Alloc, 700),
        (Free, 1),
        (Alloc, 300),
        (Free, 1),
    ];
    // Each number of a free: how many events before its block was made
    // (the last step's block: its place less twelve).
    let body = [
        (Alloc, 4096, 0),
        (Alloc, 8192, 0),
        (Free, 2, 0),
        (Alloc, mib, 0),
        (Alloc, 3 * mib, 256 << 10),
        (Free, 13, 0),
        (Free, 3, 0),
        (Alloc, 1536, 0),
        (Free, 13, 0),
        (Free, 8, 0),
        (Alloc, 512, 0),
        (Free, 1, 0),
    ];
    let program = crate::program::Program::of_events(&prefix, &body, 240, &[(Free, 8), (Free, 6)]);
    let whole = program.schedule().unwrap();
    let (unlimited, _) = runs(JobRef::Schedule(&whole), &[], &AllocatorConfig::default());
    let peak = unlimited[0].max_reserved.get();
    let mut caps: Vec<u64> = (8..16).map(|k| peak / 16 * k).collect();
    caps.extend([peak - 1, peak + (2 << 20)]);
    for conf in ["", "max_split_size_mb:20"] {
        let allocator = AllocatorConfig::parse(conf, crate::simulator::RuleVersion::New).unwrap();
        let (streamed, (let_by, in_bulk)) = runs(JobRef::Program(&program), &caps, &allocator);
        let (held, _) = runs(JobRef::Schedule(&whole), &caps, &allocator);
        assert!(streamed == held, "{conf:?}: the runs differ");
        assert!(let_by > 1000, "{conf:?}: {let_by} events let go by");
        assert!(in_bulk > let_by / 2, "{conf:?}: {in_bulk} of them in bulk");
    }
}
