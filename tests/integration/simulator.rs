//! Simulator: every worked sequence of `shared/docs/allocator-vectors.json`,
//! run step by step through the public allocator API, and property tests of
//! the allocator's invariants.

// Test helpers below panic on malformed vectors by design, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use memcast::simulator::{AllocatorConfig, CachingAllocator, GpuMemory, RuleVersion};
use memcast::Bytes;
use serde_json::Value;

use crate::common;

/// The rule revision a vector's `compat` flags ask for. Vectors without
/// flags describe current PyTorch (R-new); `roundup_gt_fill_inclusive` is the
/// `>` parsing of 2.1–2.8 (R-mid); `legacy_div1_unrounded` is the
/// divisions == 1 behaviour of ≤ 2.3 (R-old).
fn version_for(config: &Value) -> RuleVersion {
    let compat = &config["compat"];
    if compat["legacy_div1_unrounded"].as_bool() == Some(true) {
        RuleVersion::Old
    } else if compat["roundup_gt_fill_inclusive"].as_bool() == Some(true) {
        RuleVersion::Mid
    } else {
        RuleVersion::New
    }
}

/// Writes the vector's config as a `PYTORCH_CUDA_ALLOC_CONF` string, so the
/// parser is exercised too.
fn conf_string(config: &Value) -> String {
    let mut parts = Vec::new();
    let Some(obj) = config.as_object() else {
        return String::new();
    };
    for (key, value) in obj {
        let text = match (key.as_str(), value) {
            ("compat" | "allowed_memory_maximum_bytes", _) => continue,
            (_, Value::Bool(b)) => if *b { "True" } else { "False" }.to_owned(),
            (_, Value::String(s)) => s.clone(),
            (_, v) => v.to_string(),
        };
        parts.push(format!("{key}:{text}"));
    }
    parts.join(",")
}

fn run_vector(v: &Value) -> Result<(), String> {
    let name = v["name"].as_str().unwrap_or("?");
    let config = &v["config"];
    let conf = conf_string(config);
    let parsed = AllocatorConfig::parse(&conf, version_for(config))
        .map_err(|e| format!("{name}: config {conf:?}: {e}"))?;
    let mut device = match v["device_capacity_bytes"].as_u64() {
        Some(c) => GpuMemory::new(Bytes(c), Bytes(0)),
        None => GpuMemory::unlimited(),
    };
    device.memory_limit = config["allowed_memory_maximum_bytes"].as_u64().map(Bytes);
    let mut alloc = CachingAllocator::new(parsed, device);
    let mut live = HashMap::new();
    for (i, step) in v["steps"].as_array().unwrap().iter().enumerate() {
        let op = step["op"].as_str().unwrap();
        let id = step["id"].as_str().unwrap_or("");
        let mut oom = false;
        match op {
            "alloc" => {
                let size = step["size"].as_u64().unwrap();
                let stream = step["stream"].as_u64().unwrap_or(0) as u32;
                if size > 0 {
                    match alloc.malloc(Bytes(size), stream) {
                        Ok(a) => {
                            live.insert(id.to_owned(), a.handle);
                        }
                        Err(_) => oom = true,
                    }
                }
            }
            "free" => {
                if let Some(h) = live.remove(id) {
                    alloc.free(h).map_err(|e| format!("{name} step {i}: {e}"))?;
                }
            }
            "empty_cache" => alloc.empty_cache(),
            other => return Err(format!("{name}: unknown op {other}")),
        }
        let s = alloc.stats();
        let want = &step["expect"];
        let got = (s.reserved.get(), s.allocated.get(), s.segments, oom);
        let expected = (
            want["reserved"].as_u64().unwrap(),
            want["allocated"].as_u64().unwrap(),
            want["segments"].as_u64().unwrap(),
            want["oom"].as_bool().unwrap(),
        );
        if got != expected {
            return Err(format!(
                "{name} step {} ({op} {id}): got (reserved, allocated, segments, oom) = {got:?}, want {expected:?}",
                i + 1
            ));
        }
        alloc
            .check_invariants()
            .map_err(|e| format!("{name} step {}: {e}", i + 1))?;
    }
    Ok(())
}

