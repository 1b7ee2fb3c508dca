//! `trace::parse`: real fixtures against their sidecars, tolerant reading, and
//! one clear error per kind of bad input.

// Test helpers here panic on purpose: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;

use memcast::trace::{self, Device, TraceError};

use crate::common;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read as _;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[test]
fn every_fixture_has_the_memory_events_its_sidecar_counts() {
    for fixture in crate::analyzer::fixtures() {
        let name = &fixture.name;
        let meta = &fixture.meta;
        let t = &fixture.trace;
        let stats = &meta["trace"];
        assert_eq!(t.memory.len() as u64, stats["num_memory_events"], "{name}");
        let allocs = t.memory.iter().filter(|m| m.bytes > 0).count() as u64;
        assert_eq!(allocs, stats["num_alloc_events"], "{name}");
        assert_eq!(t.n_events as u64, stats["num_events"], "{name}");
        let cats = &stats["event_categories"];
        assert_eq!(t.ops.len() as u64, cats["cpu_op"], "{name}");
        assert_eq!(t.python.len() as u64, cats["python_function"], "{name}");
        assert_eq!(
            t.annotations.len() as u64,
            cats["user_annotation"],
            "{name}"
        );
        assert_eq!(t.flows.len() as u64, cats["fwdbwd"], "{name}");
        assert!(t.memory.iter().all(|m| m.device == Device::Cpu), "{name}");
        assert!(!t.recorded_on_cuda(), "{name}");
        assert_eq!(t.header.profile_memory, Some(true), "{name}");
        assert_eq!(t.header.with_stack, Some(true), "{name}");
        assert!(t.memory.windows(2).all(|w| w[0].ts <= w[1].ts), "{name}");
        assert!(
            fixture.parse_warnings.is_empty(),
            "{name}: {:?}",
            fixture.parse_warnings
        );
        // AccumulateGrad and the layer ops keep their tensor arguments (the
        // parameters come from them); allocation-only ops drop theirs.
        let of = |ops: &[&str]| {
            let found: Vec<_> = t
                .ops
                .iter()
                .filter(|o| ops.contains(&t.name(o.name)))
                .collect();
            assert!(!found.is_empty(), "{name}: none of {ops:?}");
            found.iter().all(|o| !t.tensor_args(o).is_empty())
        };
        assert!(of(&["torch::autograd::AccumulateGrad"]), "{name}");
        assert!(
            of(&["aten::linear", "aten::conv2d", "aten::addmm", "aten::mm"]),
            "{name}"
        );
        assert!(t
            .ops
            .iter()
            .filter(|o| t.name(o.name) == "aten::empty")
            .all(|o| t.tensor_args(o).is_empty()));
    }
}

#[test]
fn gzip_and_plain_json_give_the_same_trace() {
    let gz = common::read_shared("fixtures/traces/resnet18_sgd_bs16_pos1.json.gz");
    let plain = gunzip(&gz);
    assert_eq!(trace::parse(&gz).unwrap(), trace::parse(&plain).unwrap());
}

#[test]
fn progress_is_monotone_and_reaches_the_total() {
    let gz = common::read_shared("fixtures/traces/resnet18_sgd_bs16_pos1.json.gz");
    for bytes in [gz.clone(), gunzip(&gz)] {
        let mut seen: Vec<(u64, u64)> = Vec::new();
        trace::parse_with_progress(&bytes, &mut |done, total| seen.push((done, total))).unwrap();
        assert!(seen.len() > 2, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
        assert!(seen.iter().all(|&(_, total)| total == bytes.len() as u64));
        assert_eq!(seen.last(), Some(&(bytes.len() as u64, bytes.len() as u64)));
    }
}

const MINIMAL: &str = r#"{"traceEvents": [
  {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2.5,
   "args": {"Addr": 10, "Bytes": 8, "Total Allocated": 8, "Device Type": 0}}
]}"#;

