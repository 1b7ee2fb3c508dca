//! Tests of the kernel rules, each on a small hand-written CPU trace.
#![cfg(test)]

use super::*;
use crate::analyzer::{analyze, AnalyzerConfig};

fn op(name: &str, ts: u32, dur: u32, dims: &str, types: &str, seq: Option<u32>) -> String {
    let seq = seq.map_or(String::new(), |s| format!(r#", "Sequence number": {s}"#));
    format!(
        r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": {dur}, "args": {{"Input Dims": {dims}, "Input type": {types}{seq}}}}}"#
    )
}

fn block(addr: u32, ts: u32, bytes: i64, free: u32) -> [String; 2] {
    let mem = |ts: u32, b: i64| {
        format!(
            r#"{{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": {ts}, "args": {{"Addr": {addr}, "Bytes": {b}, "Device Type": 0, "Device Id": -1}}}}"#
        )
    };
    [mem(ts, bytes), mem(free, -bytes)]
}

/// The analysis of a trace of these events.
fn analysis_of(events: &[String]) -> Analysis {
    let text = format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n"));
    let trace = crate::trace::parse(text.as_bytes()).unwrap().value;
    analyze(&trace, &AnalyzerConfig::standard()).unwrap().value
}

/// What the kernel rules plan for `a` (bf16 targets, the newest policy).
fn planned(a: &Analysis) -> Plan {
    let mut plan = Plan::default();
    apply(
        a,
        Rules {
            efficient_gqa: true,
        },
        false,
        &mut plan,
    );
    plan
}

/// The convolution workspaces a plan adds, in order.
fn workspaces(plan: &Plan) -> Vec<&AddedBlock> {
    plan.added
        .iter()
        .filter(|b| b.rule == RuleId::CudnnConvWorkspaces)
        .collect()
}

/// A CPU trace of one fp32 convolution (input [2,8,8,8], weight
/// [4,8,3,3], output [2,4,8,8]: 2,048 bytes) with its oneDNN scratch,
/// a depthwise one ([2,4,8,8] by [4,1,3,3]) and the first one's backward
/// (grad_input 4,096 bytes, grad_weight 1,152, a scratch block).
fn trace() -> Analysis {
    let f = r#"["float", "float"]"#;
    let mut ev = vec![
        op("aten::conv2d", 10, 20, "[[2,8,8,8],[4,8,3,3]]", f, Some(1)),
        op(
            "aten::convolution",
            11,
            18,
            "[[2,8,8,8],[4,8,3,3]]",
            f,
            None,
        ),
        op(
            "aten::_convolution",
            12,
            16,
            "[[2,8,8,8],[4,8,3,3]]",
            f,
            None,
        ),
        op(
            "aten::mkldnn_convolution",
            13,
            14,
            "[[2,8,8,8],[4,8,3,3]]",
            f,
            None,
        ),
        op(
            "aten::convolution",
            40,
            10,
            "[[2,4,8,8],[4,1,3,3]]",
            f,
            None,
        ),
        op(
            "autograd::engine::evaluate_function: ConvolutionBackward0",
            100,
            50,
            "[]",
            "[]",
            None,
        ),
        op("ConvolutionBackward0", 101, 48, "[]", "[]", Some(1)),
        op(
            "aten::convolution_backward",
            102,
            46,
            "[[2,4,8,8],[2,8,8,8],[4,8,3,3]]",
            r#"["float", "float", "float"]"#,
            None,
        ),
    ];
    ev.extend(block(1 << 20, 14, 2048, 200)); // output
    ev.extend(block(2 << 20, 15, 4104, 20)); // oneDNN scratch
    ev.extend(block(3 << 20, 42, 2048, 200)); // depthwise output
    ev.extend(block(4 << 20, 103, 4096, 300)); // grad_input
    ev.extend(block(5 << 20, 104, 8000, 105)); // scratch
    ev.extend(block(6 << 20, 110, 1152, 300)); // grad_weight
    analysis_of(&ev)
}

#[test]
fn cudnn_conv_workspaces_copy_what_each_pass_touches() {
    let a = trace();
    assert_eq!(a.kernel_calls.conv.len(), 3, "{:?}", a.kernel_calls.conv);
    let plan = planned(&a);
    let ws = workspaces(&plan);
    // The depthwise fp32 convolution runs PyTorch's own kernel: none.
    assert_eq!(ws.len(), 3, "{ws:?}");
    let at = |size: u64| a.blocks.iter().find(|b| b.size == Bytes(size)).unwrap();
    let name_of = |i: usize| a.name(a.ops[i].name);
    // Forward: input (2x8x8x8 fp32, 4,096) + weight (4x8x3x3, 1,152) +
    // output (2,048), from the output to the call's end.
    let copy = Bytes(4096 + 1152 + 2048);
    assert_eq!(name_of(ws[0].op), "aten::convolution");
    assert_eq!(ws[0].size, copy);
    assert_eq!(ws[0].alloc, at(2048).alloc_ts);
    assert_eq!(ws[0].free, Some(a.ops[ws[0].op].end));
    // Backward: input + weight + grad_output (the forward's output) per
    // pass, the filter pass's 23/20 of it (its partial sums). The data pass
    // from grad_input until just before grad_weight, the filter pass from
    // grad_weight to the call's end.
    let (grad_input, grad_weight) = (at(4096).alloc_ts, at(1152).alloc_ts);
    assert_eq!(name_of(ws[1].op), "aten::convolution_backward");
    assert_eq!(
        (ws[1].size, ws[2].size),
        (copy, Bytes(copy.get() * 23 / 20))
    );
    assert_eq!(ws[1].alloc, grad_input);
    assert_eq!(ws[1].free, Some(Nanos(grad_weight.get() - 1)));
    assert_eq!(ws[2].alloc, grad_weight);
    assert_eq!(ws[2].free, Some(a.ops[ws[2].op].end));
    assert!(ws.iter().all(|w| w.on.is_all() && w.per_gpu.is_none()));
}

const BF16_3: &str = r#"["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]"#;

/// A bf16 `scaled_dot_product_attention` call of 1x2x8x8 query, key and
/// value (256 bytes each) from 20 to 40 that the CPU ran as the math
/// composite, and its backward from 100 to 120.
fn math_attention() -> Vec<String> {
    let qkv = "[[1,2,8,8],[1,2,8,8],[1,2,8,8]]";
    vec![
        op(
            "aten::scaled_dot_product_attention",
            20,
            20,
            qkv,
            BF16_3,
            None,
        ),
        op(
            "aten::_scaled_dot_product_attention_math",
            21,
            18,
            qkv,
            BF16_3,
            Some(2),
        ),
        op(
            "autograd::engine::evaluate_function: BmmBackward0",
            100,
            20,
            "[]",
            "[]",
            Some(2),
        ),
    ]
}

/// GPT-2's attention: query, key and value are views of one fused
/// projection (`c_attn(x).split(...)`, one block of the three's bytes)
/// that the CPU's math composite lets die when the forward is done
/// with it. A fused CUDA kernel saves the query, so the block lives
/// until the call's backward has run, on the architectures that run one.
#[test]
fn a_fused_kernel_keeps_the_fused_projection_its_query_is_a_view_of() {
    let mut ev = vec![op(
        "aten::addmm",
        10,
        5,
        "[[48],[8,16],[16,48]]",
        BF16_3,
        Some(1),
    )];
    ev.extend(math_attention());
    // q, k and v: 1x2x8x8 bf16, 256 bytes each.
    ev.extend(block(1 << 20, 11, 768, 60)); // the fused projection
    ev.extend(block(2 << 20, 30, 256, 300)); // the attention's output
    let a = analysis_of(&ev);
    assert_eq!(a.kernel_calls.attention.len(), 1);
    let plan = planned(&a);
    let fused = a.blocks.iter().find(|b| b.size == Bytes(768)).unwrap();
    let kept: Vec<&AddedBlock> = plan
        .added
        .iter()
        .filter(|b| b.rule == RuleId::SdpaCudaKernels && b.size == Bytes(768))
        .collect();
    assert_eq!(kept.len(), 1, "{plan:?}");
    assert_eq!(kept[0].alloc, fused.alloc_ts);
    assert_eq!(
        kept[0].free,
        Some(a.ops[a.kernel_calls.attention[0].backward[0]].end)
    );
    assert!(kept[0].on.contains(Sm::KNOWN[Sm::KNOWN.len() - 1]));
}

/// The caller's `transpose(1, 2).reshape(...)` of the output the CPU's
/// math composite wrote `[B, H, T, D]` copies it (and the output dies);
/// a fused CUDA kernel writes it `[B, T, H, D]`, so the reshape is a view:
/// no copy on the architectures that run one, and the output lives as
/// long as the copy did (past the call's backward here), kept as traced
/// where a GPU runs the math composite too.
#[test]
fn a_fused_kernels_output_needs_no_copy_to_be_reshaped() {
    let mut ev = math_attention();
    ev.push(op("aten::reshape", 45, 4, "[[1,8,2,8],[]]", BF16_3, None));
    ev.extend(block(2 << 20, 30, 256, 47)); // the output, freed as it is copied
    ev.extend(block(3 << 20, 46, 256, 300)); // the copy
    let a = analysis_of(&ev);
    assert_eq!(a.kernel_calls.attention.len(), 1);
    let plan = planned(&a);
    let copy = a.blocks.iter().find(|b| b.addr == 3 << 20).unwrap();
    let output = a.blocks.iter().find(|b| b.addr == 2 << 20).unwrap();
    // bf16 runs the math composite on Volta and Turing only.
    let (math, rule) = plan.kept_on[&copy.id];
    assert_eq!(rule, RuleId::SdpaCudaKernels);
    assert!(math.contains(Sm(7, 0)) && !math.contains(Sm(9, 0)));
    assert_eq!(plan.kept_on[&output.id].0, math);
    let relived: Vec<&AddedBlock> = plan
        .added
        .iter()
        .filter(|b| b.alloc == output.alloc_ts && b.size == Bytes(256))
        .collect();
    assert_eq!(relived.len(), 1, "{plan:?}");
    assert_eq!(relived[0].free, copy.free_ts);
    assert!(relived[0].on.contains(Sm(9, 0)) && !relived[0].on.contains(Sm(7, 0)));
}

/// A backward whose gradients have neither the input's nor the
/// weight's size still gets a workspace: one, from its first gradient
/// to its end.
#[test]
fn a_backward_with_unmatched_gradients_keeps_one_workspace() {
    let f3 = r#"["float", "float", "float"]"#;
    let mut ev = vec![
        op(
            "autograd::engine::evaluate_function: ConvolutionBackward0",
            100,
            50,
            "[]",
            "[]",
            None,
        ),
        op(
            "aten::convolution_backward",
            102,
            46,
            "[[2,4,8,8],[2,8,8,8],[4,8,3,3]]",
            f3,
            None,
        ),
    ];
    ev.extend(block(4 << 20, 103, 4608, 300)); // grad_input, padded
    ev.extend(block(6 << 20, 110, 1536, 300)); // grad_weight, padded
    let a = analysis_of(&ev);
    assert_eq!(a.kernel_calls.conv.len(), 1, "{:?}", a.kernel_calls.conv);
    let plan = planned(&a);
    let ws = workspaces(&plan);
    assert_eq!(ws.len(), 1, "{ws:?}");
    let first = a.blocks.iter().map(|b| b.alloc_ts).min().unwrap();
    assert_eq!(ws[0].alloc, first);
    assert_eq!(ws[0].free, Some(a.ops[ws[0].op].end));
    assert!(ws[0].size.get() > 0);
}

/// A CPU trace of one softmax backward over [2, 4, 8, 8] fp32 (2,048
/// bytes), its gradient made inside it, and one log-softmax backward.
fn softmax_trace(with_gradient: bool) -> Analysis {
    let f = r#"["float", "float", "Scalar", "Scalar"]"#;
    let mut ev = vec![
        op(
            "aten::_softmax_backward_data",
            100,
            20,
            "[[2,4,8,8],[2,4,8,8],[],[]]",
            f,
            None,
        ),
        op(
            "aten::_log_softmax_backward_data",
            200,
            20,
            "[[2,4,8,8],[2,4,8,8],[],[]]",
            f,
            None,
        ),
    ];
    if with_gradient {
        ev.extend(block(1 << 20, 102, 2048, 300)); // grad_input
    }
    ev.extend(block(2 << 20, 202, 2048, 300)); // the log-softmax's grad_input
    analysis_of(&ev)
}

#[test]
fn cuda_softmax_backward_makes_a_temporary_of_the_gradient() {
    let a = softmax_trace(true);
    let plan = planned(&a);
    let added: Vec<&AddedBlock> = plan
        .added
        .iter()
        .filter(|b| b.rule == RuleId::CudaSoftmaxBackward)
        .collect();
    // One, for the softmax's backward (none for the log-softmax's): the
    // gradient's bytes, from its allocation to the call's end.
    assert_eq!(added.len(), 1, "{added:?}");
    let t = added[0];
    assert_eq!(t.size, Bytes(2048));
    assert_eq!((t.alloc, t.free), (Nanos(2_000), Some(Nanos(20_000))));
    assert_eq!(a.name(a.ops[t.op].name), "aten::_softmax_backward_data");
    // Resized by autocast (bf16 traced, fp32 on CUDA): the CUDA size.
    let mut plan = Plan::default();
    let grad = a.kernel_calls.softmax_backward[0].grad_input.unwrap();
    plan.resized
        .insert(grad, (Bytes(4096), RuleId::AutocastBackward));
    apply(
        &a,
        Rules {
            efficient_gqa: true,
        },
        false,
        &mut plan,
    );
    let sizes: Vec<Bytes> = plan
        .added
        .iter()
        .filter(|b| b.rule == RuleId::CudaSoftmaxBackward)
        .map(|b| b.size)
        .collect();
    assert_eq!(sizes, [Bytes(4096)]);
    // No gradient in the trace: the incoming gradient's bytes from its
    // shape, from the call's start.
    let a = softmax_trace(false);
    let plan = planned(&a);
    let t: Vec<(Bytes, Nanos)> = plan
        .added
        .iter()
        .filter(|b| b.rule == RuleId::CudaSoftmaxBackward)
        .map(|b| (b.size, b.alloc))
        .collect();
    assert_eq!(t, [(Bytes(2048), Nanos(0))]);
}

/// An fp32 grouped-query attention the CPU ran through its flash kernel,
/// which kept query, key and value until its backward. Before PyTorch 2.12
/// every architecture runs it through the math composite, which keeps
/// copies of its own: the CPU's blocks die when the backward pass starts.
/// From 2.12 the memory-efficient kernel takes it and keeps them, as the
/// CPU's did.
#[test]
fn the_math_composite_lets_go_of_what_the_cpu_flash_kernel_kept() {
    let f = r#"["float", "float", "float"]"#;
    let qkv = "[[1,2,8,8],[1,1,8,8],[1,1,8,8]]";
    let mm = r#"["float", "float"]"#;
    let mut ev = vec![
        op("aten::mm", 10, 2, "[[8,16],[16,16]]", mm, None),
        op("aten::mm", 13, 2, "[[8,16],[16,8]]", mm, None),
        op("aten::mm", 16, 2, "[[8,16],[16,8]]", mm, None),
        op("aten::scaled_dot_product_attention", 20, 20, qkv, f, None),
        op(
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            21,
            18,
            qkv,
            f,
            Some(2),
        ),
        op(
            "autograd::engine::evaluate_function: NllLossBackward0",
            80,
            5,
            "[]",
            "[]",
            Some(3),
        ),
        op(
            "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0",
            100,
            20,
            "[]",
            "[]",
            Some(2),
        ),
    ];
    ev.extend(block(1 << 20, 11, 512, 110)); // query, [1,2,8,8] fp32
    ev.extend(block(2 << 20, 14, 256, 111)); // key, one head
    ev.extend(block(3 << 20, 17, 256, 112)); // value
    ev.extend(block(4 << 20, 22, 512, 300)); // the attention's output
    let a = analysis_of(&ev);
    assert_eq!(a.kernel_calls.attention.len(), 1);
    let inputs: Vec<usize> = a
        .blocks
        .iter()
        .filter(|b| b.alloc_ts < a.ops[a.kernel_calls.attention[0].op].start)
        .map(|b| b.id)
        .collect();
    assert_eq!(inputs.len(), 3);
    let plan_with = |efficient_gqa: bool| {
        let mut plan = Plan::default();
        apply(&a, Rules { efficient_gqa }, false, &mut plan);
        plan
    };
    // Before 2.12: dropped as traced, made again until the backward pass.
    let plan = plan_with(false);
    let backward_pass = a
        .iterations
        .iter()
        .flat_map(|it| &it.phases)
        .find(|p| p.phase == crate::analyzer::Phase::Backward)
        .map(|p| p.start)
        .unwrap();
    for &b in &inputs {
        let block = &a.blocks[b];
        assert_eq!(plan.dropped.get(&b), Some(&RuleId::SdpaCudaKernels));
        let again: Vec<&AddedBlock> = plan
            .added
            .iter()
            .filter(|x| x.alloc == block.alloc_ts && x.size == block.size)
            .collect();
        assert_eq!(again.len(), 1, "{plan:?}");
        assert_eq!(again[0].free, Some(backward_pass));
        assert!(backward_pass < block.free_ts.unwrap());
        assert_eq!(again[0].on, ArchSet::ALL);
    }
    // From 2.12: as traced.
    let plan = plan_with(true);
    for b in &inputs {
        assert!(!plan.dropped.contains_key(b) && !plan.kept_on.contains_key(b));
    }
}

/// A 1×1 convolution at stride 1 and its backward, over `c_in` input
/// channels into 8 (input [2, c_in, 4, 4] fp32, output [2, 8, 4, 4]: 1,024
/// bytes): the forward's output, then the backward's grad_input and
/// grad_weight.
fn pointwise(c_in: u32) -> Analysis {
    let f = r#"["float", "float"]"#;
    let (x, w) = (format!("[2,{c_in},4,4]"), format!("[8,{c_in},1,1]"));
    let mut ev = vec![
        op("aten::conv2d", 10, 20, &format!("[{x},{w}]"), f, Some(1)),
        op("aten::convolution", 11, 18, &format!("[{x},{w}]"), f, None),
        op("ConvolutionBackward0", 101, 48, "[]", "[]", Some(1)),
        op(
            "aten::convolution_backward",
            102,
            46,
            &format!("[[2,8,4,4],{x},{w}]"),
            r#"["float", "float", "float"]"#,
            None,
        ),
    ];
    let (input, weight) = (i64::from(2 * c_in * 16 * 4), i64::from(8 * c_in * 4));
    ev.extend(block(1 << 20, 14, 1024, 200)); // output
    ev.extend(block(4 << 20, 103, input, 300)); // grad_input
    ev.extend(block(6 << 20, 110, weight, 300)); // grad_weight
    analysis_of(&ev)
}

/// A 1×1 convolution at stride 1 reads its tensors as they lie: no forward
/// or data workspace. Its filter pass keeps one fp32 weight gradient per
/// image over more than 32 input channels, and copies input and
/// grad_output over 32 or fewer, from grad_weight to the call's end
/// (`kernels::conv::pointwise_backward`).
#[test]
fn a_pointwise_filter_pass_keeps_its_partial_sums() {
    for (c_in, filter) in [(64_u32, 2 * 8 * 64 * 4), (16, 2 * 16 * 16 * 4 + 1024)] {
        let a = pointwise(c_in);
        assert_eq!(a.kernel_calls.conv.len(), 2, "{:?}", a.kernel_calls.conv);
        let plan = planned(&a);
        let ws = workspaces(&plan);
        assert_eq!(ws.len(), 1, "{c_in} channels: {ws:?}");
        assert_eq!(a.name(a.ops[ws[0].op].name), "aten::convolution_backward");
        assert_eq!(ws[0].size, Bytes(filter), "{c_in} channels");
        let grad_weight = a.blocks.iter().find(|b| b.addr == 6 << 20).unwrap();
        assert_eq!(ws[0].alloc, grad_weight.alloc_ts);
        assert_eq!(ws[0].free, Some(a.ops[ws[0].op].end));
    }
}
