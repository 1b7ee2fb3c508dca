//! Real GPU runs (`tests/data/gpu-h200`): the CPU trace of a job and the
//! peak its GPU run reached on an H200, both made on that machine with
//! torch 2.11 (`benches/gpu/run_pairs.py`). Each pair in `pairs.json` with a
//! `tolerance_pct` holds memcast's peak reserved within it of the real one;
//! a 2-block trace rebuilt to 4 blocks gives the 4-block trace's estimate.
//! `python3 benches/gpu/pairs.py` prints the whole table.

use std::path::{Path, PathBuf};

use memcast::report::Report;
use memcast::Settings;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpu-h200")
}

fn pairs() -> serde_json::Value {
    let path = data_dir().join("pairs.json");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_slice(&bytes).unwrap()
}

/// The `memcast estimate` arguments a pair uses, as settings.
fn settings(args: &[String]) -> Settings {
    let mut s = Settings {
        gpus: vec!["h200".to_owned()],
        ..Settings::default()
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--layers" => s.layers = it.next().and_then(|v| v.parse().ok()),
            "--new-tokens" => s.new_tokens = it.next().and_then(|v| v.parse().ok()),
            "--autocast-dtype" => s.autocast_dtype = it.next().cloned(),
            "--grad-scaler" => s.grad_scaler = true,
            "--autocast-policy" => s.autocast_policy = it.next().cloned(),
            other => panic!("pairs.json: no setting for {other}"),
        }
    }
    s
}

fn estimate(trace: &str, settings: &Settings) -> Report {
    crate::common::estimate_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join(trace), settings)
}

#[test]
fn held_pairs_are_within_their_tolerance_of_the_real_gpu() {
    let data = pairs();
    let mut failures = Vec::new();
    let mut held = 0;
    for pair in data["pairs"].as_array().unwrap() {
        let Some(tolerance) = pair["tolerance_pct"].as_f64() else {
            continue;
        };
        let name = pair["name"].as_str().unwrap();
        let args: Vec<String> = pair["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        let report = estimate(pair["trace"].as_str().unwrap(), &settings(&args));
        let got = report.peak.reserved_bytes.get() as f64;
        let real = pair["real_peak_reserved"].as_f64().unwrap();
        let off = 100.0 * (got - real) / real;
        if off.abs() > tolerance {
            failures.push(format!(
                "{name}: peak reserved {got} vs real {real} ({off:+.2} %, held to {tolerance} %)"
            ));
        }
        held += 1;
    }
    assert!(held >= 20, "{held} pairs held");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The checkpointed jobs at 2 and 4 blocks (both kinds of checkpointing, a
/// 24-layer BERT-large shape with accumulation, bf16 autocast): the 2-block
/// trace with 4 layers is the 4-block trace, parameters exact.
#[test]
fn checkpointed_jobs_rebuilt_from_two_blocks_are_the_four_block_traces() {
    let dir = "tests/data/gpu-h200";
    for job in [
        "llama-small_adamw_ckpt",
        "llama-small_adamw_ckptre",
        "bert-base-cls_adamw_bf16_ckptre",
        "bertL_ga4_ckptre_bs1_seq512",
    ] {
        let deep = estimate(
            &format!("{dir}/{job}_L4.json.gz"),
            &settings(&["--autocast-policy".to_owned(), "2.10".to_owned()]),
        );
        let scaled = estimate(
            &format!("{dir}/{job}_L2.json.gz"),
            &settings(&[
                "--layers".to_owned(),
                "4".to_owned(),
                "--autocast-policy".to_owned(),
                "2.10".to_owned(),
            ]),
        );
        let (a, b) = (
            scaled.peak.reserved_bytes.get() as f64,
            deep.peak.reserved_bytes.get() as f64,
        );
        let off = 100.0 * (a - b) / b;
        assert!(off.abs() <= 0.5, "{job}: {a} vs {b} ({off:+.2} %)");
        assert_eq!(
            scaled.breakdown_at_peak.parameters, deep.breakdown_at_peak.parameters,
            "{job}: parameters"
        );
        assert_eq!(
            scaled.breakdown_at_peak.optimizer_state, deep.breakdown_at_peak.optimizer_state,
            "{job}: optimizer state"
        );
    }
}