#[test]
fn every_allocator_vector_passes() {
    let text = common::read_shared("docs/allocator-vectors.json");
    let vectors: Vec<Value> = serde_json::from_slice(&text).unwrap();
    assert_eq!(vectors.len(), 48, "the spec lists 48 vectors");
    let failures: Vec<String> = vectors.iter().filter_map(|v| run_vector(v).err()).collect();
    assert!(
        failures.is_empty(),
        "{} vectors failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

mod properties {
    //! Invariants over random schedules (seed-stable: fixed RNG seed, no
    //! persisted failures).

    use memcast::simulator::{
        simulate, AllocatorConfig, CachingAllocator, GpuMemory, RuleVersion, SimOp,
    };
    use memcast::Bytes;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};

    const MIB: u64 = Bytes::MIB;

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64, u32),
        Free(usize),
        EmptyCache,
    }

    fn size() -> impl Strategy<Value = u64> {
        prop_oneof![
            4 => 1u64..=MIB,
            3 => MIB..=12 * MIB,
            2 => 12 * MIB..=150 * MIB,
            1 => prop_oneof![Just(MIB), Just(MIB + 1), Just(10 * MIB), Just(20 * MIB)],
        ]
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                6 => (size(), 0u32..3).prop_map(|(s, st)| Op::Alloc(s, st)),
                5 => any::<usize>().prop_map(Op::Free),
                1 => Just(Op::EmptyCache),
            ],
            1..120,
        )
    }

    fn configs() -> impl Strategy<Value = (&'static str, RuleVersion)> {
        prop_oneof![
            Just(("", RuleVersion::New)),
            Just(("expandable_segments:True", RuleVersion::New)),
            Just((
                "max_split_size_mb:64,roundup_power2_divisions:4",
                RuleVersion::New
            )),
            Just(("roundup_power2_divisions:[1:2,16:4,>:8]", RuleVersion::Mid)),
            Just((
                "max_split_size_mb:40,max_non_split_rounding_mb:40",
                RuleVersion::Mid
            )),
        ]
    }

    fn config() -> Config {
        Config {
            cases: 96,
            rng_seed: RngSeed::Fixed(0x006d_656d_6361_7374),
            failure_persistence: None,
            ..Config::default()
        }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn allocator_invariants_hold(
            ops in ops(),
            (conf, version) in configs(),
            capacity in prop_oneof![Just(None), (100u64..600).prop_map(|m| Some(m * MIB))],
        ) {
            let config = AllocatorConfig::parse(conf, version).unwrap();
            let default_rules = conf.is_empty();
            let device = match capacity {
                Some(c) => GpuMemory::new(Bytes(c), Bytes(0)),
                None => GpuMemory::unlimited(),
            };
            let mut alloc = CachingAllocator::new(config, device);
            let mut live = Vec::new();
            for op in &ops {
                match *op {
                    Op::Alloc(s, stream) => {
                        if let Ok(a) = alloc.malloc(Bytes(s), stream) {
                            prop_assert!(a.size.get() >= s);
                            live.push(a.handle);
                        }
                    }
                    Op::Free(i) => {
                        if !live.is_empty() {
                            let h = live.swap_remove(i % live.len());
                            prop_assert!(alloc.free(h).is_ok());
                            prop_assert!(alloc.free(h).is_err(), "double free must be refused");
                        }
                    }
                    Op::EmptyCache => alloc.empty_cache(),
                }
                let s = alloc.stats();
                prop_assert!(s.allocated <= s.reserved);
                if let Some(c) = capacity {
                    prop_assert!(s.reserved.get() <= c);
                }
                if let Err(e) = alloc.check_invariants() {
                    prop_assert!(false, "{}", e);
                }
                if default_rules {
                    for seg in alloc.segments() {
                        prop_assert_eq!(seg.size % (2 * MIB), 0, "segment of {} B", seg.size);
                    }
                }
            }
            for h in live.drain(..) {
                prop_assert!(alloc.free(h).is_ok());
            }
            prop_assert_eq!(alloc.stats().allocated, Bytes(0));
            alloc.empty_cache();
            let s = alloc.stats();
            prop_assert_eq!(s.reserved, Bytes(0));
            prop_assert_eq!(s.segments, 0);
            prop_assert!(alloc.check_invariants().is_ok());
        }

        #[test]
        fn simulate_is_deterministic_and_balanced(ops in ops()) {
            let mut sim_ops = Vec::new();
            let mut live: Vec<u64> = Vec::new();
            for (id, op) in ops.iter().enumerate() {
                match *op {
                    Op::Alloc(s, stream) => {
                        sim_ops.push(SimOp::Alloc { block: id as u64, size: Bytes(s), stream });
                        live.push(id as u64);
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let b = live.swap_remove(i % live.len());
                        sim_ops.push(SimOp::Free { block: b });
                    }
                    _ => sim_ops.push(SimOp::EmptyCache),
                }
            }
            sim_ops.extend(live.iter().map(|&b| SimOp::Free { block: b }));
            sim_ops.push(SimOp::EmptyCache);
            let config = AllocatorConfig::pytorch_defaults();
            let a = simulate(&sim_ops, &config, &GpuMemory::unlimited());
            let b = simulate(&sim_ops, &config, &GpuMemory::unlimited());
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(a.after_event.len(), sim_ops.len());
            prop_assert!(a.after_event.iter().all(|s| s.allocated <= s.reserved));
            let last = a.after_event.last().copied().unwrap_or_default();
            prop_assert_eq!((last.allocated, last.reserved), (Bytes::ZERO, Bytes::ZERO));
            let peak = a.after_event.iter().map(|s| s.reserved).max().unwrap_or_default();
            prop_assert_eq!(a.peak.reserved, peak);
            prop_assert!(a.warnings.is_empty());
        }
    }
}
