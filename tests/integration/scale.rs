//! Trace small, run big (issue 24): the same job traced at several depths
//! and lengths (`shared/fixtures/traces-depth`, `JOB_seqS_LN`). The smallest
//! trace rebuilt with `--layers N` / `--seq-len S` must give the estimate of
//! the trace made that way (peak reserved within 0.5 %, the parameters of
//! the deeper model exactly), from one trace and from two given together.

use std::collections::BTreeMap;

use memcast::report::Report;
use memcast::scale::{self, Target};
use memcast::trace::{SliceSource, TraceSource};
use memcast::{Config, Prepared, Settings};

use crate::common::{fixtures_in, read_shared};

/// The settings every comparison uses: one GPU, the rest at defaults.
fn settings(layers: Option<u32>, seq_len: Option<u32>) -> Settings {
    Settings {
        gpus: vec!["a100-80gb".to_owned()],
        layers,
        seq_len,
        ..Settings::default()
    }
}

/// One or more fixtures (paths under `shared/`) prepared together.
fn prepare(paths: &[&str], config: &Config) -> Result<Prepared, memcast::Error> {
    let bytes: Vec<Vec<u8>> = paths.iter().map(|p| read_shared(p)).collect();
    let mut sources: Vec<SliceSource> = bytes.iter().map(|b| SliceSource::new(b)).collect();
    let mut dyns: Vec<&mut dyn TraceSource> = sources
        .iter_mut()
        .map(|s| s as &mut dyn TraceSource)
        .collect();
    memcast::pipeline::prepare_many_from(&mut dyns, config, &mut |_| {})
}

/// The estimate of one or more fixtures (paths under `shared/`).
fn estimate(paths: &[&str], layers: Option<u32>, seq_len: Option<u32>) -> Report {
    let config: Config = settings(layers, seq_len).config().unwrap();
    let prepared = prepare(paths, &config).unwrap_or_else(|err| panic!("{paths:?}: {err}"));
    memcast::estimate(&prepared, &config, &mut |_| {})
        .unwrap()
        .value
}

/// `JOB_seqS_LN` → (job, S, N) for every depth fixture.
fn groups() -> BTreeMap<(String, u32, u32), String> {
    let mut out = BTreeMap::new();
    for path in fixtures_in("traces-depth") {
        let name = path
            .rsplit('/')
            .next()
            .unwrap()
            .trim_end_matches(".json.gz")
            .to_owned();
        let (rest, layers) = name.rsplit_once("_L").unwrap();
        let (job, seq) = rest.rsplit_once("_seq").unwrap();
        out.insert(
            (
                job.to_owned(),
                seq.parse().unwrap(),
                layers.parse().unwrap(),
            ),
            path,
        );
    }
    out
}

fn within(label: &str, got: &Report, want: &Report, percent: f64) {
    let (a, b) = (
        got.peak.reserved_bytes.get() as f64,
        want.peak.reserved_bytes.get() as f64,
    );
    let off = 100.0 * (a - b) / b;
    assert!(
        off.abs() <= percent,
        "{label}: peak reserved {a} vs {b} ({off:+.2} %)"
    );
}

#[test]
fn a_shallow_trace_with_more_layers_is_the_deeper_trace() {
    let groups = groups();
    let mut checked = 0;
    let mut depth: BTreeMap<(String, u32), Vec<u32>> = BTreeMap::new();
    for (job, seq, layers) in groups.keys() {
        depth.entry((job.clone(), *seq)).or_default().push(*layers);
    }
    for ((job, seq), layers) in depth.into_iter().filter(|(_, l)| l.len() > 1) {
        let shallow = &groups[&(job.clone(), seq, layers[0])];
        for &n in &layers[1..] {
            let deep = estimate(&[&groups[&(job.clone(), seq, n)]], None, None);
            let scaled = estimate(&[shallow], Some(n), None);
            let label = format!("{job}_seq{seq}: L{} with --layers {n}", layers[0]);
            within(&label, &scaled, &deep, 0.5);
            assert_eq!(
                scaled.breakdown_at_peak.parameters, deep.breakdown_at_peak.parameters,
                "{label}: parameters"
            );
            let facts = scaled.summary.scaled.depth.as_ref().unwrap();
            assert_eq!((facts.traced, facts.estimated), (layers[0], n), "{label}");
            checked += 1;
        }
    }
    assert!(checked >= 6, "{checked} depth pairs");
}