#[test]
fn unknown_fields_and_categories_are_ignored() {
    let text = r#"{"schemaVersion": 9, "futureKey": {"a": [1, 2]}, "traceEvents": [
      {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": "x", "tid": 3, "ts": 1.0, "newField": [1],
       "args": {"Addr": 10, "Bytes": 8, "Total Allocated": 8, "Device Type": 0, "Shiny": {"x": 1}}},
      {"ph": "X", "cat": "brand_new_category", "name": "thing", "ts": 1, "dur": 1},
      {"ph": "X", "cat": "cpu_op", "name": "aten::add", "tid": 3, "ts": "2.0", "dur": 1.5,
       "args": {"Input Dims": "weird", "Sequence number": 4.0}}
    ]}"#;
    let parsed = trace::parse(text.as_bytes()).unwrap();
    let t = &parsed.value;
    assert_eq!(t.header.schema_version, Some(9));
    assert_eq!(t.n_events, 3);
    assert_eq!(t.memory.len(), 1);
    assert_eq!(t.memory[0].tid, 3);
    assert_eq!(t.ops.len(), 1);
    assert_eq!(t.ops[0].start.get(), 2000);
    assert_eq!(t.ops[0].dur.get(), 1500);
    assert_eq!(t.ops[0].sequence_number, Some(4));
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
}

#[test]
fn missing_optional_fields_become_warnings() {
    let text = r#"{"traceEvents": [
      {"ph": "i", "name": "[memory]", "tid": 1, "ts": 1.0, "args": {"Addr": 10, "Bytes": 8}},
      {"ph": "i", "name": "[memory]", "tid": 1, "ts": 2.0, "args": {"Bytes": 8}},
      {"ph": "X", "cat": "cpu_op", "name": "aten::add", "tid": 1, "ts": 1.0},
      {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "tid": 1},
      17
    ]}"#;
    let parsed = trace::parse(text.as_bytes()).unwrap();
    let mut codes: Vec<&str> = parsed.warnings.iter().map(|w| w.code.as_str()).collect();
    codes.sort_unstable();
    assert_eq!(
        codes,
        [
            "incomplete_memory_event",
            "malformed_event",
            "memory_event_without_device",
            "memory_event_without_total",
            "span_without_dur",
            "span_without_ts",
        ]
    );
    assert_eq!(parsed.value.memory.len(), 1);
    assert_eq!(parsed.value.ops.len(), 1);
}

#[test]
fn the_json_array_format_is_accepted() {
    let text = r#"[{"ph": "i", "name": "[memory]", "tid": 1, "ts": 1.0,
      "args": {"Addr": 10, "Bytes": 8, "Total Allocated": 8, "Device Type": 0}}]"#;
    assert_eq!(trace::parse(text.as_bytes()).unwrap().value.memory.len(), 1);
}

#[test]
fn escaped_names_are_read() {
    let text = r#"{"traceEvents": [
      {"ph": "X", "cat": "cpu_op", "name": "a\"b\u00e9", "tid": 1, "ts": 1, "dur": 1},
      {"ph": "i", "name": "[memory]", "tid": 1, "ts": 1.0,
       "args": {"Addr": 10, "Bytes": 8, "Total Allocated": 8, "Device Type": 0}}
    ]}"#;
    let t = trace::parse(text.as_bytes()).unwrap().value;
    let names: Vec<&str> = t.ops.iter().map(|o| t.name(o.name)).collect();
    assert_eq!(names, ["a\"b\u{e9}"]);
}

#[test]
fn empty_input_is_reported_as_empty() {
    assert_eq!(trace::parse(b""), Err(TraceError::Empty));
    assert_eq!(trace::parse(b"  \n\t "), Err(TraceError::Empty));
    assert_eq!(trace::parse(&gzip(b"")), Err(TraceError::Empty));
}

