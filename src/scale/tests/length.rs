#![cfg(test)]
//! The lengthening rules (`--seq-len` from one trace) on hand-written
//! traces, each set beside the same trace written at the longer length.

use super::*;

/// `embedding(table [100, d], ids [2, t])`, the start of every trace here
/// (its output `[2, t, d]` is the block after it).
fn embedding(ts: f64, t: i64, d: i64) -> String {
    call(
        "aten::embedding",
        ts,
        5.0,
        &format!("[[100, {d}], [2, {t}]]"),
        r#"["float", "long int"]"#,
        None,
    )
}

/// A factory (`ones`, `zeros`): its sizes are numbers the trace does not
/// keep.
fn factory(name: &str, ts: f64, dur: f64) -> String {
    call(
        name,
        ts,
        dur,
        "[[], [], [], [], []]",
        r#"["ScalarList", "Scalar", "", "", ""]"#,
        None,
    )
}

/// A one-head attention over `t` tokens, batch 2, width `d`: embedding,
/// q/k/v projections, `scores = q @ kᵀ` (T²), softmax (T²), `scores @ v`
/// (T again: the product contracts T) and a sum to a scalar.
pub(super) fn attention(t: i64, d: i64) -> Trace {
    attention_in(t, d, None)
}

/// [`attention`], everything after the embedding inside an op named
/// `wrapper` that reads only the embedding (a Python autograd Function such
/// as a reentrant checkpoint's `CheckpointFunction`).
fn attention_in(t: i64, d: i64, wrapper: Option<&str>) -> Trace {
    let mut ev: Vec<String> = Vec::new();
    let f = |x: i64| x as f64;
    let mut ts = 10.0;
    let mut next = |dur: f64| {
        ts += dur;
        ts
    };
    let tensor = |dims: &[i64]| dims.iter().product::<i64>() * 4;
    let call =
        |name: &str, at: f64, dims: &str, types: &str| call(name, at, 5.0, dims, types, None);
    let float2 = r#"["float", "float"]"#;
    let at = next(10.0);
    ev.push(call(
        "aten::embedding",
        at,
        &format!("[[100, {d}], [2, {t}]]"),
        r#"["float", "long int"]"#,
    ));
    ev.push(mem(at + 1.0, 1, tensor(&[2, t, d])));
    for (addr, name) in [(2, "q"), (3, "k"), (4, "v")] {
        let at = next(10.0);
        let _ = name;
        ev.push(call(
            "aten::linear",
            at,
            &format!("[[2, {t}, {d}], [{d}, {d}]]"),
            float2,
        ));
        ev.push(mem(at + 1.0, addr, tensor(&[2, t, d])));
    }
    let at = next(10.0);
    ev.push(call(
        "aten::matmul",
        at,
        &format!("[[2, {t}, {d}], [2, {d}, {t}]]"),
        float2,
    ));
    ev.push(mem(at + 1.0, 5, tensor(&[2, t, t])));
    let at = next(10.0);
    ev.push(call(
        "aten::softmax",
        at,
        &format!("[[2, {t}, {t}]]"),
        r#"["float"]"#,
    ));
    ev.push(mem(at + 1.0, 6, tensor(&[2, t, t])));
    ev.push(mem(at + 2.0, 5, -tensor(&[2, t, t])));
    let at = next(10.0);
    ev.push(call(
        "aten::matmul",
        at,
        &format!("[[2, {t}, {t}], [2, {t}, {d}]]"),
        float2,
    ));
    ev.push(mem(at + 1.0, 7, tensor(&[2, t, d])));
    let at = next(10.0);
    ev.push(call(
        "aten::sum",
        at,
        &format!("[[2, {t}, {d}]]"),
        r#"["float"]"#,
    ));
    ev.push(mem(at + 1.0, 8, 4));
    let end = next(10.0);
    if let Some(name) = wrapper {
        ev.push(self::call(
            name,
            27.0,
            end - 28.0,
            &format!("[[2, {t}, {d}]]"),
            r#"["float"]"#,
            None,
        ));
    }
    for (addr, dims) in [
        (1, [2, t, d]),
        (2, [2, t, d]),
        (3, [2, t, d]),
        (4, [2, t, d]),
    ] {
        ev.push(mem(end + f(addr), addr as u64, -tensor(&dims)));
    }
    ev.push(mem(end + 10.0, 6, -tensor(&[2, t, t])));
    ev.push(mem(end + 11.0, 7, -tensor(&[2, t, d])));
    ev.push(mem(end + 12.0, 8, -4));
    trace_of(&ev)
}

