//! Replay: every real file in `shared/ground-truth` replayed through the
//! simulator, compared with the figures committed in
//! `tests/data/replay-expected.tsv`, so a change that makes the simulator
//! less faithful fails; plus the `memcast replay` command line.
//!
//! To regenerate the table after an intended change, run
//! `memcast replay --json` on every file and rewrite the columns (events,
//! compared, reserved_exact, allocated_exact, allocs, address_exact, seg_real,
//! seg_matched, seg_simulated, real_peak, sim_peak, repairs).

// Test helpers below panic on bad fixtures by design, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use memcast::replay::{replay, ReplayKind, ReplayReport};

use crate::common;

fn figures(r: &ReplayReport) -> Vec<String> {
    let kind = match r.kind {
        ReplayKind::Snapshot => "snapshot",
        ReplayKind::Profiler => "profiler",
    };
    let allocated = r
        .allocated_exact_events
        .map_or("-".to_owned(), |a| a.to_string());
    let mut out = vec![kind.to_owned()];
    out.extend([r.events, r.compared_events, r.reserved_exact_events].map(|v| v.to_string()));
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
                v.extend(std::iter::repeat_n("-".to_owned(), 11));
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
        let (compared, rex, allocs, aex, sreal, smatch, ssim, rpeak, speak) =
            (n[1], n[2], n[4], n[5], n[6], n[7], n[8], n[9], n[10]);
        assert_eq!(rex, compared, "{path}: reserved");
        assert_eq!(aex, allocs, "{path}: addresses");
        assert_eq!((smatch, ssim), (sreal, sreal), "{path}: segment events");
        assert_eq!(speak, rpeak, "{path}: peak");
        totals[0] += compared;
        totals[1] += allocs;
        totals[2] += sreal;
        totals[3] += 1;
    }
    assert_eq!(totals, [1_104_754, 381_900, 15_182, 152]);
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