#[test]
fn a_short_trace_at_a_longer_length_is_the_longer_trace() {
    let groups = groups();
    let mut length: BTreeMap<(String, u32), Vec<u32>> = BTreeMap::new();
    for (job, seq, layers) in groups.keys() {
        length.entry((job.clone(), *layers)).or_default().push(*seq);
    }
    let mut checked = 0;
    for ((job, layers), seqs) in length.into_iter().filter(|(_, s)| s.len() > 2) {
        let path = |s: u32| groups[&(job.clone(), s, layers)].as_str();
        for &s in &seqs[1..] {
            let real = estimate(&[path(s)], None, None);
            let one = estimate(&[path(seqs[0])], None, Some(s));
            within(
                &format!("{job}_L{layers}: seq{} → {s}", seqs[0]),
                &one,
                &real,
                0.5,
            );
            let facts = one.summary.scaled.length.as_ref().unwrap();
            assert_eq!(facts.method, "shapes");
            if s > seqs[1] {
                let two = estimate(&[path(seqs[0]), path(seqs[1])], None, Some(s));
                within(
                    &format!("{job}_L{layers}: seq{} + seq{} → {s}", seqs[0], seqs[1]),
                    &two,
                    &real,
                    0.5,
                );
                assert_eq!(two.summary.scaled.length.as_ref().unwrap().method, "fit");
            }
            checked += 1;
        }
    }
    assert!(checked >= 6, "{checked} length pairs");
}

#[test]
fn depth_and_length_together_in_either_order() {
    // llama-small: 2 layers at 64 tokens → 3 layers at 128 tokens, rebuilt
    // length first (the pipeline's order) and depth first.
    let trace = |p: &str| memcast::trace::parse(&read_shared(p)).unwrap().value;
    let base = trace("fixtures/traces-depth/llama-small_adamw_bs4_seq64_L2.json.gz");
    let only = |layers, seq_len| Target {
        layers,
        seq_len,
        new_tokens: None,
    };
    let length_first = scale::scale(&base, &only(None, Some(128))).unwrap().value.0;
    let length_first = scale::scale(&length_first, &only(Some(3), None))
        .unwrap()
        .value
        .0;
    let depth_first = scale::scale(&base, &only(Some(3), None)).unwrap().value.0;
    let depth_first = scale::scale(&depth_first, &only(None, Some(128)))
        .unwrap()
        .value
        .0;
    let config = settings(None, None).config().unwrap();
    let run = |t| {
        let prepared = crate::common::prepare_parsed(t, &config);
        memcast::estimate(&prepared, &config, &mut |_| {})
            .unwrap()
            .value
    };
    let (a, b) = (run(length_first), run(depth_first));
    within("length then depth vs depth then length", &a, &b, 0.5);
    // And both as one setting, against the trace made at 3 layers and 128
    // tokens' parts: its parameters are the 3-layer model's.
    let both = estimate(
        &["fixtures/traces-depth/llama-small_adamw_bs4_seq64_L2.json.gz"],
        Some(3),
        Some(128),
    );
    within("--layers 3 --seq-len 128", &both, &a, 0.5);
    assert_eq!(both.breakdown_at_peak.parameters.get(), 272_126_976);
}