fn lengthen(trace: &Trace, len: u32) -> (Trace, LengthFacts) {
    let target = Target {
        layers: None,
        seq_len: Some(len),
        new_tokens: None,
    };
    let (trace, facts) = scale(trace, &target).unwrap().value;
    (trace, facts.length.unwrap())
}

#[test]
fn a_length_grows_activations_as_t_and_attention_scores_as_t_squared() {
    let (scaled, facts) = lengthen(&attention(16, 8), 64);
    assert_eq!(pattern(&scaled), pattern(&attention(64, 8)));
    // h, q, k, v, scores @ v (T) and scores, softmax (T²); the sum none.
    assert_eq!((facts.linear, facts.quadratic), (5, 2));
    assert_eq!(facts.method, "shapes");
    // The recorded dims follow: the analyzer matches reads to the new sizes.
    let dims: Vec<Vec<i64>> = scaled
        .ops
        .iter()
        .filter(|o| scaled.name(o.name) == "aten::softmax")
        .flat_map(|o| {
            scaled
                .tensor_args(o)
                .iter()
                .map(|a| scaled.numbers(a.dims).to_vec())
        })
        .collect();
    assert_eq!(dims, [vec![2, 64, 64]]);
}

#[test]
fn a_head_as_wide_as_the_length_is_told_apart_by_the_data_flow() {
    // Traced at T = 8 = d: q [2, 8, 8] looks like scores to its readers; the
    // projection that made it grows as T, and `scores @ v` contracts T.
    let (scaled, facts) = lengthen(&attention(8, 8), 64);
    assert_eq!(pattern(&scaled), pattern(&attention(64, 8)));
    assert_eq!((facts.linear, facts.quadratic), (5, 2));
}

#[test]
fn an_op_that_runs_ops_is_not_the_maker_of_their_blocks() {
    // A reentrant checkpoint's forward (`CheckpointFunction`, a Python
    // autograd Function) reads only its block's input, [2, T, d]: taken for
    // the maker of the scores, it bounded them as T.
    let (scaled, facts) = lengthen(&attention_in(16, 8, Some("CheckpointFunction")), 64);
    assert_eq!(
        pattern(&scaled),
        pattern(&attention_in(64, 8, Some("CheckpointFunction")))
    );
    assert_eq!((facts.linear, facts.quadratic), (5, 2));
}

/// An embedding `h` [2, T, d] whose row 0 is selected ([2, d]), a gradient
/// of that row (no length in it), and `select_backward` scattering it into
/// zeros of `h`'s sizes, which an `add` then reads beside `h`.
fn select_backward(t: i64) -> Trace {
    let d = 8;
    let bytes = 2 * t * d * 4;
    let ev = [
        embedding(10.0, t, d),
        mem(11.0, 1, bytes),
        factory("aten::ones", 20.0, 2.0),
        mem(21.0, 2, 2 * d * 4),
        call(
            "aten::select_backward",
            30.0,
            10.0,
            &format!("[[2, {d}], [], [], []]"),
            r#"["float", "ScalarList", "Scalar", "Scalar"]"#,
            None,
        ),
        factory("aten::zeros", 31.0, 5.0),
        mem(32.0, 3, bytes),
        call(
            "aten::add",
            50.0,
            5.0,
            &format!("[[2, {t}, {d}], [2, {t}, {d}], []]"),
            r#"["float", "float", "Scalar"]"#,
            None,
        ),
        mem(51.0, 4, bytes),
        mem(60.0, 4, -bytes),
        mem(61.0, 3, -bytes),
        mem(62.0, 2, -2 * d * 4),
        mem(63.0, 1, -bytes),
    ];
    trace_of(&ev)
}

#[test]
fn a_gradient_scattered_into_the_inputs_sizes_grows_as_the_input() {
    // `select_backward(grad [2, d], input_sizes = [2, T, d])`: its output
    // has the sizes it is given, not the gradient's.
    let (scaled, facts) = lengthen(&select_backward(16), 64);
    assert_eq!(pattern(&scaled), pattern(&select_backward(64)));
    assert_eq!(facts.linear, 3);
}

