//! The model's resident state (issues 12, 14, 19): every parameter with or
//! without a gradient, the buffers, the run kind, optimizer state made before
//! the trace, DDP's buckets and parameter sizes without `record_shapes`,
//! checked against the facts each fixture's `.meta.json` records
//! (`../shared/fixtures/traces-nograd/README.md`).

use std::io::{Read as _, Write as _};

use memcast::analyzer::{self, Analysis, RunKind};
use memcast::orchestrator::{Category, EventKind, OrchestrateError, Phase, Schedule, BUCKET_OP};
use memcast::{Bytes, Config, Prepared};

use crate::common;

fn config() -> Config {
    Config::for_gpus("a100-80gb", &["a100-80gb".to_owned()]).unwrap()
}

fn meta_of(relative: &str) -> serde_json::Value {
    let path = relative.trim_end_matches(".json.gz").to_owned() + ".meta.json";
    serde_json::from_slice(&common::read_shared(&path)).unwrap()
}

fn analysis_of(bytes: &[u8]) -> Analysis {
    let trace = memcast::trace::parse(bytes).unwrap().value;
    analyzer::analyze(&trace, &config().analyzer).unwrap().value
}

fn bytes_of(meta: &serde_json::Value, key: &str) -> Bytes {
    Bytes(
        meta[key]
            .as_u64()
            .unwrap_or_else(|| panic!("no {key} in the sidecar")),
    )
}

/// The bytes of one category allocated at setup (before the first iteration).
fn setup_bytes(schedule: &Schedule, category: Category) -> Bytes {
    schedule
        .blocks
        .iter()
        .filter(|b| b.category == category && b.phase == Phase::Setup)
        .map(|b| b.size)
        .sum()
}

const NOGRAD: [&str; 5] = [
    "bert-base-cls_evalgrad_bs8",
    "distilgpt2_lora_adamw_bs8",
    "mobilenet_v2_nograd_bs32",
    "resnet18_frozen_sgd_bs16",
    "t5-small_inference_mode_bs8",
];

/// Every parameter of a forward-only or partly frozen run is found from the
/// forward's reads, each once (tied weights, transposes, several calls), and
/// split into trainable and frozen by AccumulateGrad; the run kind follows
/// the grad mode and the backward.
#[test]
fn every_parameter_is_found_with_or_without_a_gradient() {
    for name in NOGRAD {
        let path = format!("fixtures/traces-nograd/{name}.json.gz");
        let meta = meta_of(&path);
        let bytes = common::read_shared(&path);
        let analysis = analysis_of(&bytes);
        let totals = analysis.state.totals;
        assert_eq!(totals.parameters, bytes_of(&meta, "param_bytes"), "{name}");
        assert_eq!(
            totals.trainable,
            bytes_of(&meta, "trainable_param_bytes"),
            "{name}"
        );
        assert_eq!(
            totals.frozen,
            bytes_of(&meta, "frozen_param_bytes"),
            "{name}"
        );
        let expected = match meta["mode"].as_str().unwrap() {
            "lora" | "frozen" => RunKind::FineTuning,
            "eval_grad" => RunKind::ForwardWithAutograd,
            "no_grad" | "inference_mode" => RunKind::Inference,
            other => panic!("{name}: unknown mode {other}"),
        };
        assert_eq!(analysis.state.run_kind, expected, "{name}");

        // The schedule holds every parameter from the start, the buffers the
        // sidecar counts, and gradients/optimizer state only when training.
        let prepared = memcast::prepare(&bytes, &config(), &mut |_| {}).unwrap();
        let schedule = &prepared.orchestrated.schedule;
        assert_eq!(
            setup_bytes(schedule, Category::Parameter),
            bytes_of(&meta, "param_bytes"),
            "{name}"
        );
        assert_eq!(prepared.parameter_bytes, bytes_of(&meta, "param_bytes"));
        assert_eq!(
            prepared.state.frozen_bytes,
            bytes_of(&meta, "frozen_param_bytes"),
            "{name}"
        );
        assert_eq!(
            prepared.state.buffer_bytes,
            bytes_of(&meta, "buffer_bytes"),
            "{name}"
        );
        if !expected.trains() {
            assert_eq!(
                common::category_bytes(schedule, Category::Gradient),
                Bytes::ZERO
            );
            assert_eq!(
                common::category_bytes(schedule, Category::OptimizerState),
                Bytes::ZERO
            );
        }
    }
}

