#![cfg(test)]
//! The resident-state search on small cases.

use super::findings::{run_kind, totals};
use super::*;

#[test]
fn run_kinds_follow_backward_autograd_and_frozen_parameters() {
    let item = |trainable| StateItem {
        kind: StateKind::Parameter,
        trainable,
        bytes: Bytes(4),
        shape: vec![1],
        dtype: None,
        layer: None,
        source: StateSource::AccumulateGrad,
        first_read: None,
        last_read: None,
        block: None,
    };
    assert_eq!(run_kind(true, true, &[item(true)]), RunKind::Training);
    assert_eq!(
        run_kind(true, true, &[item(true), item(false)]),
        RunKind::FineTuning
    );
    assert_eq!(
        run_kind(false, true, &[item(false)]),
        RunKind::ForwardWithAutograd
    );
    assert_eq!(run_kind(false, false, &[item(false)]), RunKind::Inference);
    let t = totals(&[item(true), item(false)]);
    assert_eq!(
        (t.parameters, t.trainable, t.frozen),
        (Bytes(8), Bytes(4), Bytes(4))
    );
}

/// An autocast forward under no_grad: after a linear layer, a module
/// reads with one `einsum` the bf16 probabilities it made (a tensor-list
/// element: no dtype recorded) and an fp32 weight made before the trace;
/// `einsum`'s child `bmm` records the element's dtype. The parameters
/// are the linear's two and the einsum's weight: at the trace's common
/// type (fp32) the probabilities match no live block and were taken for
/// a fourth.
#[test]
fn a_list_element_takes_its_dtype_from_the_ops_children() {
    let ev = [
        r#"{"ph": "X", "cat": "python_function", "name": "nn.Module: Model_0", "ts": 10, "dur": 500, "args": {"Python id": 1, "Python parent id": 0}}"#,
        r#"{"ph": "X", "cat": "python_function", "name": "nn.Module: Attn_0", "ts": 20, "dur": 400, "args": {"Python id": 2, "Python parent id": 1}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 30, "dur": 20, "args": {"Input Dims": [[2, 8, 16], [16, 16], [16]], "Input type": ["float", "float", "float"]}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 40, "args": {"Addr": 4096, "Bytes": 1024, "Device Type": 0}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::softmax", "ts": 60, "dur": 20, "args": {"Input Dims": [[2, 8, 16], []], "Input type": ["float", "Scalar"]}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 70, "args": {"Addr": 8192, "Bytes": 512, "Device Type": 0}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 90, "args": {"Addr": 4096, "Bytes": -1024, "Device Type": 0}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::einsum", "ts": 100, "dur": 50, "args": {"Input Dims": [[], [[2, 8, 16], [16, 16]], []], "Input type": ["", "TensorList", ""]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::bmm", "ts": 110, "dur": 20, "args": {"Input Dims": [[2, 8, 16], [16, 16]], "Input type": ["c10::BFloat16", "float"]}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 120, "args": {"Addr": 12288, "Bytes": 512, "Device Type": 0}}"#,
    ];
    let json = format!(r#"{{"traceEvents": [{}]}}"#, ev.join(","));
    let trace = crate::trace::parse(json.as_bytes()).unwrap().value;
    let analysis = crate::analyzer::analyze(&trace, &crate::analyzer::AnalyzerConfig::standard())
        .unwrap()
        .value;
    let params: Vec<(Vec<i64>, Bytes)> = analysis
        .state
        .items
        .iter()
        .filter(|i| i.kind == StateKind::Parameter)
        .map(|i| (i.shape.clone(), i.bytes))
        .collect();
    assert_eq!(
        params,
        vec![
            (vec![16], Bytes(64)),
            (vec![16, 16], Bytes(1024)),
            (vec![16, 16], Bytes(1024))
        ],
        "{:?}",
        analysis.state.items
    );
}

/// Under autocast a module concatenates two bf16 tensors it made (as
/// Llama's `rotate_half`: `cat((-x2, x1))`; tensor-list elements, no dtype
/// recorded) and the CPU kernel writes them into `narrow` views of its
/// output, the only child with a dtype: the elements take the output's.
/// Read as fp32 (the trace's common type) they matched no live block and
/// were taken for tensors made before the trace.
#[test]
fn a_concatenations_elements_take_the_dtype_of_its_output() {
    let ev = [
        r#"{"ph": "X", "cat": "python_function", "name": "nn.Module: Model_0", "ts": 10, "dur": 500, "args": {"Python id": 1, "Python parent id": 0}}"#,
        r#"{"ph": "X", "cat": "python_function", "name": "nn.Module: Attn_0", "ts": 20, "dur": 400, "args": {"Python id": 2, "Python parent id": 1}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 30, "dur": 20, "args": {"Input Dims": [[2, 8, 16], [16, 16]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 40, "args": {"Addr": 4096, "Bytes": 512, "Device Type": 0}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 60, "dur": 20, "args": {"Input Dims": [[2, 8, 16], [8, 16]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 70, "args": {"Addr": 8192, "Bytes": 256, "Device Type": 0}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::cat", "ts": 100, "dur": 50, "args": {"Input Dims": [[[2, 8, 16], [2, 8, 8]], []], "Input type": ["TensorList", "Scalar"]}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 105, "args": {"Addr": 12288, "Bytes": 768, "Device Type": 0}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::narrow", "ts": 110, "dur": 10, "args": {"Input Dims": [[2, 8, 24], [], [], []], "Input type": ["c10::BFloat16", "Scalar", "Scalar", "Scalar"]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::narrow", "ts": 125, "dur": 10, "args": {"Input Dims": [[2, 8, 24], [], [], []], "Input type": ["c10::BFloat16", "Scalar", "Scalar", "Scalar"]}}"#,
        // The trace's common type is fp32 (the model's own tensors): the
        // default of a read without a dtype.
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::ones", "ts": 200, "dur": 10, "args": {"Input Dims": [[], [], [], [], []], "Input type": ["ScalarList", "Scalar", "", "", ""]}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 205, "args": {"Addr": 16384, "Bytes": 2048, "Device Type": 0}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::relu_", "ts": 220, "dur": 10, "args": {"Input Dims": [[2, 8, 32]], "Input type": ["float"]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::relu_", "ts": 240, "dur": 10, "args": {"Input Dims": [[2, 8, 32]], "Input type": ["float"]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::relu_", "ts": 260, "dur": 10, "args": {"Input Dims": [[2, 8, 32]], "Input type": ["float"]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::relu_", "ts": 280, "dur": 10, "args": {"Input Dims": [[2, 8, 32]], "Input type": ["float"]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::relu_", "ts": 300, "dur": 10, "args": {"Input Dims": [[2, 8, 32]], "Input type": ["float"]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::relu_", "ts": 320, "dur": 10, "args": {"Input Dims": [[2, 8, 32]], "Input type": ["float"]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::relu_", "ts": 340, "dur": 10, "args": {"Input Dims": [[2, 8, 32]], "Input type": ["float"]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::relu_", "ts": 360, "dur": 10, "args": {"Input Dims": [[2, 8, 32]], "Input type": ["float"]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::relu_", "ts": 380, "dur": 10, "args": {"Input Dims": [[2, 8, 32]], "Input type": ["float"]}}"#,
    ];
    let json = format!(r#"{{"traceEvents": [{}]}}"#, ev.join(","));
    let trace = crate::trace::parse(json.as_bytes()).unwrap().value;
    let analysis = crate::analyzer::analyze(&trace, &crate::analyzer::AnalyzerConfig::standard())
        .unwrap()
        .value;
    let state: Vec<(StateKind, Vec<i64>)> = analysis
        .state
        .items
        .iter()
        .map(|i| (i.kind, i.shape.clone()))
        .collect();
    // The input, the two weights; the concatenated halves are the
    // linears' outputs.
    assert_eq!(
        state,
        vec![
            (StateKind::Parameter, vec![16, 16]),
            (StateKind::Activation, vec![2, 8, 16]),
            (StateKind::Parameter, vec![8, 16])
        ],
        "{:?}",
        analysis.state.items
    );
}

/// A 4-bit (NF4, double quantisation) and an int8 layer: their packed and
/// int8 weights are parameters (read by `MatMul4Bit`/`MatMul8bitLt`); the
/// quantisation state is read only by the nested bitsandbytes kernels:
/// the quantized absmax, its absmax and code (`dequantize_blockwise`), and
/// the int8 weight's `SCB` (`int8_mixed_scaled_mm`, then again by
/// `int8_scaled_mm`: one tensor). The float absmax `dequantize_4bit` reads
/// was made by the call itself, and the 4-bit layer gets its 16-value code
/// table.
#[test]
fn quantisation_state_is_read_by_nested_kernels_once_per_layer() {
    let ev = [
        r#"{"ph": "X", "cat": "python_function", "name": "nn.Module: Model_0", "ts": 10, "dur": 990, "args": {"Python id": 1, "Python parent id": 0}}"#,
        r#"{"ph": "X", "cat": "python_function", "name": "nn.Module: Linear4bit_0", "ts": 20, "dur": 380, "args": {"Python id": 2, "Python parent id": 1}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "MatMul4Bit", "ts": 30, "dur": 270, "args": {"Input Dims": [[2, 16], [128, 1], [], []], "Input type": ["float", "unsigned char", "", ""]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "bitsandbytes::dequantize_blockwise", "ts": 40, "dur": 60, "args": {"Input Dims": [[4], [1], [256], [], []], "Input type": ["unsigned char", "float", "float", "Scalar", "Scalar"]}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 50, "args": {"Addr": 4096, "Bytes": 16, "Device Type": 0}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "bitsandbytes::dequantize_4bit", "ts": 110, "dur": 90, "args": {"Input Dims": [[128, 1], [4], [], [], [], []], "Input type": ["unsigned char", "float", "Scalar", "", "ScalarList", "Scalar"]}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 120, "args": {"Addr": 8192, "Bytes": 1024, "Device Type": 0}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 210, "args": {"Addr": 4096, "Bytes": -16, "Device Type": 0}}"#,
        r#"{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 290, "args": {"Addr": 8192, "Bytes": -1024, "Device Type": 0}}"#,
        r#"{"ph": "X", "cat": "python_function", "name": "nn.Module: Linear8bitLt_0", "ts": 500, "dur": 400, "args": {"Python id": 3, "Python parent id": 1}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "MatMul8bitLt", "ts": 510, "dur": 380, "args": {"Input Dims": [[2, 16], [16, 16], [], []], "Input type": ["float", "signed char", "", ""]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "bitsandbytes::int8_mixed_scaled_mm", "ts": 520, "dur": 280, "args": {"Input Dims": [[2, 16], [2, 16], [16, 16], [2], [16], [0], []], "Input type": ["float", "signed char", "signed char", "float", "float", "long int", ""]}}"#,
        r#"{"ph": "X", "cat": "cpu_op", "name": "bitsandbytes::int8_scaled_mm", "ts": 530, "dur": 170, "args": {"Input Dims": [[2, 16], [16, 16], [2], [16], [], []], "Input type": ["signed char", "signed char", "float", "float", "", "Scalar"]}}"#,
    ];
    let json = format!(r#"{{"traceEvents": [{}]}}"#, ev.join(","));
    let trace = crate::trace::parse(json.as_bytes()).unwrap().value;
    let analysis = crate::analyzer::analyze(&trace, &crate::analyzer::AnalyzerConfig::standard())
        .unwrap()
        .value;
    let of = |kind| -> Vec<(Vec<i64>, Bytes)> {
        let mut v: Vec<_> = analysis
            .state
            .of(kind)
            .map(|i| (i.shape.clone(), i.bytes))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        of(StateKind::Parameter),
        vec![(vec![16, 16], Bytes(256)), (vec![128, 1], Bytes(128))],
        "{:?}",
        analysis.state.items
    );
    assert_eq!(
        of(StateKind::QuantState),
        vec![
            (vec![1], Bytes(4)),
            (vec![4], Bytes(4)),
            (vec![16], Bytes(64)),
            (vec![16], Bytes(64)),
            (vec![256], Bytes(1024)),
        ],
        "{:?}",
        analysis.state.items
    );
    let t = analysis.state.totals;
    assert_eq!((t.quantized, t.quant_state), (Bytes(384), Bytes(1160)));
    assert_eq!(analysis.state.run_kind, RunKind::Inference);
    // the two layers' kernels, for the CUDA rules
    let kinds: Vec<_> = analysis.quant_kernels.iter().map(|k| k.kind).collect();
    use crate::analyzer::quantized::QuantOp;
    assert_eq!(
        kinds,
        vec![QuantOp::DequantizeBlockwise, QuantOp::Dequantize4bit]
    );
}