#[test]
fn bytes_that_are_not_json_name_the_expected_file() {
    let err = trace::parse(b"PK\x03\x04 some zip").unwrap_err();
    assert!(matches!(err, TraceError::NotJson(_)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("export_chrome_trace"), "{message}");
    assert!(matches!(
        trace::parse(b"hello world"),
        Err(TraceError::NotJson(_))
    ));
}

#[test]
fn json_that_is_not_a_trace_is_named_as_such() {
    for text in [
        r#"{"name": "x"}"#,
        r#"{}"#,
        r#"{"traceEvents": 5}"#,
        r#"{"traceEvents": {"a": 1}}"#,
    ] {
        let err = trace::parse(text.as_bytes()).unwrap_err();
        assert!(
            matches!(err, TraceError::NotAProfilerTrace(_)),
            "{text}: {err:?}"
        );
        assert!(err.to_string().contains("traceEvents"), "{err}");
    }
}

#[test]
fn a_trace_without_memory_events_names_profile_memory() {
    let text = r#"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "tid": 1, "ts": 1, "dur": 1}]}"#;
    let err = trace::parse(text.as_bytes()).unwrap_err();
    assert_eq!(err, TraceError::NoMemoryEvents);
    assert!(err.to_string().contains("profile_memory=True"));
    assert_eq!(
        trace::parse(br#"{"traceEvents": []}"#),
        Err(TraceError::NoMemoryEvents)
    );
}

#[test]
fn truncated_files_are_reported_as_truncated() {
    let gz = common::read_shared("fixtures/traces/resnet18_sgd_bs16_pos1.json.gz");
    let plain = gunzip(&gz);
    for cut in [20, plain.len() / 3, plain.len() - 3] {
        let err = trace::parse(&plain[..cut]).unwrap_err();
        assert!(
            matches!(err, TraceError::Truncated { .. }),
            "{cut}: {err:?}"
        );
        assert!(err.to_string().contains("truncated"));
    }
    for cut in [10, gz.len() / 2, gz.len() - 4] {
        let err = trace::parse(&gz[..cut]).unwrap_err();
        assert_eq!(err, TraceError::TruncatedGzip, "{cut}");
    }
}

#[test]
fn corrupt_gzip_and_broken_json_are_errors_not_panics() {
    let mut gz = gzip(MINIMAL.as_bytes());
    let middle = gz.len() / 2;
    gz[middle] ^= 0xff;
    gz[middle + 1] ^= 0x55;
    let err = trace::parse(&gz).unwrap_err();
    assert!(
        matches!(
            err,
            TraceError::CorruptGzip(_) | TraceError::TruncatedGzip | TraceError::InvalidJson { .. }
        ),
        "{err:?}"
    );
    let err = trace::parse(br#"{"traceEvents": [ {"ph": "X",, } ]}"#).unwrap_err();
    assert!(
        matches!(err, TraceError::InvalidJson { line: 1, .. }),
        "{err:?}"
    );
    let err = trace::parse(format!("{MINIMAL} trailing").as_bytes()).unwrap_err();
    assert!(matches!(err, TraceError::InvalidJson { .. }), "{err:?}");
}

#[test]
fn cuda_memory_events_are_recognised() {
    let bytes = std::fs::read(common::local_fixture("cuda_memory.json")).unwrap();
    let t = trace::parse(&bytes).unwrap().value;
    assert!(t.recorded_on_cuda());
    assert_eq!(t.n_gpu_events, 1);
    assert_eq!(t.header.n_gpu_devices, 1);
    assert!(t.memory.iter().all(|m| m.device == Device::Cuda));
}

/// Garbage of every shape must give an error or a trace, never a panic.
#[test]
fn arbitrary_bytes_never_panic() {
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let prefix = &MINIMAL.as_bytes()[..MINIMAL.len() / 2];
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..200), |tail| {
            let mut bytes = prefix.to_vec();
            bytes.extend_from_slice(&tail);
            let _ = trace::parse(&bytes);
            let _ = trace::parse(&tail);
            let _ = trace::parse(&gzip(&tail));
            Ok(())
        })
        .unwrap();
}

/// The reader's fast path for plain entries reads real traces exactly as its
/// serde visitors do: the same file with one key of every entry spelled with
/// an escape (`"p\u0068"` for `"ph"`, the same key to JSON), which sends every
/// entry to serde, gives the same trace.
#[test]
fn the_fast_path_reads_every_fixture_as_serde_does() {
    let folders = [
        "traces",
        "traces-nograd",
        "traces-options",
        "traces-recipes",
    ];
    for folder in folders {
        for name in common::fixtures_in(folder) {
            let text = String::from_utf8(gunzip(&common::read_shared(&name))).unwrap();
            let escaped = text.replace("\"ph\":", "\"p\\u0068\":");
            assert!(escaped.len() > text.len(), "{name}: no \"ph\" keys");
            let fast = trace::parse(text.as_bytes()).unwrap();
            assert!(!fast.value.ops.is_empty(), "{name}");
            assert!(
                fast == trace::parse(escaped.as_bytes()).unwrap(),
                "{name} reads differently through serde"
            );
        }
    }
}