/// The user's figures replace the trace's: the total, or the frozen part;
/// a frozen part above the total is refused.
#[test]
fn the_parameter_bytes_given_replace_the_trace() {
    let path = "fixtures/traces-nograd/resnet18_frozen_sgd_bs16.json.gz";
    let meta = meta_of(path);
    let bytes = common::read_shared(path);
    let trainable = bytes_of(&meta, "trainable_param_bytes");
    let prepare = |total: Option<u64>, frozen: Option<u64>| {
        let mut config = config();
        config.orchestrator.parameters.total = total.map(Bytes);
        config.orchestrator.parameters.frozen = frozen.map(Bytes);
        memcast::prepare(&bytes, &config, &mut |_| {})
    };
    let given = 100 * Bytes::MIB;
    let prepared: Prepared = prepare(Some(given), None).unwrap();
    assert_eq!(prepared.parameter_bytes, Bytes(given));
    assert_eq!(prepared.state.trainable_bytes, trainable);
    assert_eq!(
        setup_bytes(&prepared.orchestrated.schedule, Category::Parameter),
        Bytes(given)
    );
    assert!(prepared
        .warnings
        .iter()
        .any(|w| w.code == "parameters_from_user"));
    let prepared = prepare(None, Some(given)).unwrap();
    assert_eq!(prepared.parameter_bytes, trainable + Bytes(given));
    match prepare(Some(1), Some(2)) {
        Err(memcast::Error::Orchestrate(OrchestrateError::ParameterOverrideInconsistent {
            ..
        })) => {}
        other => panic!("{:?}", other.map(|p| p.parameter_bytes)),
    }
}

/// `fixture` with every op's shapes and the `record_shapes` flag removed, as
/// `torch.profiler.profile(record_shapes=False)` writes it.
fn without_shapes(relative: &str) -> Vec<u8> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(&common::read_shared(relative)[..])
        .read_to_string(&mut text)
        .unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    // torch.profiler writes the flag only when it is on.
    json.as_object_mut().unwrap().remove("record_shapes");
    for event in json["traceEvents"].as_array_mut().unwrap() {
        if let Some(args) = event.get_mut("args").and_then(|a| a.as_object_mut()) {
            for key in [
                "Input Dims",
                "Input type",
                "Input Strides",
                "Concrete Inputs",
            ] {
                args.remove(key);
            }
        }
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(serde_json::to_string(&json).unwrap().as_bytes())
        .unwrap();
    gz.finish().unwrap()
}

/// Without shapes, trainable parameters are sized by their gradient blocks
/// (exact for a training run); a run whose parameters get no gradient
/// cannot be sized, and the estimate says so instead of leaving them out.
#[test]
fn without_shapes_parameters_come_from_gradients_or_are_refused() {
    let path = "fixtures/traces-options/resnet18_adamw_bs16_noshapes.json.gz";
    let meta = meta_of(path);
    let bytes = common::read_shared(path);
    let prepared = memcast::prepare(&bytes, &config(), &mut |_| {}).unwrap();
    assert_eq!(prepared.parameter_bytes, bytes_of(&meta, "param_bytes"));
    assert!(prepared
        .warnings
        .iter()
        .any(|w| w.code == "parameters_from_gradients"));

    let forward_only = without_shapes("fixtures/traces-nograd/mobilenet_v2_nograd_bs32.json.gz");
    match memcast::prepare(&forward_only, &config(), &mut |_| {}) {
        Err(memcast::Error::Orchestrate(OrchestrateError::ParametersUnknown)) => {}
        other => panic!("{:?}", other.map(|p| p.parameter_bytes)),
    }
    // Allocation-only ops record no shapes even with record_shapes on: a
    // trace of only those is estimated (with no parameters), not refused.
    let memory = |ts: u32, bytes: i64| {
        format!(
            r#"{{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": {ts},
                "args": {{"Addr": 100, "Bytes": {bytes}, "Total Allocated": 0, "Total Reserved": 0,
                          "Device Type": 0, "Device Id": -1}}}}"#
        )
    };
    let bare = format!(
        r#"{{"traceEvents": [
            {{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 1000, "args": {{}}}},
            {{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 5, "dur": 10, "args": {{}}}},
            {}, {}]}}"#,
        memory(10, 64),
        memory(20, -64)
    );
    let prepared = memcast::prepare(bare.as_bytes(), &config(), &mut |_| {}).unwrap();
    assert_eq!(prepared.parameter_bytes, Bytes::ZERO);
    // The user's figure is the way out.
    let mut config = config();
    config.orchestrator.parameters.total = Some(Bytes(14_019_488));
    let prepared = memcast::prepare(&forward_only, &config, &mut |_| {}).unwrap();
    assert_eq!(prepared.parameter_bytes, Bytes(14_019_488));
}

