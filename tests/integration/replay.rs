//! Replay: every real file in `shared/ground-truth` replayed through the
//! simulator, compared with the figures committed in
//! `tests/data/replay-expected.tsv`, so a change that makes the simulator
//! less faithful fails; plus the `memcast replay` command line.
//!
//! To regenerate the table after an intended change, run
//! `memcast replay --json` on every file and rewrite the columns (events,
//! exact, compared, reserved_exact, allocated_exact, allocs, address_exact,
//! seg_real, seg_matched, seg_simulated, real_peak, sim_peak, repairs) from
//! the top-level fields.
//!
//! Recordings cut short (the start-state rebuild and its teacher-forced
//! repair) are in `replay_cut.rs`; several devices are below.

// Test helpers below panic on bad fixtures by design, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use memcast::replay::{replay, ReplayKind, ReplayReport};

use crate::common;

fn figures(report: &ReplayReport) -> Vec<String> {
    let kind = match report.kind {
        ReplayKind::Snapshot => "snapshot",
        ReplayKind::Profiler => "profiler",
    };
    let r = &report.largest;
    let allocated = r
        .allocated_exact_events
        .map_or("-".to_owned(), |a| a.to_string());
    let mut out = vec![kind.to_owned()];
    out.extend(
        [
            r.events,
            r.exact_events,
            r.compared_events,
            r.reserved_exact_events,
        ]
        .map(|v| v.to_string()),
    );
    out.push(allocated);
    out.extend(
        [
            r.allocs,
            r.address_exact_allocs,
            r.segment_events_real,
            r.segment_events_matched,
            r.segment_events_simulated,
            r.real_peak_reserved_bytes.get(),
            r.simulated_peak_reserved_bytes.get(),
            r.start_state_repairs,
        ]
        .map(|v| v.to_string()),
    );
    out
}

fn expected_table() -> Vec<(String, Vec<String>)> {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/replay-expected.tsv"),
    )
    .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let mut cols = l.split('\t').map(str::to_owned);
            let path = cols.next().unwrap();
            (path, cols.collect())
        })
        .collect()
}

