//! Simulator: every worked sequence of `shared/docs/allocator-vectors.json`,
//! run step by step through the public allocator API, and property tests of
//! the allocator's invariants.

// Test helpers below panic on malformed vectors by design, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use memcast::simulator::{AllocatorConfig, CachingAllocator, Device, RuleVersion};
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
        Some(c) => Device::new(Bytes(c), Bytes(0)),
        None => Device::unlimited(),
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