/// Optimizer state made before the trace (a profiler schedule's unrecorded
/// steps, the HF Trainer's, a compiled model's warm-up): k tensors per
/// trainable parameter, k from the optimizer class and what its step runs
/// (Adam/AdamW 2, SGD with momentum 1, Adagrad 1), made where the job made
/// it — at its first optimizer step, since torch.optim builds state lazily in
/// `step()`; Adagrad's in its constructor, at setup — and kept.
#[test]
fn optimizer_state_made_before_the_trace_is_made_where_the_job_made_it() {
    for (path, per_parameter, phase) in [
        (
            "traces-recipes/resnet18_adam_bs8_sched",
            2,
            Phase::OptimizerStep,
        ),
        (
            "traces-recipes/distilgpt2_trainer_bs8",
            2,
            Phase::OptimizerStep,
        ),
        (
            "traces-recipes/distilgpt2_trainer_bs4_accum2",
            2,
            Phase::OptimizerStep,
        ),
        (
            "traces-recipes/resnet18_sgd_bs8_compile",
            1,
            Phase::OptimizerStep,
        ),
        ("traces/mnasnet0_5_adagrad_bs32_pos0", 1, Phase::Setup),
    ] {
        let path = format!("fixtures/{path}.json.gz");
        let meta = meta_of(&path);
        let trainable = bytes_of(&meta, "trainable_param_bytes");
        let prepared =
            memcast::prepare(&common::read_shared(&path), &config(), &mut |_| {}).unwrap();
        let schedule = &prepared.orchestrated.schedule;
        let state = pre_trace_state(schedule);
        assert!(state.iter().all(|&(_, p, _)| p == phase), "{path}");
        assert!(state.iter().all(|&(_, _, freed)| !freed), "{path}");
        let total: Bytes = state.iter().map(|&(size, _, _)| size).sum();
        assert_eq!(total, Bytes(trainable.get() * per_parameter), "{path}");
    }
    // A trace whose first step makes the state has none before it.
    let path = "fixtures/traces-recipes/resnet18_adam_bs8_plain.json.gz";
    let prepared = memcast::prepare(&common::read_shared(path), &config(), &mut |_| {}).unwrap();
    assert!(pre_trace_state(&prepared.orchestrated.schedule).is_empty());
}

/// The blocks of optimizer state made before the trace: size, phase, and
/// whether the schedule frees them.
fn pre_trace_state(schedule: &Schedule) -> Vec<(Bytes, Phase, bool)> {
    schedule
        .blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.category == Category::OptimizerState)
        .filter(|(_, b)| {
            b.op.as_deref()
                .is_some_and(|op| op.ends_with("state made before the trace"))
        })
        .map(|(i, b)| {
            let freed = schedule
                .events
                .iter()
                .any(|e| e.kind == EventKind::Free && e.block.0 as usize == i);
            (b.size, b.phase, freed)
        })
        .collect()
}

