//! One test per autocast rule, each on a small hand-written trace recorded
//! "under CPU autocast" (bf16): the trace is read, analyzed and planned as a
//! real one is.
#![cfg(test)]

use super::*;
use crate::analyzer::{analyze, AnalyzerConfig};

/// A Chrome trace written event by event, on one thread; times in µs.
#[derive(Default)]
struct Tb {
    events: Vec<String>,
    next_addr: u64,
}

/// An argument of an op: a tensor (shape, `Input type`) or a tensor list.
enum Arg<'a> {
    T(&'a [u64], &'a str),
    List(&'a [&'a [u64]]),
}

impl Tb {
    fn frame(&mut self, name: &str, ts: f64, dur: f64) {
        self.events.push(format!(
            r#"{{"ph": "X", "cat": "python_function", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": {dur}}}"#
        ));
    }

    /// An autocast region from `ts` to `end`, its cache cleared at the end.
    fn region(&mut self, ts: f64, end: f64) {
        self.frame("torch/amp/autocast_mode.py(308): __enter__", ts, 1.0);
        self.frame("torch/amp/autocast_mode.py(360): __exit__", end, 2.0);
        self.frame("<built-in function clear_autocast_cache>", end + 0.5, 0.5);
    }

    fn op(&mut self, name: &str, ts: f64, dur: f64, args: &[Arg], seq: Option<u64>) {
        let dims: Vec<String> = args
            .iter()
            .map(|a| match a {
                Arg::T(shape, _) => format!("{shape:?}"),
                Arg::List(shapes) => format!("{shapes:?}"),
            })
            .collect();
        let types: Vec<String> = args
            .iter()
            .map(|a| match a {
                Arg::T(_, t) => format!("{t:?}"),
                Arg::List(_) => "\"TensorList\"".to_owned(),
            })
            .collect();
        let seq = seq.map_or(String::new(), |s| format!(r#", "Sequence number": {s}"#));
        self.events.push(format!(
            r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": {dur}, "args": {{"Input Dims": [{}], "Input type": [{}]{seq}}}}}"#,
            dims.join(", "),
            types.join(", ")
        ));
    }

    /// A CPU block of `bytes` allocated at `ts` (inside the op running
    /// then) and freed at `free`.
    fn block(&mut self, ts: f64, bytes: u64, free: Option<f64>) {
        self.next_addr += 1 << 20;
        let addr = self.next_addr;
        let mem = |ts: f64, b: i64| {
            format!(
                r#"{{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": {ts}, "args": {{"Addr": {addr}, "Bytes": {b}, "Device Type": 0, "Device Id": -1}}}}"#
            )
        };
        self.events.push(mem(ts, i64::try_from(bytes).unwrap()));
        if let Some(f) = free {
            self.events.push(mem(f, -i64::try_from(bytes).unwrap()));
        }
    }

    /// A CPU autocast cast (`aten::to` → `aten::_to_copy`) at `ts` inside
    /// the op running then, its copy freed at `free`.
    fn cast(&mut self, ts: f64, shape: &[u64], from: &str, bytes: u64, free: Option<f64>) {
        self.op("aten::to", ts, 2.0, &[Arg::T(shape, from)], None);
        self.op(
            "aten::_to_copy",
            ts + 0.1,
            1.8,
            &[Arg::T(shape, from)],
            None,
        );
        self.block(ts + 0.2, bytes, free);
    }

    /// `p = softmax(x)` over 4x64 fp32 at 10 µs (autograd's sequence
    /// number 1), its 1,024-byte output freed at `free`.
    fn softmax_fp32(&mut self, free: f64) {
        self.op(
            "aten::softmax",
            10.0,
            5.0,
            &[Arg::T(&[4, 64], F), Arg::T(&[], "Scalar")],
            Some(1),
        );
        self.block(11.0, 1024, Some(free));
    }

    fn analysis(&self) -> Analysis {
        let text = format!(r#"{{"traceEvents": [{}]}}"#, self.events.join(",\n"));
        let trace = crate::trace::parse(text.as_bytes()).unwrap().value;
        analyze(&trace, &AnalyzerConfig::standard()).unwrap().value
    }
}

const F: &str = "float";
const B: &str = "c10::BFloat16";

fn planned(analysis: &Analysis, version: &str) -> Plan {
    let config = AutocastConfig {
        version: version.to_owned(),
        ..AutocastConfig::standard()
    };
    changes(analysis, &config, &mut Vec::new())
}

/// The analyzer block allocated at `ts` µs (the builder's clock).
fn block_at(analysis: &Analysis, bytes: u64) -> Vec<usize> {
    analysis
        .blocks
        .iter()
        .filter(|b| b.size == Bytes(bytes))
        .map(|b| b.id)
        .collect()
}

/// `x = a + b` (fp32, 256 elements) then `y = linear(x, W, bias)` in bf16,
/// then `e = exp(y)`, `p = softmax(e)` and `z = p + p`, in a `no_grad`
/// region: the softmax and exp outputs are fp32 on CUDA, the exp reads an
/// fp32 copy of y, and the add promotes to fp32.
fn mlp() -> Tb {
    let mut t = Tb::default();
    t.region(0.0, 200.0);
    t.frame("nn.Module: Linear_0", 20.0, 30.0);
    t.op(
        "aten::add",
        10.0,
        5.0,
        &[Arg::T(&[4, 64], F), Arg::T(&[4, 64], F)],
        None,
    );
    t.block(11.0, 1024, Some(300.0));
    t.op(
        "aten::linear",
        20.0,
        20.0,
        &[Arg::T(&[4, 64], F), Arg::T(&[32, 64], F), Arg::T(&[32], F)],
        None,
    );
    t.cast(21.0, &[4, 64], F, 512, Some(39.0));
    t.cast(24.0, &[32, 64], F, 4096, Some(200.5));
    t.cast(27.0, &[32], F, 64, Some(200.5));
    t.op(
        "aten::addmm",
        30.0,
        8.0,
        &[Arg::T(&[32], B), Arg::T(&[4, 64], B), Arg::T(&[64, 32], B)],
        None,
    );
    t.block(31.0, 256, Some(300.0));
    t.op("aten::exp", 50.0, 5.0, &[Arg::T(&[4, 32], B)], None);
    t.block(51.0, 256, Some(300.0));
    t.op(
        "aten::softmax",
        60.0,
        5.0,
        &[Arg::T(&[4, 32], B), Arg::T(&[], "Scalar")],
        None,
    );
    t.block(61.0, 256, Some(300.0));
    t.op(
        "aten::add",
        70.0,
        5.0,
        &[Arg::T(&[4, 32], B), Arg::T(&[4, 32], B)],
        None,
    );
    t.block(71.0, 256, Some(300.0));
    t
}

#[test]
fn the_trace_shows_a_no_grad_bf16_region() {
    let a = mlp().analysis();
    assert_eq!(a.autocast.len(), 1);
    let r = a.autocast[0];
    assert_eq!((r.grad, r.lower), (GradMode::NoGrad, Some(Dtype::Bf16)));
    assert_eq!(trace_regions(&a).len(), 1);
}

#[test]
fn rule_autocast_fp32_ops_makes_softmax_and_exp_outputs_fp32() {
    let a = mlp().analysis();
    let plan = planned(&a, "2.12");
    let fp32: Vec<_> = plan
        .resized
        .values()
        .filter(|r| r.1 == RuleId::AutocastFp32Ops)
        .collect();
    // softmax and exp: 128 elements, 256 bytes in bf16, 512 in fp32.
    assert_eq!(fp32.len(), 2, "{plan:?}");
    assert!(fp32.iter().all(|r| r.0 == Bytes(512)));
}

#[test]
fn rule_autocast_input_casts_adds_the_fp32_copy_exp_reads() {
    let a = mlp().analysis();
    let plan = planned(&a, "2.12");
    let exp = a
        .ops
        .iter()
        .position(|o| a.name(o.name) == "aten::exp")
        .unwrap();
    let added: Vec<_> = plan
        .added
        .iter()
        .filter(|b| b.rule == RuleId::AutocastInputCasts)
        .collect();
    assert_eq!(added.len(), 1, "{plan:?}");
    assert_eq!((added[0].op, added[0].size), (exp, Bytes(512)));
    // Freed when exp returns (no autograd).
    assert_eq!(added[0].free, Some(a.ops[exp].end));
}

#[test]
fn rule_autocast_promotion_follows_an_fp32_input() {
    let a = mlp().analysis();
    let plan = planned(&a, "2.12");
    // z = p + p: softmax's output is fp32 on CUDA, so the sum is too.
    let z = block_at(&a, 256).into_iter().last().unwrap();
    assert_eq!(
        plan.resized.get(&z),
        Some(&(Bytes(512), RuleId::AutocastPromotion))
    );
    // linear runs in bf16 on both devices: its output and its casts stay.
    let y = block_at(&a, 256)[0];
    assert!(!plan.resized.contains_key(&y));
    assert!(block_at(&a, 4096)
        .iter()
        .all(|b| !plan.dropped.contains_key(b) && !plan.freed.contains_key(b)));
}

/// `einsum` (listed by CUDA autocast, not by the CPU's) twice on the same
/// weight: the CPU casts a view of the weight inside the `bmm` each time and
/// frees it; CUDA caches the first cast until the region exits.
fn einsum_twice() -> Tb {
    let mut t = Tb::default();
    t.region(0.0, 200.0);
    t.frame("nn.Module: Linear_0", 5.0, 100.0);
    t.op(
        "aten::add",
        10.0,
        5.0,
        &[Arg::T(&[4, 64], F), Arg::T(&[4, 64], F)],
        None,
    );
    t.block(11.0, 1024, Some(300.0));
    for start in [20.0, 60.0] {
        t.op(
            "aten::einsum",
            start,
            30.0,
            &[Arg::T(&[], ""), Arg::List(&[&[4, 64], &[32, 64]])],
            None,
        );
        t.op(
            "aten::bmm",
            start + 1.0,
            25.0,
            &[Arg::T(&[1, 4, 64], F), Arg::T(&[1, 64, 32], F)],
            None,
        );
        t.cast(start + 2.0, &[1, 4, 64], F, 512, Some(start + 20.0));
        t.cast(start + 5.0, &[1, 64, 32], F, 4096, Some(start + 20.0));
        t.block(start + 10.0, 256, Some(300.0));
    }
    // The products' bf16 result read by a later op (how the trace shows
    // the region's type).
    t.op("aten::relu", 120.0, 5.0, &[Arg::T(&[1, 4, 32], B)], None);
    t.block(121.0, 256, Some(300.0));
    t
}

#[test]
fn rule_autocast_cast_cache_keeps_the_first_weight_cast_and_drops_the_second() {
    let a = einsum_twice().analysis();
    let plan = planned(&a, "2.12");
    let casts = block_at(&a, 4096);
    assert_eq!(casts.len(), 2);
    let end = a.autocast[0].end;
    assert_eq!(
        plan.freed.get(&casts[0]),
        Some(&(end, RuleId::AutocastCastCache)),
        "{plan:?}"
    );
    assert_eq!(
        plan.dropped.get(&casts[1]),
        Some(&RuleId::AutocastCastCache)
    );
    // The activation's casts are made on both devices.
    assert!(block_at(&a, 512)
        .iter()
        .all(|b| !plan.dropped.contains_key(b)));
}

#[test]
fn rule_autocast_cpu_only_casts_drops_what_cuda_does_not_copy() {
    // A CPU kernel of an op CUDA runs in fp32 (`mse_loss`) that calls a
    // CPU-listed op (`mm`, made up here to exercise the rule): the CPU's
    // bf16 copy inside it is the CPU's alone; CUDA copies the bf16 input
    // to fp32 instead.
    let mut t = Tb::default();
    t.region(0.0, 200.0);
    t.op(
        "aten::mse_loss",
        50.0,
        30.0,
        &[Arg::T(&[4, 64], B), Arg::T(&[4, 64], F)],
        None,
    );
    t.op(
        "aten::mm",
        51.0,
        20.0,
        &[Arg::T(&[4, 64], F), Arg::T(&[64, 4], B)],
        None,
    );
    t.cast(52.0, &[4, 64], F, 512, Some(69.0));
    t.block(60.0, 64, Some(300.0));
    let a = t.analysis();
    let plan = planned(&a, "2.12");
    let cast = block_at(&a, 512)[0];
    assert_eq!(
        plan.dropped.get(&cast),
        Some(&RuleId::AutocastCpuOnlyCasts),
        "{plan:?}"
    );
    let added: Vec<_> = plan.added.iter().map(|b| (b.size, b.rule)).collect();
    assert_eq!(added, [(Bytes(1024), RuleId::AutocastInputCasts)]);
}

#[test]
fn rule_cpu_lowp_matmul_copies_drops_the_contiguous_copy_in_a_bf16_bmm() {
    let mut t = Tb::default();
    t.region(0.0, 200.0);
    t.op(
        "aten::bmm",
        20.0,
        20.0,
        &[Arg::T(&[2, 4, 64], B), Arg::T(&[2, 64, 4], B)],
        None,
    );
    t.op(
        "aten::contiguous",
        21.0,
        5.0,
        &[Arg::T(&[2, 64, 4], B)],
        None,
    );
    t.block(22.0, 1024, Some(35.0));
    t.block(36.0, 64, Some(300.0));
    let a = t.analysis();
    let plan = planned(&a, "2.12");
    let copy = block_at(&a, 1024)[0];
    assert_eq!(plan.dropped.get(&copy), Some(&RuleId::CpuLowpMatmulCopies));
    let out = block_at(&a, 64)[0];
    assert!(!plan.dropped.contains_key(&out));
}

#[test]
fn rule_autocast_backward_gives_gradients_the_forward_type() {
    // softmax with autograd on; its backward node makes a gradient of the
    // softmax's size, bf16 on the CPU, fp32 on CUDA.
    let mut t = Tb::default();
    t.region(0.0, 100.0);
    t.op(
        "aten::add",
        10.0,
        5.0,
        &[Arg::T(&[4, 32], B), Arg::T(&[4, 32], B)],
        Some(1),
    );
    t.block(11.0, 256, Some(300.0));
    t.op(
        "aten::softmax",
        20.0,
        5.0,
        &[Arg::T(&[4, 32], B), Arg::T(&[], "Scalar")],
        Some(2),
    );
    t.block(21.0, 256, Some(290.0));
    t.op(
        "autograd::engine::evaluate_function: SoftmaxBackward0",
        150.0,
        20.0,
        &[],
        Some(2),
    );
    t.op(
        "aten::_softmax_backward_data",
        151.0,
        10.0,
        &[Arg::T(&[4, 32], B)],
        None,
    );
    t.block(152.0, 256, Some(280.0));
    let a = t.analysis();
    assert_eq!(a.autocast[0].grad, GradMode::Enabled);
    let plan = planned(&a, "2.12");
    let grad = block_at(&a, 256)[2];
    assert_eq!(
        plan.resized.get(&grad),
        Some(&(Bytes(512), RuleId::AutocastBackward)),
        "{plan:?}"
    );
}

/// `einsum_twice`'s two weight casts under inference mode: 2.12 casts on
/// each use (the CPU's casts stay as they are), 2.9 caches the first and
/// the second finds it.
fn assert_both_casts_cached_only_before_2_10(a: &Analysis) {
    let casts = block_at(a, 4096);
    let new = planned(a, "2.12");
    assert!(
        casts
            .iter()
            .all(|b| !new.freed.contains_key(b) && !new.dropped.contains_key(b)),
        "{new:?}"
    );
    let old = planned(a, "2.9");
    assert!(old.freed.contains_key(&casts[0]) && old.dropped.contains_key(&casts[1]));
}

#[test]
fn nothing_is_cached_under_inference_mode_from_2_10_on() {
    // The einsum weight of `einsum_twice`, under inference_mode: 2.12
    // casts it on each use (the CPU's casts stay as they are), 2.9 caches.
    let mut t = einsum_twice();
    t.frame("torch/autograd/grad_mode.py(290): __enter__", -10.0, 3.0);
    t.frame(
        "<built-in method __enter__ of torch._C._InferenceMode object>",
        -9.0,
        1.0,
    );
    let a = t.analysis();
    assert_eq!(a.autocast[0].grad, GradMode::InferenceMode);
    assert_both_casts_cached_only_before_2_10(&a);
}

/// `einsum_twice` with a grad-mode context entered inside the region at
/// `enter` and exited at `exit`; `inference`: `torch.inference_mode()`
/// (its `__enter__` enters the C++ guard), else `torch.no_grad()`.
fn einsum_twice_with_context(enter: f64, exit: f64, inference: bool) -> Tb {
    let mut t = einsum_twice();
    t.frame("torch/autograd/grad_mode.py(289): __enter__", enter, 3.0);
    if inference {
        t.frame(
            "<built-in method __enter__ of pybind11_builtins.pybind11_detail_function_record object>",
            enter + 1.0,
            1.0,
        );
    } else {
        t.frame(
            "torch/autograd/grad_mode.py(184): __init__",
            enter + 1.0,
            1.0,
        );
    }
    t.frame("torch/autograd/grad_mode.py(293): __exit__", exit, 2.0);
    t
}

#[test]
fn rule_autocast_cast_cache_is_decided_per_cast_under_inference_mode_entered_inside() {
    // `with torch.autocast(...): with torch.inference_mode(): ...`: the
    // region is entered outside inference_mode, both casts are made inside
    // it. 2.12 caches neither (the CPU's casts stay as they are), 2.9 both.
    let a = einsum_twice_with_context(15.0, 110.0, true).analysis();
    assert_eq!(a.autocast[0].grad, GradMode::NoGrad);
    assert_eq!(a.inference_mode.len(), 1);
    assert_both_casts_cached_only_before_2_10(&a);
}

#[test]
fn rule_autocast_cast_cache_skips_the_lookup_of_a_cast_under_inference_mode() {
    // The first einsum casts outside inference_mode (cached to the exit),
    // the second inside it: `can_try_cache` is false, so it casts afresh
    // and frees its copy when it returns, the cached one still held.
    let a = einsum_twice_with_context(55.0, 110.0, true).analysis();
    let casts = block_at(&a, 4096);
    let plan = planned(&a, "2.12");
    let end = a.autocast[0].end;
    assert_eq!(
        plan.freed.get(&casts[0]),
        Some(&(end, RuleId::AutocastCastCache)),
        "{plan:?}"
    );
    assert!(
        !plan.freed.contains_key(&casts[1]) && !plan.dropped.contains_key(&casts[1]),
        "{plan:?}"
    );
}

#[test]
fn rule_autocast_cast_cache_still_caches_under_no_grad_inside_the_region() {
    // `torch.no_grad()` is no part of `can_try_cache`: a parameter still
    // requires grad, so 2.12 caches as outside it.
    let a = einsum_twice_with_context(15.0, 110.0, false).analysis();
    assert!(a.inference_mode.is_empty());
    let casts = block_at(&a, 4096);
    let plan = planned(&a, "2.12");
    assert!(
        plan.freed.contains_key(&casts[0]) && plan.dropped.contains_key(&casts[1]),
        "{plan:?}"
    );
}

#[test]
fn fp16_has_the_sizes_of_bf16_and_off_changes_nothing() {
    let a = mlp().analysis();
    let bf16 = planned(&a, "2.12");
    let fp16 = changes(
        &a,
        &AutocastConfig {
            dtype: Some(Dtype::F16),
            ..AutocastConfig::standard()
        },
        &mut Vec::new(),
    );
    assert_eq!(bf16.bytes(&a), fp16.bytes(&a));
    let off = changes(
        &a,
        &AutocastConfig {
            mode: AutocastMode::Off,
            ..AutocastConfig::standard()
        },
        &mut Vec::new(),
    );
    assert_eq!(off, Plan::default());
}

#[test]
fn an_unknown_policy_version_warns_and_uses_the_newest() {
    let a = mlp().analysis();
    let mut warnings = Vec::new();
    let config = AutocastConfig {
        version: "1.0".to_owned(),
        ..AutocastConfig::standard()
    };
    let plan = changes(&a, &config, &mut warnings);
    assert!(warnings
        .iter()
        .any(|w| w.code == "autocast_version_unknown"));
    assert_eq!(plan, planned(&a, "2.12"));
}

#[test]
fn a_region_entered_during_backward_is_not_a_forward_region() {
    // Activation checkpointing re-enters the saved autocast state (here
    // disabled) while the backward node runs.
    let mut t = Tb::default();
    t.op(
        "autograd::engine::evaluate_function: CheckpointFunctionBackward",
        0.0,
        300.0,
        &[],
        Some(3),
    );
    t.region(10.0, 200.0);
    t.op(
        "aten::mm",
        20.0,
        10.0,
        &[Arg::T(&[4, 64], F), Arg::T(&[64, 4], F)],
        None,
    );
    t.block(21.0, 64, Some(250.0));
    let a = t.analysis();
    assert!(a.autocast.is_empty(), "{:?}", a.autocast);
    assert_eq!(planned(&a, "2.12"), Plan::default());
}

/// A forward that records autograd and runs no backward (the graph is
/// dropped when the next iteration reassigns the output, after the region):
/// `p = softmax(x)` in fp32 is read only by an `einsum`, which CUDA
/// autocast runs on a bf16 copy of it, the copy autograd saves. On CUDA p
/// goes when the einsum returns; the CPU held it with the graph.
#[test]
fn rule_autocast_input_casts_frees_a_copied_tensor_with_no_backward() {
    let mut t = Tb::default();
    t.region(0.0, 200.0);
    t.frame("nn.Module: Attention_0", 5.0, 100.0);
    t.softmax_fp32(300.0);
    t.op(
        "aten::einsum",
        20.0,
        30.0,
        &[Arg::T(&[], ""), Arg::List(&[&[4, 64], &[64, 32]])],
        Some(2),
    );
    t.op(
        "aten::bmm",
        21.0,
        25.0,
        &[Arg::T(&[1, 4, 64], F), Arg::T(&[1, 64, 32], B)],
        Some(3),
    );
    t.cast(22.0, &[1, 4, 64], F, 512, Some(300.0));
    t.block(30.0, 256, Some(300.0));
    t.op("aten::relu", 120.0, 5.0, &[Arg::T(&[1, 4, 32], B)], Some(4));
    t.block(121.0, 256, Some(300.0));
    let a = t.analysis();
    assert_eq!(a.autocast[0].grad, GradMode::Enabled);
    let plan = planned(&a, "2.12");
    let p = block_at(&a, 1024)[0];
    let einsum = a
        .ops
        .iter()
        .position(|o| a.name(o.name) == "aten::einsum")
        .unwrap();
    assert_eq!(
        plan.freed.get(&p),
        Some(&(a.ops[einsum].end, RuleId::AutocastInputCasts)),
        "{plan:?}"
    );
}

/// `p = softmax(x)` in fp32 made inside `Attn_0` of the first of two
/// `Block`s, read only by a `bmm` that CUDA runs on a bf16 copy, then a
/// `relu` in `Block_0` after `Attn_0` returned and one in `Block_1`.
fn held_in_a_block(transformers: bool) -> Tb {
    let mut t = Tb::default();
    t.region(0.0, 400.0);
    t.frame("nn.Module: Block_0", 5.0, 95.0);
    if transformers {
        t.frame(
            "transformers/models/bert/modeling_bert.py(400): forward",
            5.5,
            94.0,
        );
    }
    t.frame("nn.Module: Attn_0", 6.0, 50.0);
    t.frame("nn.Module: Block_1", 105.0, 95.0);
    t.softmax_fp32(500.0);
    t.op(
        "aten::bmm",
        21.0,
        25.0,
        &[Arg::T(&[1, 4, 64], F), Arg::T(&[1, 64, 32], B)],
        Some(2),
    );
    t.cast(22.0, &[1, 4, 64], F, 512, Some(500.0));
    t.block(30.0, 256, Some(500.0));
    t.op("aten::relu", 70.0, 10.0, &[Arg::T(&[1, 4, 32], B)], Some(3));
    t.block(71.0, 256, Some(500.0));
    t.op("aten::relu", 120.0, 5.0, &[Arg::T(&[1, 4, 32], B)], Some(4));
    t.block(121.0, 256, Some(500.0));
    t
}

/// In a transformers model the layer keeps what its attention returns
/// (`holders`): p goes when the last op of `Block_0` returns, not when the
/// `bmm` does.
#[test]
fn rule_autocast_input_casts_holds_a_copied_tensor_until_its_transformers_layer_returns() {
    let a = held_in_a_block(true).analysis();
    assert!(a.state.hf_model_type.is_some());
    let plan = planned(&a, "2.12");
    let p = block_at(&a, 1024)[0];
    let relu_in_block_0 = a
        .ops
        .iter()
        .filter(|o| a.name(o.name) == "aten::relu")
        .map(|o| o.end)
        .min()
        .unwrap();
    assert_eq!(
        plan.freed.get(&p),
        Some(&(relu_in_block_0, RuleId::AutocastInputCasts)),
        "{plan:?}"
    );
}

/// Elsewhere p goes with the module that made it: `Attn_0`, whose last op
/// is the `bmm`.
#[test]
fn rule_autocast_input_casts_holds_a_copied_tensor_until_its_module_returns() {
    let a = held_in_a_block(false).analysis();
    assert!(a.state.hf_model_type.is_none());
    let plan = planned(&a, "2.12");
    let p = block_at(&a, 1024)[0];
    let bmm = a
        .ops
        .iter()
        .find(|o| a.name(o.name) == "aten::bmm")
        .unwrap();
    assert_eq!(
        plan.freed.get(&p),
        Some(&(bmm.end, RuleId::AutocastInputCasts)),
        "{plan:?}"
    );
}

/// GPT-2's `gelu_new`: `x` (bf16) is read by `0.5 * x` (keeps nothing),
/// `pow(x, 3)` (an fp32-list op: CUDA reads an fp32 copy and autograd keeps
/// the copy) and `x + ...` (keeps nothing); `h = 0.5 * x` has x's size and
/// type and is kept by the final product. The CPU's `PowBackward0` frees x,
/// which says the `pow` read x, not the later h: on CUDA x goes when its
/// module returns, and h stays for backward.
#[test]
fn rule_autocast_input_casts_tells_same_size_tensors_apart_by_their_backward() {
    let mut t = Tb::default();
    t.region(0.0, 100.0);
    t.frame("nn.Module: Gelu_0", 5.0, 60.0);
    let x_ty = [Arg::T(&[4, 64], B), Arg::T(&[4, 64], B)];
    t.op("aten::add", 10.0, 2.0, &x_ty, Some(1));
    t.block(11.0, 512, Some(160.0)); // x
    let scalar = [Arg::T(&[4, 64], B), Arg::T(&[], "Scalar")];
    t.op("aten::mul", 15.0, 2.0, &scalar, Some(2));
    t.block(16.0, 512, Some(300.0)); // h = 0.5 * x
    t.op("aten::pow", 20.0, 2.0, &scalar, Some(3));
    t.block(21.0, 512, Some(31.0)); // x ** 3
    t.op("aten::mul", 30.0, 2.0, &scalar, Some(4));
    t.block(31.0, 512, Some(41.0));
    t.op("aten::add", 40.0, 2.0, &x_ty, Some(5));
    t.block(41.0, 512, Some(51.0));
    t.op("aten::tanh", 50.0, 2.0, &[Arg::T(&[4, 64], B)], Some(6));
    t.block(51.0, 512, Some(300.0));
    t.op("aten::mul", 55.0, 2.0, &x_ty, Some(7));
    t.block(56.0, 512, Some(300.0));
    t.op(
        "autograd::engine::evaluate_function: PowBackward0",
        150.0,
        20.0,
        &[],
        Some(3),
    );
    let a = t.analysis();
    assert_eq!(a.autocast[0].grad, GradMode::Enabled);
    let plan = planned(&a, "2.12");
    let blocks = block_at(&a, 512);
    let (x, h) = (blocks[0], blocks[1]);
    let gelu_end = a
        .ops
        .iter()
        .filter(|o| a.name(o.name) == "aten::mul")
        .map(|o| o.end)
        .max()
        .unwrap();
    assert_eq!(
        plan.freed.get(&x),
        Some(&(gelu_end, RuleId::AutocastInputCasts)),
        "{plan:?}"
    );
    assert!(!plan.freed.contains_key(&h), "{plan:?}");
}

#[test]
fn only_ops_whose_backward_needs_no_input_keep_nothing() {
    assert!(casts::keeps_nothing("aten::add", 2));
    assert!(casts::keeps_nothing("aten::view", 1));
    assert!(casts::keeps_nothing("aten::mul", 1));
    assert!(!casts::keeps_nothing("aten::mul", 2));
    assert!(!casts::keeps_nothing("aten::pow", 1));
    assert!(!casts::keeps_nothing("aten::layer_norm", 1));
}
