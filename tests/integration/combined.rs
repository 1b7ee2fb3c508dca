//! Recipes that big jobs combine, rebuilt from a few blocks at a short
//! length (`tests/data/traces-combined/`, made with tracegen; each sidecar's
//! `made_with` is the command): reentrant activation checkpointing with bf16
//! autocast, 2-step accumulation, clipping and a foreach AdamW, and with a
//! per-parameter AdamW in fp32; non-reentrant checkpointing with autocast.
//! The 2-block trace at 64 tokens asked for 4 blocks at 128 is the 4-block
//! trace at 128: the same peak and the full job's parameters and optimizer
//! state (issue 31).

use std::path::PathBuf;

use memcast::report::Report;
use memcast::Settings;

fn path(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/traces-combined")
        .join(name);
    assert!(path.is_file(), "missing fixture {path:?}");
    path
}

fn meta(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(path(&format!("{name}.meta.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn estimate(name: &str, layers: Option<u32>, seq_len: Option<u32>) -> Report {
    let settings = Settings {
        gpus: vec!["a100-80gb".to_owned()],
        layers,
        seq_len,
        ..Settings::default()
    };
    crate::common::estimate_file(&path(&format!("{name}.json.gz")), &settings)
}

/// How far `a` is off `b`, in percent.
fn off(a: u64, b: u64) -> f64 {
    100.0 * (a as f64 - b as f64) / (b as f64).max(1.0)
}

/// The trace `short` asked for at `len` tokens beside the trace `long`
/// made at that length: both reports, and how far the first's peak
/// reserved and allocated are off the second's, in percent.
struct Lengthened {
    lengthened: Report,
    full: Report,
    reserved: f64,
    allocated: f64,
}

fn lengthened_beside(short: &str, long: &str, len: u32) -> Lengthened {
    rebuilt_beside(short, long, None, Some(len))
}

/// [`lengthened_beside`] for any rebuild: `short` at `layers` blocks and
/// `len` tokens (`None`: as traced) beside `long`.
fn rebuilt_beside(short: &str, long: &str, layers: Option<u32>, len: Option<u32>) -> Lengthened {
    let full = estimate(long, None, None);
    let lengthened = estimate(short, layers, len);
    let reserved = off(
        lengthened.peak.reserved_bytes.get(),
        full.peak.reserved_bytes.get(),
    );
    let allocated = off(
        lengthened.peak.allocated_bytes.get(),
        full.peak.allocated_bytes.get(),
    );
    Lengthened {
        lengthened,
        full,
        reserved,
        allocated,
    }
}

#[test]
fn reentrant_jobs_rebuilt_in_depth_and_length_are_the_deeper_longer_traces() {
    for (short, long) in [
        (
            "llama-small_ckptre_bf16_foreach_ga2_clip_bs2_seq64_L2",
            "llama-small_ckptre_bf16_foreach_ga2_clip_bs2_seq128_L4",
        ),
        (
            "llama-small_ckptre_perparam_clip_bs2_seq64_L2",
            "llama-small_ckptre_perparam_clip_bs2_seq128_L4",
        ),
    ] {
        let full = estimate(long, None, None);
        let rebuilt = estimate(short, Some(4), Some(128));
        let (a, b) = (
            rebuilt.peak.reserved_bytes.get() as f64,
            full.peak.reserved_bytes.get() as f64,
        );
        let off = 100.0 * (a - b) / b;
        assert!(off.abs() <= 0.5, "{short}: {a} vs {b} ({off:+.2} %)");
        // The full job's model state: the checkpoints' detached inputs,
        // lengthened with the activations they are, are no parameters.
        let params = meta(long)["trainable_param_bytes"].as_u64().unwrap();
        assert_eq!(rebuilt.summary.parameter_bytes.get(), params, "{short}");
        assert_eq!(full.summary.parameter_bytes.get(), params, "{long}");
        assert_eq!(
            rebuilt.summary.n_parameters, full.summary.n_parameters,
            "{short}"
        );
        assert_eq!(
            rebuilt.breakdown_at_peak.optimizer_state, full.breakdown_at_peak.optimizer_state,
            "{short}: optimizer state"
        );
        // Lengthened alone, the detached inputs stay activations too.
        let lengthened = estimate(short, None, Some(128));
        let traced_params = meta(short)["trainable_param_bytes"].as_u64().unwrap();
        assert_eq!(
            lengthened.summary.parameter_bytes.get(),
            traced_params,
            "{short} at 128"
        );
    }
}

#[test]
fn a_concatenation_under_autocast_reads_its_operands_in_their_dtype() {
    // rotate_half's `cat((-x2, x1))` in a non-reentrant checkpoint's
    // recomputation under bf16 autocast: the profiler records no dtype for
    // the operands, and read as fp32 they matched no live block and were
    // counted as 1.25 MiB of buffers. The one buffer the forward reads is
    // rotary's inv_freq (128 B; the sidecar's 256 B holds the
    // original_inv_freq copy, which nothing reads).
    let name = "llama-small_ckpt_bf16_perparam_ga2_clip_bs2_seq128_L2";
    let report = estimate(name, None, None);
    assert_eq!(report.summary.buffer_bytes.get(), 128, "{name}");
    let params = meta(name)["trainable_param_bytes"].as_u64().unwrap();
    assert_eq!(report.summary.parameter_bytes.get(), params, "{name}");
}

#[test]
fn an_input_set_to_require_grad_is_lengthened_as_the_activation_it_is() {
    // LoRA with non-reentrant checkpointing: the Hugging Face model's
    // `enable_input_require_grads` makes the frozen embeddings' output a
    // leaf, and its gradient (an `AccumulateGrad`, like a parameter's) flows
    // back through every recomputed block. It dies with the graph, before the
    // optimizer step, so it is an activation's, as long as the length: read as
    // a parameter's, it and every block the recomputation made from it kept
    // their traced size (the 48-token trace at 128 came out with 5 % more
    // activations at its peak and none of the temporaries).
    let short = "llama-small_lora_ckpt_bs2_seq48_L2";
    let long = "llama-small_lora_ckpt_bs2_seq128_L2";
    let full = estimate(long, None, None);
    let lengthened = estimate(short, None, Some(128));
    let near = |what: &str, a: u64, b: u64| {
        let off = off(a, b);
        assert!(off.abs() <= 0.5, "{what}: {a} vs {b} ({off:+.2} %)");
    };
    near(
        "peak reserved",
        lengthened.peak.reserved_bytes.get(),
        full.peak.reserved_bytes.get(),
    );
    let working =
        |r: &Report| r.breakdown_at_peak.activations.get() + r.breakdown_at_peak.temporaries.get();
    near(
        "activations and temporaries at the peak",
        working(&lengthened),
        working(&full),
    );
    for (field, bytes) in [
        ("param_bytes", lengthened.summary.parameter_bytes),
        (
            "trainable_param_bytes",
            lengthened.summary.trainable_parameter_bytes,
        ),
        (
            "frozen_param_bytes",
            lengthened.summary.frozen_parameter_bytes,
        ),
    ] {
        assert_eq!(bytes.get(), meta(long)[field].as_u64().unwrap(), "{field}");
    }
    assert_eq!(lengthened.summary.n_parameters, full.summary.n_parameters);
}

#[test]
fn a_bf16_job_lengthened_reads_its_lists_and_masks_as_the_longer_trace_does() {
    // gpt2 under bf16 autocast: the cache's `cat((empty, key))` records no
    // dtype for its operands; read as fp32, the bf16 key matched no block,
    // was counted as a 288 KiB buffer, and every block after it kept its
    // traced size (reserved -11.5 %). The math path's causal mask
    // (`ones(T, T).tril()` inside the attention call) grows as T².
    let Lengthened {
        lengthened,
        full,
        reserved,
        allocated,
    } = lengthened_beside(
        "gpt2_bf16_adamw_bs2_seq48_L2",
        "gpt2_bf16_adamw_bs2_seq128_L2",
        128,
    );
    assert_eq!(lengthened.summary.buffer_bytes, full.summary.buffer_bytes);
    assert!(reserved.abs() <= 0.5, "peak reserved {reserved:+.2} %");
    assert!(allocated.abs() <= 0.5, "peak allocated {allocated:+.2} %");
}

#[test]
fn a_mixture_of_experts_lengthened_grows_its_routed_rows_as_the_tokens() {
    // Mixtral's grouped-GEMM path gathers each token's top-2 experts' rows,
    // sorted by expert: [k·B·T, d] = [192, 256] at 48 tokens, batch 2. Not
    // read as the length (neither T nor B·T), the experts' activations kept
    // their traced size (reserved -0.82 %, activations at the peak -50 %).
    let Lengthened {
        lengthened,
        full,
        reserved,
        allocated,
    } = lengthened_beside(
        "mixtral-small_adamw_bs2_seq48_L2",
        "mixtral-small_adamw_bs2_seq128_L2",
        128,
    );
    assert!(reserved.abs() <= 0.5, "peak reserved {reserved:+.2} %");
    assert!(allocated.abs() <= 0.5, "peak allocated {allocated:+.2} %");
    assert_eq!(lengthened.summary.n_parameters, full.summary.n_parameters);
}

#[test]
fn a_qlora_job_lengthened_where_activations_have_its_packed_weights_bytes() {
    // NF4 LoRA with checkpointing at 48 tokens, batch 2: a [2, 48, 768]
    // fp32 activation has the bytes of a packed [768·768/2, 1] uint8
    // weight, a [2, 48, 2048] one those of an MLP's. A view of the packed
    // weight read first named the activation's dims, a 4-bit layer's
    // absmax read as an activation made `gemm_4bit` a product of two
    // length-long inputs, and what the kernel dequantized from the state
    // grew with the length: reserved -5.26 % from 48 tokens to 128.
    let Lengthened {
        lengthened,
        full,
        reserved,
        allocated,
    } = lengthened_beside(
        "llama-small_qlora_ckpt_bs2_seq48_L2",
        "llama-small_qlora_ckpt_bs2_seq128_L2",
        128,
    );
    assert!(allocated.abs() <= 0.1, "peak allocated {allocated:+.2} %");
    // CPU kernels' scratch inside the 4-bit kernels grows as T here and
    // affinely there: the segments differ by one small block.
    assert!(reserved.abs() <= 1.0, "peak reserved {reserved:+.2} %");
    assert_eq!(lengthened.summary.n_parameters, full.summary.n_parameters);
}

#[test]
fn a_gradient_every_block_adds_to_is_made_once_by_the_first_block_backward_runs() {
    // T5's decoder blocks all read the encoder's output: its gradient is
    // summed out of place in the first block backward runs, in place in
    // every later one (`InputBuffer::accumulate`). Copied as the template
    // ran it, each new block kept one more sum: +0.50 % reserved, +0.56 %
    // allocated.
    let short = "t5-small_lora_adamw_bs2_seq128_L2";
    let long = "t5-small_lora_adamw_bs2_seq128_L4";
    let Lengthened {
        lengthened: deepened,
        full,
        reserved,
        allocated,
    } = rebuilt_beside(short, long, Some(4), None);
    assert!(
        reserved.abs() <= 0.1 && allocated.abs() <= 0.1,
        "reserved {reserved:+.2} %, allocated {allocated:+.2} %"
    );
    assert_eq!(deepened.summary.n_events, full.summary.n_events);
    assert_eq!(
        deepened.summary.parameter_bytes,
        full.summary.parameter_bytes
    );
}

#[test]
fn the_run_line_names_the_checkpointing_form_the_trace_ran() {
    // Reentrant checkpointing re-runs a block's forward inside its own
    // backward node; the non-reentrant form recomputes through saved-tensor
    // hooks. What each keeps differs, so the line the page and the CLI show
    // says which one the estimate simulated (issue 31).
    for (name, form) in [
        (
            "llama-small_ckptre_perparam_clip_bs2_seq64_L2",
            "activation checkpointing (reentrant)",
        ),
        (
            "llama-small_ckpt_bf16_perparam_ga2_clip_bs2_seq128_L2",
            "activation checkpointing (non-reentrant)",
        ),
    ] {
        let line = memcast::present::recipe_line(&estimate(name, None, None).summary);
        assert!(line.contains(form), "{name}: {line}");
        assert!(line.contains("gradient clipping"), "{name}: {line}");
    }
}