/// DDP's reducer holds a second copy of every gradient in buckets made when
/// the model was wrapped; they are resident from the start, under the op
/// name the distributed what-if finds them by.
#[test]
fn ddp_buckets_are_resident_and_named_for_the_what_if() {
    let path = "fixtures/traces-recipes/resnet18_adam_bs8_ddp2.json.gz";
    let meta = meta_of(path);
    let prepared = memcast::prepare(&common::read_shared(path), &config(), &mut |_| {}).unwrap();
    let schedule = &prepared.orchestrated.schedule;
    let pre_trace: Bytes = schedule
        .blocks
        .iter()
        .filter(|b| b.phase == Phase::Setup && b.op.as_deref() == Some(BUCKET_OP))
        .map(|b| b.size)
        .sum();
    assert_eq!(pre_trace, bytes_of(&meta, "trainable_param_bytes"));
    assert!(schedule
        .blocks
        .iter()
        .filter(|b| b.category == Category::Bucket)
        .all(|b| b.op.as_deref() == Some(BUCKET_OP)));
}

/// Quantized weights are parameters (bitsandbytes' `Int8Params` and
/// `Params4bit` are `nn.Parameter`s): LLM.int8() weights at one byte per
/// element read by `MatMul8bitLt`, packed NF4 bytes at half a byte read by
/// `MatMul4Bit` through a view (each layer's weight its own, though several
/// share a shape), counted with the unquantized rest and the adapters, and
/// no quantized weight taken for a buffer; the quantisation state (NF4's
/// absmax, nested absmax, code tables and offset; int8's `SCB`) exactly as
/// bitsandbytes holds it; the run kind follows the grad mode.
#[test]
fn quantized_weights_are_parameters_at_their_stored_size() {
    for name in ["llama_nograd_int8", "llama_qlora_nf4"] {
        let path = format!("fixtures/traces-llm/{name}.json.gz");
        let meta = meta_of(&path);
        let analysis = analysis_of(&common::read_shared(&path));
        let totals = analysis.state.totals;
        assert_eq!(totals.parameters, bytes_of(&meta, "param_bytes"), "{name}");
        assert_eq!(
            totals.trainable,
            bytes_of(&meta, "trainable_param_bytes"),
            "{name}"
        );
        let quant = &meta["quantization"];
        assert_eq!(
            totals.parameters.get(),
            quant["unquantized_param_bytes"].as_u64().unwrap()
                + quant["quantized_weight_bytes"].as_u64().unwrap()
                + quant["trainable_adapter_bytes"].as_u64().unwrap(),
            "{name}"
        );
        assert!(
            totals.buffers.get() <= bytes_of(&meta, "buffer_bytes").get(),
            "{name}: buffers {:?}",
            totals.buffers
        );
        assert_eq!(
            totals.quantized.get(),
            quant["quantized_weight_bytes"].as_u64().unwrap(),
            "{name}: the quantized share"
        );
        assert_eq!(
            totals.quant_state.get(),
            quant["quant_state_bytes"].as_u64().unwrap(),
            "{name}: the quantisation state"
        );
        // Below the fp32 twin by what quantization saved.
        let twin = if name.contains("int8") {
            "llama_nograd_fp32"
        } else {
            "llama_lora_fp32"
        };
        let twin_path = format!("fixtures/traces-llm/{twin}.json.gz");
        let fp32 = analysis_of(&common::read_shared(&twin_path)).state.totals;
        assert_eq!(
            fp32.parameters.get() - totals.parameters.get(),
            quant["quantized_weights_float32_bytes"].as_u64().unwrap()
                - quant["quantized_weight_bytes"].as_u64().unwrap(),
            "{name} against {twin}"
        );
        // bitsandbytes' autograd Functions carry a sequence number under
        // no_grad too: the int8 forward is still inference.
        let kind = match meta["grad_mode"].as_str().unwrap() {
            "no_grad" => RunKind::Inference,
            _ => RunKind::FineTuning,
        };
        assert_eq!(analysis.state.run_kind, kind, "{name}");
    }
}
