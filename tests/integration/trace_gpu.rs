//! Real GPU (CUDA and ROCm) profiler traces from `../shared/ground-truth`:
//! the reader and analyzer accept them, recognise the GPU, and count their
//! memory events as the catalogue does.

// Test helpers here panic on purpose: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use memcast::analyzer::{self, AnalyzerConfig};
use memcast::trace::{self, Device, TraceError};

use crate::common;

#[test]
fn ground_truth_gpu_traces_are_read_and_recognised() {
    let catalogue: serde_json::Value =
        serde_json::from_slice(&common::read_shared("ground-truth/catalogue.json")).unwrap();
    let kineto: Vec<&serde_json::Value> = catalogue
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "kineto_traces")
        .collect();
    assert!(
        kineto.len() >= 10,
        "catalogue lists {} kineto traces",
        kineto.len()
    );
    let config = AnalyzerConfig {
        require_python_frames: false,
        ..AnalyzerConfig::standard()
    };
    let mut n_analyzed = 0;
    for record in kineto {
        let file = record["file"].as_str().unwrap();
        let bytes = common::read_shared(&format!("ground-truth/{file}"));
        let memory = record["stats"]["memory"].as_object().unwrap();
        let has_addr = memory.values().all(|m| m["has_addr"] == true);
        let parsed = trace::parse(&bytes);
        if !has_addr {
            let n: u64 = memory
                .values()
                .map(|m| m["n_events"].as_u64().unwrap())
                .sum();
            assert_eq!(
                parsed.unwrap_err(),
                TraceError::MemoryEventsWithoutAddress(n as usize),
                "{file}"
            );
            continue;
        }
        let parsed = parsed.unwrap_or_else(|e| panic!("{file}: {e}"));
        let t = &parsed.value;
        assert!(t.recorded_on_cuda(), "{file}");
        // Events and allocations per (device type, device id), as catalogued.
        let mut counts: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for m in &t.memory {
            let code = match m.device {
                Device::Cpu => 0,
                Device::Cuda => 1,
                Device::Hip => 6,
                Device::Other(code) => code,
            };
            let key = format!("type{code}_dev{}", m.device_id.unwrap());
            let slot = counts.entry(key).or_default();
            slot.0 += 1;
            slot.1 += u64::from(m.bytes > 0);
        }
        let expected: BTreeMap<String, (u64, u64)> = memory
            .iter()
            .map(|(k, m)| {
                (
                    k.clone(),
                    (
                        m["n_events"].as_u64().unwrap(),
                        m["n_allocs"].as_u64().unwrap(),
                    ),
                )
            })
            .collect();
        assert_eq!(counts, expected, "{file}");
        assert!(t.memory.iter().any(|m| m.device.is_gpu()), "{file}");

        let analysis = analyzer::analyze(t, &config)
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .value;
        assert!(analysis.devices.recorded_on_cuda);
        let n_allocs: u64 = expected.values().map(|c| c.1).sum();
        assert_eq!(analysis.blocks.len() as u64, n_allocs, "{file}");
        // Frees of blocks allocated before the window are counted, not fatal.
        let n_frees = analysis.events.len() - analysis.blocks.len();
        let n_paired = analysis
            .blocks
            .iter()
            .filter(|b| b.free_ts.is_some())
            .count();
        assert_eq!(n_paired + analysis.unmatched_frees.len(), n_frees, "{file}");
        assert!(!analysis.iterations.is_empty(), "{file}");
        n_analyzed += 1;
    }
    assert!(n_analyzed >= 10);
}

/// A job run on the CPU, profiled with `activities=[CPU]` on a machine that has
/// a GPU (an H200, torch 2.11): the header lists the GPU under
/// `deviceProperties` and the host called `cudaGetDeviceCount` (a
/// `cuda_runtime` event with its `ac2g` flow), but every `[memory]` event is
/// the CPU's and no kernel ran. It is a CPU trace, to be estimated as one.
#[test]
fn a_cpu_run_on_a_machine_with_a_gpu_is_a_cpu_trace() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gpu-h200/llama-small_adamw_ckpt_L2.json.gz");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let t = trace::parse(&bytes).unwrap().value;
    assert_eq!(t.header.n_gpu_devices, 1, "the header lists the H200");
    assert!(t.memory.iter().all(|m| m.device == Device::Cpu));
    assert_eq!(t.n_gpu_events, 0, "host CUDA calls are not GPU events");
    assert!(!t.recorded_on_cuda());
}