/// `h` [2, T, 8] and a [4, 64] tensor made after it (no length in it; the
/// same bytes at T = 16) are live when `cat((h, h))` reads `h` twice (as Llama's
/// rotary `cat((freqs, freqs))`): the second element's read was bound to the
/// other block and kept its traced dims. Elements of one list with the same
/// dims hold the length in the same dims: both grow.
fn concatenation(t: i64) -> Trace {
    let d = 8;
    let bytes = 2 * t * d * 4;
    let ev = [
        embedding(10.0, t, d),
        mem(11.0, 1, bytes),
        factory("aten::ones", 20.0, 2.0),
        mem(21.0, 2, 32 * d * 4),
        call("aten::relu_", 24.0, 2.0, "[[4, 64]]", r#"["float"]"#, None),
        call(
            "aten::cat",
            30.0,
            5.0,
            &format!("[[[2, {t}, {d}], [2, {t}, {d}]], []]"),
            r#"["TensorList", "Scalar"]"#,
            None,
        ),
        mem(31.0, 3, 2 * bytes),
        mem(40.0, 3, -2 * bytes),
        mem(41.0, 2, -32 * d * 4),
        mem(42.0, 1, -bytes),
    ];
    trace_of(&ev)
}

#[test]
fn a_lists_alike_elements_grow_alike() {
    let (scaled, _) = lengthen(&concatenation(16), 64);
    let dims: Vec<Vec<i64>> = scaled
        .ops
        .iter()
        .filter(|o| scaled.name(o.name) == "aten::cat")
        .flat_map(|o| {
            scaled
                .tensor_args(o)
                .iter()
                .map(|a| scaled.numbers(a.dims).to_vec())
        })
        .filter(|d| !d.is_empty())
        .collect();
    assert_eq!(dims, [vec![2, 64, 8], vec![2, 64, 8]]);
    assert_eq!(pattern(&scaled), pattern(&concatenation(64)));
}

/// A data loader's collate stacking two dataset rows of T token ids (from
/// before the trace, as `TensorDataset` holds them), while a block of twice
/// a row's bytes made outside the loader (an optimizer state of the step
/// before, `zeros_like` of a parameter) is live; an embedding then reads the batch.
fn loader_batch(t: i64) -> Trace {
    let ev = [
        call("aten::zeros_like", 4.0, 3.0, "[[64]]", r#"["float"]"#, None),
        mem(5.0, 9, 256),
        r#"{"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "ts": 10.0, "dur": 30.0, "args": {}}"#
            .to_string(),
        call(
            "aten::stack",
            12.0,
            20.0,
            &format!("[[[{t}], [{t}]], []]"),
            r#"["TensorList", "Scalar"]"#,
            None,
        ),
        call(
            "aten::cat",
            13.0,
            10.0,
            &format!("[[[{t}], [{t}]], []]"),
            r#"["TensorList", "Scalar"]"#,
            None,
        ),
        mem(15.0, 1, 2 * t * 8),
        call(
            "aten::view",
            25.0,
            2.0,
            &format!("[[{}], []]", 2 * t),
            r#"["long int", "ScalarList"]"#,
            None,
        ),
        embedding(50.0, t, 8),
        mem(51.0, 2, 2 * t * 8 * 4),
        mem(60.0, 2, -2 * t * 8 * 4),
        mem(61.0, 1, -2 * t * 8),
        mem(62.0, 9, -256),
    ];
    trace_of(&ev)
}

#[test]
fn the_loader_reads_the_dataset_not_the_steps_blocks() {
    // The rows are int64 (the collate's view of its output says so): 128 B
    // each at T = 16, so a slice of the 256 B state would fit them. Read as
    // that state, the batch kept its traced size, and so did every
    // activation made from it (a LoRA job's second step).
    let (scaled, _) = lengthen(&loader_batch(16), 64);
    assert_eq!(pattern(&scaled), pattern(&loader_batch(64)));
}

#[test]
fn several_traces_are_fitted_size_by_size() {
    let traces = [attention(16, 8), attention(32, 8), attention(48, 8)];
    for given in [&traces[..2], &traces[..]] {
        let target = Target {
            layers: None,
            seq_len: Some(96),
            new_tokens: None,
        };
        let (fitted, facts) = scale_many(given, &target).unwrap().value;
        assert_eq!(pattern(&fitted), pattern(&attention(96, 8)));
        let length = facts.length.unwrap();
        assert_eq!(length.method, "fit");
        assert_eq!((length.linear, length.quadratic), (5, 2));
    }
    // Not the same job: another width.
    let other = [attention(16, 8), attention(32, 12)];
    let target = Target {
        layers: None,
        seq_len: Some(96),
        new_tokens: None,
    };
    assert!(matches!(
        scale_many(&other, &target),
        Err(ScaleError::NotTheSameJob(_)) | Ok(_)
    ));
}

/// An embedding `h` [2, T, 8] read as query, key and value by an attention
/// call on the math path, which makes its causal mask inside:
/// `ones(T, T)` (bool), then `tril` of it, which `all` reads.
fn masked_attention(t: i64) -> Trace {
    let d = 8;
    let bytes = 2 * t * d * 4;
    let qkv = format!("[[2, {t}, {d}], [2, {t}, {d}], [2, {t}, {d}]]");
    let floats = r#"["float", "float", "float"]"#;
    let ev = [
        embedding(10.0, t, d),
        mem(11.0, 1, bytes),
        call(
            "aten::scaled_dot_product_attention",
            20.0,
            50.0,
            &qkv,
            floats,
            None,
        ),
        call(
            "aten::_scaled_dot_product_attention_math",
            21.0,
            48.0,
            &qkv,
            floats,
            None,
        ),
        call(
            "aten::ones",
            22.0,
            4.0,
            "[[], [], [], [], []]",
            r#"["ScalarList", "ScalarType", "", "", ""]"#,
            None,
        ),
        call(
            "aten::empty",
            23.0,
            1.0,
            "[[], [], [], [], [], []]",
            r#"["ScalarList", "ScalarType", "", "", "", ""]"#,
            None,
        ),
        mem(23.5, 2, t * t),
        call(
            "aten::tril",
            30.0,
            4.0,
            &format!("[[{t}, {t}], []]"),
            r#"["bool", "Scalar"]"#,
            None,
        ),
        mem(31.0, 3, t * t),
        mem(35.0, 2, -t * t),
        mem(60.0, 4, bytes),
        call(
            "aten::all",
            62.0,
            1.0,
            &format!("[[{t}, {t}]]"),
            r#"["bool"]"#,
            None,
        ),
        mem(65.0, 3, -t * t),
        mem(80.0, 4, -bytes),
        mem(81.0, 1, -bytes),
    ];
    trace_of(&ev)
}

#[test]
fn a_factory_inside_an_attention_call_is_sized_by_its_readers() {
    // The causal mask the math path makes inside the attention call reads
    // nothing: taken for the kernel's output, it was bounded by the query's
    // length (T), where `tril` reads it as [T, T].
    let (scaled, facts) = lengthen(&masked_attention(16), 64);
    assert_eq!(pattern(&scaled), pattern(&masked_attention(64)));
    assert_eq!(facts.quadratic, 2);
}

/// A 4-bit layer run as one kernel (no ATen ops inside it):
/// `gemm_4bit(x, packed, shape, absmax, code)` on `relu(h)`, its absmax
/// ([192] fp32) as many bytes as `h` at 12 tokens, while `h` is live.
fn quantized_layer(t: i64) -> Trace {
    quantized_layer_packed(t, 40)
}

/// `quantized_layer` with a packed weight of `[rows, 1]` bytes.
fn quantized_layer_packed(t: i64, rows: i64) -> Trace {
    let d = 8;
    let bytes = 2 * t * d * 4;
    let ev = [
        embedding(10.0, t, d),
        mem(11.0, 1, bytes),
        call(
            "aten::relu",
            20.0,
            5.0,
            &format!("[[2, {t}, {d}]]"),
            r#"["float"]"#,
            None,
        ),
        mem(21.0, 2, bytes),
        call(
            "bitsandbytes::gemm_4bit",
            30.0,
            5.0,
            &format!("[[2, {t}, {d}], [{rows}, 1], [], [192], [16]]"),
            r#"["float", "unsigned char", "ScalarList", "float", "float"]"#,
            None,
        ),
        mem(31.0, 3, bytes),
        call(
            "aten::add",
            40.0,
            5.0,
            &format!("[[2, {t}, {d}], [2, {t}, {d}], []]"),
            r#"["float", "float", "Scalar"]"#,
            None,
        ),
        mem(41.0, 4, bytes),
        mem(50.0, 4, -bytes),
        mem(51.0, 3, -bytes),
        mem(52.0, 2, -bytes),
        mem(53.0, 1, -bytes),
    ];
    trace_of(&ev)
}

#[test]
fn a_quantized_weights_state_is_never_a_block_of_the_step() {
    // Read as `h`, the absmax made the kernel a product of two length-long
    // inputs, contracting the length: its output kept its traced size.
    let (scaled, facts) = lengthen(&quantized_layer(12), 64);
    assert_eq!(pattern(&scaled), pattern(&quantized_layer(64)));
    assert_eq!(facts.linear, 4);
}

#[test]
fn a_packed_weight_with_the_lengths_dims_holds_no_length() {
    // 24 packed rows at batch 2 × 12 tokens: read as holding the length,
    // the weight made the kernel a product of two length-long inputs, and
    // its output kept its traced size.
    let (scaled, _) = lengthen(&quantized_layer_packed(12, 24), 64);
    assert_eq!(pattern(&scaled), pattern(&quantized_layer_packed(64, 24)));
}