#[test]
fn traces_of_different_jobs_or_lengths_are_refused_with_the_reason() {
    let config = settings(None, Some(256)).config().unwrap();
    let run = |paths: &[&str]| {
        prepare(paths, &config)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let llama = "fixtures/traces-depth/llama-small_adamw_bs4_seq64_L2.json.gz";
    let gpt2 = "fixtures/traces-depth/gpt2_nograd_bs4_seq128_L2.json.gz";
    let message = run(&[llama, gpt2]);
    assert!(message.contains("not the same job"), "{message}");
    let message = run(&[llama, llama]);
    assert!(message.contains("same sequence length"), "{message}");
}

#[test]
fn the_report_says_what_the_trace_is_and_what_was_rebuilt() {
    let report = estimate(
        &["fixtures/traces-depth/t5-small_adamw_bs4_seq64_L2.json.gz"],
        Some(4),
        None,
    );
    let traced = &report.summary.traced;
    assert_eq!(traced.block.as_deref(), Some("T5Block"));
    assert_eq!((traced.layers, traced.stacks), (Some(2), Some(2)));
    assert_eq!((traced.seq_len, traced.batch), (Some(64), Some(4)));
    let depth = report.summary.scaled.depth.as_ref().unwrap();
    let parents: Vec<&str> = depth.stacks.iter().map(|s| s.parent.as_str()).collect();
    assert_eq!(parents, ["T5Stack_0", "T5Stack_1"]);
    assert!(depth.stacks.iter().all(|s| s.bytes_per_call.get() > 0));
    assert!(report
        .warnings
        .iter()
        .any(|w| w.code == "scaled" && w.message.contains("4 blocks of T5Block")));
}

#[test]
fn a_rebuilt_estimate_matches_its_snapshot() {
    // llama-small traced at 2 layers and 32 tokens, estimated at 8 layers and
    // 512 tokens: the whole report, as `memcast estimate --json` prints it.
    let mut report = estimate(
        &["fixtures/traces-depth/llama-small_adamw_bs4_seq32_L2.json.gz"],
        Some(8),
        Some(512),
    );
    crate::cli_terms::report(&mut report);
    insta::assert_json_snapshot!("scaled_llama-small_seq32_L2_to_L8_seq512", report);
}

/// The estimate of a trace in `tests/data/traces-scaled`.
fn estimate_data(trace: &str, settings: &Settings) -> Report {
    let path = format!(
        "{}/tests/data/traces-scaled/{trace}",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let config = settings.config().unwrap();
    memcast::run(&bytes, &config, &mut |_| {}).unwrap().value
}

/// An optimizer that updates one parameter at a time (the CS336 AdamW, which
/// makes its moments anew every step, torch.optim's single-tensor AdamW,
/// the HF Trainer's): a 2-block trace at 3 layers is the 3-block trace, its state and
/// step temporaries included, on the default (foreach) path and as captured.
#[test]
fn a_per_parameter_optimizer_step_is_copied_with_the_blocks() {
    let jobs = [
        ("cs336_small_L", "_train_ctx64_cs336-adamw"),
        ("cs336_small_L", "_train_ctx64_torch-adamw-single"),
        // The HF Trainer's AdamW: weights and biases in two parameter
        // groups, so the loop over the block's parameters is two runs.
        ("hf_trainer_gpt2_L", "_train_seq32"),
    ];
    for (head, tail) in jobs {
        for captured in [false, true] {
            let at = |layers: Option<u32>| Settings {
                captured_optimizer: captured,
                ..settings(layers, None)
            };
            let trace = |l: u32| format!("{head}{l}{tail}.json.gz");
            let scaled = estimate_data(&trace(2), &at(Some(3)));
            let deep = estimate_data(&trace(3), &at(None));
            let label = format!("{head}2{tail} (captured step: {captured}) with --layers 3");
            within(&label, &scaled, &deep, 0.5);
            let (a, b) = (&scaled.breakdown_at_peak, &deep.breakdown_at_peak);
            assert_eq!(a.optimizer_state, b.optimizer_state, "{label}");
            assert!(a.optimizer_state.get() > 0, "{label}");
            assert!(
                scaled
                    .warnings
                    .iter()
                    .any(|w| w.code == "layers_optimizer_loop"),
                "{label}: {:?}",
                scaled.warnings
            );
        }
    }
}

/// A real GPU run of `tests/data/scaled_gpu_pairs.json` (the CS336 2.7B LM,
/// 32 layers, recorded on a GPU) against the estimate from a 2-block CPU
/// trace, possibly at a shorter context; the peak of the whole estimate, or
/// of its iteration `compare_iteration` where the snapshot records that
/// step only.
fn real_run(index: usize, trace: &str, settings: Settings, percent: f64) {
    let pairs: serde_json::Value = serde_json::from_slice(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/scaled_gpu_pairs.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let real = pairs[index]["real_peak_reserved"].as_u64().unwrap() as f64;
    let report = estimate_data(trace, &settings);
    let got = match pairs[index]["compare_iteration"].as_u64() {
        Some(i) => report.iterations[i as usize].peak_reserved_bytes.get() as f64,
        None => report.peak.reserved_bytes.get() as f64,
    };
    let off = 100.0 * (got - real) / real;
    assert!(
        off.abs() <= percent,
        "{trace} vs {}: {got} vs {real} ({off:+.2} %)",
        pairs[index]["snapshot"]
    );
}

#[test]
fn two_blocks_at_a_short_context_estimate_real_gpu_runs_of_the_full_model() {
    let at = |gpu: &str, alloc_conf: &str, layers: u32, seq_len: Option<u32>| Settings {
        gpus: vec![gpu.to_owned()],
        alloc_conf: alloc_conf.to_owned(),
        layers: Some(layers),
        seq_len,
        ..Settings::default()
    };
    // A full AdamW (foreach) training step at 128 tokens, on an H100.
    real_run(
        0,
        "cs336_2.7B_L2_train_ctx128_fp32_adamwforeach.json.gz",
        at("h100-80gb", "", 32, None),
        1.0,
    );
    // The step at 512 tokens, from the trace at 128.
    real_run(
        4,
        "cs336_2.7B_L2_train_ctx128_fp32_adamwforeach.json.gz",
        at("a100-80gb", "", 32, Some(512)),
        1.5,
    );
    // The first step of a fresh model with a hand-written AdamW that makes
    // its moments anew each step (the snapshot holds that step only).
    real_run(
        6,
        "cs336_2.7B_L2_train_ctx128_fp32_cs336adamw.json.gz",
        at("a100-80gb", "", 32, None),
        1.0,
    );
    real_run(
        8,
        "cs336_2.7B_L2_train_ctx512_fp32_cs336adamw.json.gz",
        at("a100-80gb", "", 32, None),
        1.0,
    );
    // Under bf16 autocast (issue 25): a full AdamW step at 512 tokens and a
    // forward with autograd and no backward at 512 (the fp32 probabilities
    // go when their einsum has its bf16 copy).
    real_run(
        5,
        "cs336_2.7B_L2_train_ctx512_bf16_adamwforeach.json.gz",
        at("a100-80gb", "", 32, None),
        1.0,
    );
    real_run(
        16,
        "cs336_2.7B_L2_fwdonly_grad_ctx512_bf16.json.gz",
        at("b200", "expandable_segments:True", 32, None),
        1.0,
    );
    // bf16 no_grad forwards (the weight casts cached until autocast exits).
    real_run(
        18,
        "cs336_2.7B_L2_fwdonly_nograd_ctx512_bf16.json.gz",
        at("a100-80gb", "", 32, None),
        0.5,
    );
    real_run(
        21,
        "cs336_2.7B_L2_fwdonly_nograd_ctx128_bf16.json.gz",
        at("h100-80gb", "", 32, None),
        0.5,
    );
    // A no_grad forward at 2048 tokens, from the trace at 128, on a B200.
    real_run(
        14,
        "cs336_2.7B_L2_fwdonly_nograd_ctx128_fp32.json.gz",
        at("b200", "expandable_segments:True", 32, Some(2048)),
        1.0,
    );
}
