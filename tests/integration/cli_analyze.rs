//! The `memcast analyze` command: JSON schema, exit codes, messages.

// Test helpers here panic on purpose: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use crate::common;

fn memcast(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_memcast"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn json_output_has_the_versioned_fields() {
    let path = common::shared_file("fixtures/traces/resnet18_sgd_bs16_pos1.json.gz");
    let out = memcast(&["analyze", path.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["schema"], "memcast.analyze/1");
    assert_eq!(json["iterations"], 3);
    assert_eq!(json["blocks"], 1916);
    assert_eq!(json["persistent_blocks"], 127);
    assert_eq!(json["parameters"]["count"], 62);
    assert_eq!(json["parameters"]["bytes"], 46758048);
    assert_eq!(json["warnings"], serde_json::json!([]));
    assert_eq!(json["peak_bytes"], 118972104);
}

#[test]
fn text_output_names_iterations_and_layers() {
    let path = common::local_fixture("tiny_step.json");
    let out = memcast(&["analyze", path.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("ProfilerStep#0"), "{text}");
    assert!(text.contains("Net_0/Linear_0"), "{text}");
    assert!(text.contains("free_of_unknown_block"), "{text}");
}

#[test]
fn bad_input_exits_non_zero_with_one_clear_message() {
    let dir = std::env::temp_dir().join(format!("memcast-cli-analyze-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: [(&str, &[u8], &str); 3] = [
        ("empty.json", b"", "the file is empty"),
        ("notjson.json", b"hello", "neither JSON nor gzip"),
        (
            "nomem.json",
            br#"{"traceEvents": []}"#,
            "profile_memory=True",
        ),
    ];
    for (name, bytes, needle) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = memcast(&["analyze", path.to_str().unwrap()]);
        assert!(!out.status.success(), "{name}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(stderr.contains(needle), "{name}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
        assert!(!stderr.contains("panicked"));
    }
    // A trace without Python frames is analyzed, with a warning naming with_stack.
    let path = dir.join("nostack.json");
    std::fs::write(
        &path,
        br#"{"traceEvents": [{"ph": "i", "name": "[memory]", "tid": 1, "ts": 1,
            "args": {"Addr": 1, "Bytes": 8, "Total Allocated": 8, "Device Type": 0}}]}"#,
    )
    .unwrap();
    let out = memcast(&["analyze", path.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("with_stack=True"));
    let out = memcast(&["analyze", dir.join("missing.json").to_str().unwrap()]);
    assert!(!out.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `memcast events`: one row per schedule event on the target GPU, whose
/// highest reserved bytes are the estimate's peak there, in tab-separated
/// columns or JSON.
#[test]
fn events_list_the_schedule_up_to_the_estimates_peak() {
    let path = common::shared_file("fixtures/traces/resnet18_sgd_bs16_pos1.json.gz");
    let path = path.to_str().unwrap();
    let out = memcast(&["events", path, "--gpu", "t4", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["schema"], "memcast.events/1");
    assert_eq!(json["gpu"], "t4");
    let rows = json["events"].as_array().unwrap();
    let estimate = memcast(&["estimate", path, "--gpu", "t4", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&estimate.stdout).unwrap();
    let peak = rows
        .iter()
        .map(|row| row["reserved"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(peak, report["peak"]["reserved_bytes"].as_u64().unwrap());
    // Each free names a block allocated before it (parameters and other
    // persistent blocks are never freed).
    let mut live = std::collections::HashSet::new();
    for row in rows {
        let block = row["block"].as_u64().unwrap();
        match row["kind"].as_str().unwrap() {
            "alloc" => assert!(live.insert(block), "{row}"),
            _ => assert!(live.remove(&block), "{row}"),
        }
    }
    assert!(!live.is_empty() && live.len() < rows.len() / 2);
    let text = memcast(&["events", path, "--gpu", "t4"]);
    let text = String::from_utf8(text.stdout).unwrap();
    let mut lines = text.lines();
    assert!(lines.next().unwrap().starts_with("# "));
    assert!(lines
        .next()
        .unwrap()
        .starts_with("index\ttime_ns\tkind\tblock\tbytes"));
    assert_eq!(lines.count(), rows.len());
}
