//! CPU-autocast traces (bf16, recorded with `tracegen/profile_cpu.py
//! --autocast bf16`, in `tests/data/traces/`) estimated as CUDA autocast runs
//! them (issue 16): the regions the analyzer finds, the rules that act, and
//! the estimate against the trace's own dtypes.

use memcast::analyzer::{self, Analysis, GradMode};
use memcast::autocast::Dtype;
use memcast::orchestrator::{self, AutocastMode, RuleId};
use memcast::trace::Trace;
use memcast::{Config, Prepared};

fn data_trace(name: &str) -> Trace {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/traces")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|err| panic!("{path:?}: {err}"));
    memcast::trace::parse(&bytes).unwrap().value
}

fn config(mode: AutocastMode) -> Config {
    let mut config = Config::standard();
    config.orchestrator.autocast.mode = mode;
    config
}

fn prepare(trace: &Trace, config: &Config) -> Prepared {
    crate::common::prepare_parsed(trace.clone(), config)
}

fn analysis(trace: &Trace) -> Analysis {
    analyzer::analyze(trace, &Config::standard().analyzer)
        .unwrap()
        .value
}

fn rule_blocks(prepared: &Prepared, rule: RuleId) -> u32 {
    prepared
        .orchestrated
        .facts
        .rule_counts
        .iter()
        .find(|c| c.rule == rule)
        .map_or(0, |c| c.blocks)
}

#[test]
fn each_iteration_of_a_no_grad_gpt2_is_one_bf16_region_translated_to_cuda() {
    let trace = data_trace("gpt2_bf16_nograd.json.gz");
    let a = analysis(&trace);
    assert_eq!(a.autocast.len(), 3, "{:?}", a.autocast);
    assert!(a
        .autocast
        .iter()
        .all(|r| r.grad == GradMode::NoGrad && r.lower == Some(Dtype::Bf16)));
    let cuda = prepare(&trace, &config(AutocastMode::AsTraced));
    // CUDA runs softmax, the layer norms and the GELU's pow in fp32.
    assert!(rule_blocks(&cuda, RuleId::AutocastFp32Ops) > 0);
    assert!(cuda
        .warnings
        .iter()
        .any(|w| w.code == "autocast_translated"));
    let traced = prepare(&trace, &config(AutocastMode::Off));
    assert!(RuleId::AUTOCAST
        .iter()
        .all(|&rule| rule_blocks(&traced, rule) == 0));
    assert!(traced
        .warnings
        .iter()
        .all(|w| w.code != "autocast_translated"));
    // fp32 outputs only grow what CUDA holds.
    let peak = |p: &Prepared| {
        memcast::estimate(p, &Config::standard(), &mut |_| {})
            .unwrap()
            .value
            .peak
            .allocated_bytes
    };
    assert!(peak(&cuda) >= peak(&traced));
}

#[test]
fn a_resnet_training_region_records_autograd_and_backward_follows_the_forward() {
    let trace = data_trace("resnet18_bf16_train.json.gz");
    let a = analysis(&trace);
    assert!(!a.autocast.is_empty());
    assert!(a
        .autocast
        .iter()
        .all(|r| r.grad == GradMode::Enabled && r.lower == Some(Dtype::Bf16)));
    let cuda = prepare(&trace, &config(AutocastMode::AsTraced));
    cuda.orchestrated.schedule.check().unwrap();
    // CPU autocast lists `cross_entropy_loss` as fp32 and copies the bf16
    // logits to fp32; CUDA does not list it (its `log_softmax` writes fp32
    // from bf16 directly): one dropped copy per simulated iteration.
    assert_eq!(rule_blocks(&cuda, RuleId::AutocastCpuOnlyCasts), 3);
    // Backward blocks of the ops whose outputs changed type follow them.
    assert!(rule_blocks(&cuda, RuleId::AutocastBackward) > 0);
    // The same trace gives the same schedule (no hash-map order).
    let again = prepare(&trace, &config(AutocastMode::AsTraced));
    assert_eq!(cuda.orchestrated, again.orchestrated);
}

