//! Traces made by the capture helper (`www/memcast_capture.py`): the full
//! job's figures they carry are read, the estimate answers for that job with
//! no flag (the same report as the flags give), the settings a link carries
//! say so, and the CLI says what was captured. `tests/capture/check.py` runs
//! the helper itself and compares with a trace of the full model.

use std::path::PathBuf;
use std::process::Command;

use memcast::pipeline::Settings;
use memcast::report::Report;

fn capture_trace(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/traces-capture")
        .join(name);
    assert!(path.is_file(), "missing test trace {path:?}");
    path
}

fn estimate(path: &PathBuf, settings: &Settings) -> Report {
    let bytes = std::fs::read(path).unwrap();
    let config = settings.config().unwrap();
    memcast::run(&bytes, &config, &mut |_| {})
        .unwrap_or_else(|err| panic!("{path:?}: {err}"))
        .value
}

fn a100() -> Settings {
    Settings {
        gpus: vec!["a100-80gb".into()],
        ..Settings::default()
    }
}

#[test]
fn a_captured_trace_answers_for_the_full_job_it_names() {
    let path = capture_trace("tiny-llama_train_L2.json.gz");
    let report = estimate(&path, &a100());
    let capture = report
        .summary
        .capture
        .as_deref()
        .expect("the capture figures");
    assert_eq!(
        capture.schema.as_deref(),
        Some(memcast::trace::CAPTURE_SCHEMA)
    );
    assert_eq!(capture.job.as_deref(), Some("train"));
    assert_eq!((capture.layers, capture.traced_layers), (Some(6), Some(2)));
    assert_eq!(
        (capture.seq_len, capture.traced_seq_len),
        (Some(256), Some(128))
    );
    let depth = report
        .summary
        .scaled
        .depth
        .as_ref()
        .expect("rebuilt deeper");
    assert_eq!((depth.traced, depth.estimated), (2, 6));
    let length = report
        .summary
        .scaled
        .length
        .as_ref()
        .expect("rebuilt longer");
    assert_eq!((length.traced.clone(), length.estimated), (vec![128], 256));
    // The same estimate as the flags give, and the settings adopt them.
    let explicit = Settings {
        layers: Some(6),
        seq_len: Some(256),
        ..a100()
    };
    assert_eq!(report, estimate(&path, &explicit));
    let mut adopted = a100();
    adopted.adopt_capture(report.summary.capture.as_deref());
    assert_eq!(adopted, explicit);
}

#[test]
fn the_users_figures_override_the_captured_ones() {
    let path = capture_trace("tiny-llama_train_L2.json.gz");
    let settings = Settings {
        layers: Some(2),
        seq_len: Some(128),
        ..a100()
    };
    let report = estimate(&path, &settings);
    let depth = report.summary.scaled.depth.as_ref().expect("a depth fact");
    assert_eq!(depth.estimated, 2);
    assert!(report.summary.capture.is_some());
}

#[test]
fn a_captured_generation_is_rebuilt_to_its_new_tokens() {
    let path = capture_trace("tiny-llama_generate_L2.json.gz");
    let report = estimate(&path, &a100());
    let tokens = report
        .summary
        .scaled
        .tokens
        .as_ref()
        .expect("more new tokens");
    assert_eq!((tokens.traced, tokens.estimated), (4, 16));
    let depth = report.summary.scaled.depth.as_ref().expect("more layers");
    assert_eq!(depth.estimated, 6);
    assert_eq!(
        report.summary.generation.as_ref().map(|g| g.calls),
        Some(16)
    );
}

#[test]
fn the_cli_says_what_was_captured_and_links_the_figures() {
    let path = capture_trace("tiny-llama_train_L2.json.gz");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_memcast"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let file = path.to_str().unwrap();
    let text = run(&["estimate", file, "--gpu", "a100-80gb"]);
    assert!(text.contains("captured: train of tiny"), "{text}");
    assert!(text.contains("6 layers (traced 2)"), "{text}");
    let base = "https://example.org/memcast/";
    let plain = run(&["estimate", file, "--gpu", "a100-80gb", "--link", base]);
    let explicit = run(&[
        "estimate",
        file,
        "--gpu",
        "a100-80gb",
        "--layers",
        "6",
        "--seq-len",
        "256",
        "--link",
        base,
    ]);
    assert_eq!(plain, explicit);
}
