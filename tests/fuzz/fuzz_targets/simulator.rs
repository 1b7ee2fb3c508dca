//! Random alloc/free/empty_cache sequences through the simulated caching
//! allocator, with its invariants asserted after every event:
//! allocated ≤ reserved; allocated covers every live request rounded; the
//! reserved bytes never pass the device; peaks bound every sample; the run is
//! deterministic; and freeing everything then emptying the cache leaves 0.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use memcast::simulator::{self, AllocatorConfig, GpuMemory, RuleVersion, SimOp};
use memcast::Bytes;

/// Allocator settings the sequences run under.
const CONFS: [&str; 6] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "roundup_power2_divisions:4",
    "max_split_size_mb:200,roundup_power2_divisions:[256:1,512:2,>:4]",
    "garbage_collection_threshold:0.6",
];

#[derive(Debug, Arbitrary)]
enum Op {
    /// `size` is `mantissa << shift` (shift mod 32): bytes to gigabytes.
    Alloc {
        id: u8,
        mantissa: u16,
        shift: u8,
        stream: bool,
    },
    Free {
        id: u8,
    },
    EmptyCache,
}

#[derive(Debug, Arbitrary)]
struct Input {
    conf: u8,
    /// Device capacity in MiB; `None`: unlimited.
    capacity_mib: Option<u16>,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let conf = CONFS[usize::from(input.conf) % CONFS.len()];
    let Ok(config) = AllocatorConfig::parse(conf, RuleVersion::New) else {
        panic!("preset conf {conf:?} must parse");
    };
    let device = match input.capacity_mib {
        Some(mib) => GpuMemory {
            memory_limit: Some(Bytes(u64::from(mib) << 19)),
            ..GpuMemory::new(Bytes(u64::from(mib) << 20), Bytes(0))
        },
        None => GpuMemory::unlimited(),
    };
    let mut ops: Vec<SimOp> = Vec::with_capacity(input.ops.len() + 257);
    let mut live: [Option<u64>; 256] = [None; 256];
    for op in &input.ops {
        match *op {
            Op::Alloc {
                id,
                mantissa,
                shift,
                stream,
            } => {
                let size = u64::from(mantissa) << (shift % 32);
                ops.push(SimOp::Alloc {
                    block: u64::from(id),
                    size: Bytes(size),
                    stream: u32::from(stream),
                });
                // A 0-byte allocation never reaches the allocator.
                if size > 0 {
                    live[usize::from(id)] = Some(size);
                }
            }
            Op::Free { id } => {
                ops.push(SimOp::Free {
                    block: u64::from(id),
                });
                live[usize::from(id)] = None;
            }
            Op::EmptyCache => ops.push(SimOp::EmptyCache),
        }
    }
    let n_fuzzed = ops.len();
    for (id, size) in live.iter().enumerate() {
        if size.is_some() {
            ops.push(SimOp::Free { block: id as u64 });
        }
    }
    ops.push(SimOp::EmptyCache);

    let run = simulator::simulate(&ops, &config, &device);
    assert_eq!(
        run,
        simulator::simulate(&ops, &config, &device),
        "not deterministic"
    );

    // Replay the live set to check allocated against the rounded requests.
    let mut live_now: [Option<u64>; 256] = [None; 256];
    for (index, (op, sample)) in ops.iter().zip(&run.after_event).enumerate() {
        assert!(
            sample.allocated <= sample.reserved,
            "event {index}: {sample:?}"
        );
        assert!(
            sample.reserved <= run.peak.reserved,
            "event {index}: above the peak"
        );
        assert!(
            sample.allocated <= run.peak.allocated,
            "event {index}: above the peak"
        );
        if let Some(capacity) = device.available_to_allocator() {
            assert!(
                sample.reserved.get() <= capacity,
                "event {index}: reserved past the device"
            );
        }
        match *op {
            SimOp::Alloc { block, size, .. } => {
                // A failed allocation leaves the id's earlier block in place.
                if size.get() > 0 && run.oom.map_or(true, |oom| oom.event_index != index) {
                    live_now[block as usize] = Some(size.get());
                }
            }
            SimOp::Free { block } => live_now[block as usize] = None,
            SimOp::EmptyCache => {}
        }
        let rounded: u64 = live_now
            .iter()
            .flatten()
            .map(|&s| config.round_size(s))
            .sum();
        assert!(
            sample.allocated.get() >= rounded,
            "event {index}: allocated {} < rounded live {rounded}",
            sample.allocated
        );
    }
    match run.oom {
        Some(oom) => {
            assert!(
                oom.event_index < n_fuzzed,
                "the final frees cannot run out of memory"
            );
            assert_eq!(run.after_event.len(), oom.event_index + 1);
        }
        None => {
            assert_eq!(run.after_event.len(), ops.len());
            assert_eq!(run.final_stats.allocated, Bytes(0), "everything was freed");
            assert_eq!(
                run.final_stats.reserved,
                Bytes(0),
                "empty_cache after freeing everything"
            );
        }
    }
});