#[test]
fn fp16_has_bf16_sizes_and_a_grad_scaler_adds_its_state() {
    let trace = data_trace("resnet18_bf16_train.json.gz");
    let bf16 = prepare(&trace, &config(AutocastMode::AsTraced));
    let mut fp16_config = config(AutocastMode::AsTraced);
    fp16_config.orchestrator.autocast.dtype = Some(Dtype::F16);
    let fp16 = prepare(&trace, &fp16_config);
    assert_eq!(bf16.orchestrated.schedule, fp16.orchestrated.schedule);
    fp16_config.orchestrator.autocast.grad_scaler = true;
    let scaled = prepare(&trace, &fp16_config);
    assert!(rule_blocks(&scaled, RuleId::GradScalerState) > 0);
    assert_eq!(
        scaled.orchestrated.schedule.blocks.len(),
        fp16.orchestrated.schedule.blocks.len()
            + rule_blocks(&scaled, RuleId::GradScalerState) as usize
    );
}

#[test]
fn an_autocast_trace_has_no_precision_what_if_and_an_fp32_one_has() {
    let trace = data_trace("gpt2_bf16_nograd.json.gz");
    let mut config = Config::standard();
    config.orchestrator.autocast.what_if = true;
    let prepared = prepare(&trace, &config);
    assert!(prepared.autocast.is_none());
    let err = memcast::whatif::precision::compare(&prepared, &config).unwrap_err();
    assert!(matches!(err, memcast::whatif::WhatIfError::AlreadyAutocast));
    let a = analysis(&trace);
    assert!(
        orchestrator::orchestrate_under_autocast(&a, &Config::standard().orchestrator).is_none()
    );
    // An fp32 trace: its what-if job is made only when asked for.
    let fp32 = data_trace("resnet18_lightning_sgd_bs4.json.gz");
    assert!(prepare(&fp32, &config).autocast.is_some());
    let plain = prepare(&fp32, &Config::standard());
    assert!(plain.autocast.is_none());
    let err = memcast::whatif::precision::compare(&plain, &config).unwrap_err();
    assert!(matches!(err, memcast::whatif::WhatIfError::NoAutocastJob));
}

/// The estimate of a trace in `tests/data/traces-autocast` (GPT-2, 2 layers,
/// batch 2, 32 tokens, each mode traced in fp32 and under CPU autocast bf16
/// with `tracegen/profile_cpu.py`).
fn twin(mode: &str, autocast: &str) -> (Prepared, memcast::report::Report) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/traces-autocast")
        .join(format!("gpt2_{mode}_{autocast}.json.gz"));
    let bytes = std::fs::read(&path).unwrap_or_else(|err| panic!("{path:?}: {err}"));
    let config = Config::standard();
    let trace = memcast::trace::parse(&bytes).unwrap().value;
    let prepared = prepare(&trace, &config);
    let report = memcast::estimate(&prepared, &config, &mut |_| {})
        .unwrap()
        .value;
    (prepared, report)
}

/// Mixed precision changes activations, never the model's state (issue 25):
/// in every mode the bf16 twin has the fp32 trace's parameters, buffers and
/// run kind, and in training the same gradients and AdamW state at the
/// peak. Under `no_grad` the weight casts stay cached until autocast exits;
/// under `inference_mode` (PyTorch ≥ 2.10) nothing is cached, so the
/// inference_mode twin holds less than the no_grad one.
#[test]
fn bf16_twins_keep_the_fp32_state_and_only_no_grad_caches_weight_casts() {
    let mut activations = std::collections::BTreeMap::new();
    for mode in ["no_grad", "inference_mode", "eval_grad", "train"] {
        let (p32, r32) = twin(mode, "none");
        let (p16, r16) = twin(mode, "bf16");
        assert_eq!(p16.state, p32.state, "{mode}");
        assert_eq!(p16.run_kind, p32.run_kind, "{mode}");
        let (a, b) = (&r16.breakdown_at_peak, &r32.breakdown_at_peak);
        if mode == "train" {
            assert_eq!(a.gradients, b.gradients, "{mode}");
            assert_eq!(a.optimizer_state, b.optimizer_state, "{mode}");
            assert!(a.optimizer_state.get() > 0);
        }
        activations.insert(mode, r16.peak.allocated_bytes.get());
    }
    assert!(
        activations["no_grad"] > activations["inference_mode"],
        "{activations:?}"
    );
}