#[test]
fn every_ground_truth_file_keeps_its_figures() {
    let table = expected_table();
    // Every file in ground-truth is in the table, so new data gets a row.
    let mut on_disk = Vec::new();
    for sub in ["memory_snapshots", "kineto_traces"] {
        let dir = common::shared_dir().join("ground-truth").join(sub);
        for repo in std::fs::read_dir(&dir).unwrap() {
            let repo = repo.unwrap();
            for f in std::fs::read_dir(repo.path()).unwrap() {
                let name = f.unwrap().file_name().to_string_lossy().into_owned();
                on_disk.push(format!(
                    "{sub}/{}/{name}",
                    repo.file_name().to_string_lossy()
                ));
            }
        }
    }
    on_disk.sort();
    let mut listed: Vec<String> = table.iter().map(|(p, _)| p.clone()).collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "tests/data/replay-expected.tsv must list every ground-truth file"
    );

    let mut failures = Vec::new();
    for (path, want) in &table {
        let data = common::read_shared(&format!("ground-truth/{path}"));
        let got = match replay(&data) {
            Ok(r) => figures(&r),
            Err(_) => {
                let mut v = vec!["error".to_owned()];
                v.extend(std::iter::repeat_n("-".to_owned(), 13));
                v
            }
        };
        if &got != want {
            failures.push(format!("{path}\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} files changed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn snapshots_match_the_real_allocator_exactly() {
    // The acceptance gate: on every shared snapshot, every reserved value,
    // peak, segment decision and block address equals the real allocator's.
    let table = expected_table();
    let mut totals = [0u64; 4];
    for (path, want) in table.iter().filter(|(_, w)| w[0] == "snapshot") {
        let n: Vec<u64> = want[1..].iter().map(|v| v.parse().unwrap_or(0)).collect();
        let (events, exact, compared, rex) = (n[0], n[1], n[2], n[3]);
        let (allocs, aex, sreal, smatch, ssim, rpeak, speak) =
            (n[5], n[6], n[7], n[8], n[9], n[10], n[11]);
        assert_eq!(exact, events, "{path}: exact events");
        assert_eq!(rex, compared, "{path}: reserved");
        assert_eq!(aex, allocs, "{path}: addresses");
        assert_eq!((smatch, ssim), (sreal, sreal), "{path}: segment events");
        assert_eq!(speak, rpeak, "{path}: peak");
        totals[0] += compared;
        totals[1] += allocs;
        totals[2] += sreal;
        totals[3] += 1;
    }
    assert_eq!(totals, [1_120_174, 387_040, 15_506, 154]);
}

#[test]
fn cli_prints_versioned_json() {
    let file = common::shared_file(
        "ground-truth/memory_snapshots/silmont2000__assignment2-systems/mem_snapshot.pickle.gz",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_memcast"))
        .args(["replay", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "memcast.replay/1");
    assert_eq!(v["kind"], "snapshot");
    for key in [
        "events",
        "exact_events",
        "reserved_exact_events",
        "real_peak_reserved_bytes",
        "simulated_peak_reserved_bytes",
        "segment_events_real",
        "segment_events_matched",
        "allocs",
        "address_exact_allocs",
    ] {
        assert!(v[key].is_u64(), "{key} missing");
    }
    assert_eq!(v["start_complete"], true);
    assert_eq!(v["reserved_exact_events"], v["compared_events"]);
    assert_eq!(v["exact_events"], v["events"]);
    // One device: `devices` repeats the top level.
    assert_eq!(v["devices"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["devices"][0]["device"], 0);
    assert_eq!(v["devices"][0]["exact_events"], v["exact_events"]);
}

#[test]
fn cli_lists_the_start_state_repairs_with_their_evidence() {
    let file = common::shared_file(
        "ground-truth/memory_snapshots/Wedsonlin__assignment2-systems/results__medium_512_training_memory_snapshot.pickle.gz",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_memcast"))
        .arg("replay")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("exact events: 22332 / 22332 (100.000 %)"),
        "{text}"
    );
    assert!(
        text.contains("start-state repairs: 3 pre-trace blocks"),
        "{text}"
    );
    // replay-notes §3: the 4 MiB block had a 960 KiB remainder, shown by the
    // 8 MiB allocation at entry 179.
    assert!(
        text.contains("block at 0x8df510000, inferred 4194304 B, grown by 983040 B (960.0 KiB): entry 179, an alloc of 8388608 B at 0x8dfa00000"),
        "{text}"
    );
}

#[test]
fn cli_fails_clearly_on_a_file_without_gpu_totals() {
    let file = common::shared_file(
        "ground-truth/kineto_traces/pytorch__kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_memcast"))
        .arg("replay")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no GPU [memory] events with totals"), "{err}");
}

#[test]
fn corrupt_input_is_an_error_not_a_panic() {
    let data = common::read_shared(
        "ground-truth/memory_snapshots/silmont2000__assignment2-systems/mem_snapshot.pickle.gz",
    );
    let plain = memcast::trace::gunzip(&data).unwrap().into_owned();
    for cut in [1, 10, plain.len() / 2, plain.len() - 1] {
        assert!(replay(&plain[..cut]).is_err(), "cut at {cut}");
    }
    assert!(replay(b"hello").is_err());
    assert!(replay(&data[..data.len() / 2]).is_err());
}

mod robustness {
    //! Corrupted real files never panic the replay (seed-stable).

    use memcast::replay::replay;
    use memcast::trace::gunzip;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};

    use crate::common;

    fn config() -> Config {
        Config {
            cases: 100,
            rng_seed: RngSeed::Fixed(0x0072_6570_6c61_7921),
            failure_persistence: None,
            ..Config::default()
        }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn mutated_snapshots_and_traces_do_not_panic(
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
            which in 0usize..2,
        ) {
            let path = [
                "ground-truth/memory_snapshots/silmont2000__assignment2-systems/mem_snapshot.pickle.gz",
                "ground-truth/kineto_traces/AMD-AGI__TraceLens/h100__gaunernst_bert-small-uncased__1016001.json.gz",
            ][which];
            let data = gunzip(&common::read_shared(path)).unwrap().into_owned();
            let mut bytes = data.clone();
            for (i, b) in &edits {
                let at = i.index(bytes.len());
                bytes[at] = *b;
            }
            let _ = replay(&bytes);
            let _ = replay(&data[..cut.index(data.len())]);
        }
    }
}

mod devices {
    //! Several devices: no shared recording has more than one device with
    //! data (the multi-GPU snapshots keep empty traces for the others), so
    //! these recordings are built from shared ones: each file's device
    //! becomes one device of a combined recording, at device numbers with a
    //! gap, and must replay exactly as it does alone.

    use memcast::replay::{read_snapshot, replay, replay_recording, DeviceReplay, Snapshot};
    use memcast::trace::gunzip;
    use memcast::Bytes;

    use crate::common;

    const SMALL: &str =
        "ground-truth/memory_snapshots/silmont2000__assignment2-systems/mem_snapshot.pickle.gz";
    const REPAIRED: &str = "ground-truth/memory_snapshots/Wedsonlin__assignment2-systems/results__medium_512_training_memory_snapshot.pickle.gz";
    /// Segments (75.9 GB reserved) and no trace entries.
    const NO_EVENTS: &str =
        "ground-truth/memory_snapshots/kkaitlyn111__cs336-a2-systems/memory_snapshot.pickle.gz";

    fn snapshot(path: &str) -> Snapshot {
        read_snapshot(&gunzip(&common::read_shared(path)).unwrap()).unwrap()
    }

    /// A file's one device, replayed alone, as device `device`.
    fn alone(path: &str, device: i64) -> DeviceReplay {
        let mut r = replay(&common::read_shared(path)).unwrap();
        assert_eq!(r.devices.len(), 1, "{path}");
        r.largest.device = device;
        r.largest
    }

    #[test]
    fn every_device_of_a_snapshot_is_replayed_on_its_own() {
        let mut combined = snapshot(SMALL);
        for (path, device) in [(REPAIRED, 3), (NO_EVENTS, 5)] {
            let mut other = snapshot(path);
            assert_eq!(other.devices.len(), 1, "{path}");
            let mut d = other.devices.remove(0);
            d.device = device;
            combined.devices.push(d);
        }
        let r = replay_recording(&combined).unwrap();
        let ids: Vec<i64> = r.devices.iter().map(|d| d.device).collect();
        assert_eq!(ids, [0, 3, 5]);
        assert_eq!(r.devices[0], alone(SMALL, 0));
        assert_eq!(r.devices[1], alone(REPAIRED, 3));
        assert_eq!(r.devices[2], alone(NO_EVENTS, 5));
        assert!(r.is_exact(), "{r:#?}");
        // The device without trace entries holds the most: its reserved bytes
        // are its real and simulated peak, and it is the top level.
        let reserved: u64 = combined.devices[2].segments.iter().map(|s| s.size).sum();
        assert_eq!(reserved, 75_902_222_336);
        assert_eq!(r.largest, r.devices[2]);
        assert_eq!(r.largest.events, 0);
        assert_eq!(r.largest.real_peak_reserved_bytes, Bytes(reserved));
        assert_eq!(r.largest.simulated_peak_reserved_bytes, Bytes(reserved));
        // The JSON keeps the top-level fields and adds `devices`.
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["device"], 5);
        assert_eq!(v["real_peak_reserved_bytes"], reserved);
        assert_eq!(v["devices"][1]["start_state_repairs"], 3);
        let back: memcast::replay::ReplayReport = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn every_device_of_a_profiler_trace_is_replayed_on_its_own() {
        let paths = [
            "ground-truth/kineto_traces/AMD-AGI__TraceLens/h100__gaunernst_bert-small-uncased__1016001.json.gz",
            "ground-truth/kineto_traces/AMD-AGI__TraceLens/h100__Falconsai_nsfw_image_detection__1016002.json.gz",
        ];
        let read = |path: &str| -> serde_json::Value {
            serde_json::from_slice(&gunzip(&common::read_shared(path)).unwrap()).unwrap()
        };
        let mut combined = read(paths[0]);
        let mut second = read(paths[1]);
        let moved: Vec<serde_json::Value> = second["traceEvents"]
            .as_array_mut()
            .unwrap()
            .drain(..)
            .filter(|e| e["name"] == "[memory]")
            .map(|mut e| {
                if e["args"]["Device Type"] == 1 {
                    e["args"]["Device Id"] = 2.into();
                }
                e
            })
            .collect();
        combined["traceEvents"]
            .as_array_mut()
            .unwrap()
            .extend(moved);
        let r = replay(&serde_json::to_vec(&combined).unwrap()).unwrap();
        let ids: Vec<i64> = r.devices.iter().map(|d| d.device).collect();
        assert_eq!(ids, [0, 2]);
        assert_eq!(r.devices[0], alone(paths[0], 0));
        assert_eq!(r.devices[1], alone(paths[1], 2));
        let largest = r
            .devices
            .iter()
            .max_by_key(|d| d.real_peak_reserved_bytes)
            .unwrap();
        assert_eq!(&r.largest, largest);
    }
}
