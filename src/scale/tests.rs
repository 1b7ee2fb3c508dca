#![cfg(test)]
//! The rebuild rules on hand-written traces: a stack of N blocks made by
//! one generator, so the trace of 2 blocks scaled to N can be set beside
//! the trace of N blocks, event by event.

use std::collections::HashMap;

use super::*;

/// One event of the generated trace (µs timestamps as the profiler writes).
fn mem(ts: f64, addr: u64, bytes: i64) -> String {
    format!(
        r#"{{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": {ts}, "args": {{"Addr": {addr}, "Bytes": {bytes}, "Device Type": 0}}}}"#
    )
}

/// The trace of `events`, as the profiler exports them.
fn trace_of(events: &[String]) -> Trace {
    let text = format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n"));
    crate::trace::parse(text.as_bytes()).unwrap().value
}

fn frame(name: &str, ts: f64, dur: f64, id: i64, parent: i64) -> String {
    format!(
        r#"{{"ph": "X", "cat": "python_function", "name": "{name}", "ts": {ts}, "dur": {dur}, "args": {{"Python id": {id}, "Python parent id": {parent}}}}}"#
    )
}

/// A CPU op as the profiler writes it: `Input Dims` and `Input type` as
/// given, and with `autograd` its sequence number and whether it runs in
/// backward (`Fwd thread id`).
fn call(
    name: &str,
    ts: f64,
    dur: f64,
    dims: &str,
    types: &str,
    autograd: Option<(i64, bool)>,
) -> String {
    let autograd = autograd.map_or(String::new(), |(seq, backward)| {
        format!(
            r#""Sequence number": {seq}, "Fwd thread id": {}, "#,
            u8::from(backward)
        )
    });
    format!(
        r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "ts": {ts}, "dur": {dur}, "args": {{{autograd}"Input Dims": {dims}, "Input type": {types}}}}}"#
    )
}

/// An op of the generated stack: every input a float tensor.
fn op(name: &str, ts: f64, dur: f64, seq: i64, backward: bool, dims: &str) -> String {
    let n = serde_json::from_str::<Vec<serde_json::Value>>(dims).map_or(0, |d| d.len());
    let types = serde_json::to_string(&vec!["float"; n]).unwrap_or_default();
    call(name, ts, dur, dims, &types, Some((seq, backward)))
}

/// A model of `n` blocks: each block's forward makes a temporary and its
/// output (the next block's input) and, with `cache`, a tensor it keeps to
/// the end (a KV cache). Inference frees a block's input when the block
/// returns; training keeps it for backward, where each block makes its
/// input's gradient, frees the gradient it got and its saved input, and
/// accumulates its weight's gradient, kept to the end.
fn stack(n: u32, train: bool, cache: bool) -> Trace {
    let mut ev: Vec<String> = Vec::new();
    let x = |k: u32| 1_000 + u64::from(k) * 64;
    let end = 10_000.0;
    ev.push(frame("nn.Module: Model_0", 10.0, 5_000.0, 1, 0));
    ev.push(mem(50.0, x(0), 2048));
    for k in 0..n {
        let t = 100.0 + 100.0 * f64::from(k);
        let id = 10 + i64::from(k);
        ev.push(frame(&format!("nn.Module: Block_{k}"), t, 80.0, id, 1));
        ev.push(frame(
            &format!("nn.Module: Linear_{k}"),
            t + 5.0,
            60.0,
            100 + id,
            id,
        ));
        ev.push(op(
            "aten::linear",
            t + 10.0,
            40.0,
            id,
            false,
            "[[4, 8, 16], [16, 16]]",
        ));
        ev.push(mem(t + 20.0, 5_000 + u64::from(k), 512));
        ev.push(mem(t + 30.0, x(k + 1), 2048));
        ev.push(mem(t + 40.0, 5_000 + u64::from(k), -512));
        if cache {
            ev.push(mem(t + 45.0, 7_000 + u64::from(k) * 64, 1024));
        }
        if !train {
            ev.push(mem(t + 85.0, x(k), -2048));
        }
    }
    let head = 100.0 + 100.0 * f64::from(n) + 10.0;
    ev.push(frame("nn.Module: Head_0", head - 5.0, 40.0, 50, 1));
    ev.push(op(
        "aten::linear",
        head,
        20.0,
        10 + i64::from(n),
        false,
        "[[4, 8, 16], [16, 16]]",
    ));
    ev.push(mem(head + 5.0, 9_000, 64));
    if train {
        let b0 = 6_000.0;
        ev.push(op(
            "LinearBackward0",
            b0,
            10.0,
            10 + i64::from(n),
            true,
            "[[4, 8, 16]]",
        ));
        ev.push(mem(b0 + 5.0, 20_000 + x(n), 2048));
        ev.push(mem(b0 + 6.0, 9_000, -64));
        ev.push(mem(b0 + 7.0, x(n), -2048));
        for k in (0..n).rev() {
            let b = 6_100.0 + 100.0 * f64::from(n - 1 - k);
            ev.push(op(
                "LinearBackward0",
                b,
                50.0,
                10 + i64::from(k),
                true,
                "[[4, 8, 16]]",
            ));
            ev.push(mem(b + 10.0, 20_000 + x(k), 2048));
            ev.push(mem(b + 20.0, 20_000 + x(k + 1), -2048));
            ev.push(mem(b + 30.0, x(k), -2048));
            ev.push(op(
                "torch::autograd::AccumulateGrad",
                b + 60.0,
                10.0,
                -1,
                true,
                "[[16, 16]]",
            ));
            ev.push(mem(b + 65.0, 30_000 + u64::from(k) * 64, 1024));
        }
        ev.push(mem(end - 50.0, 20_000 + x(0), -2048));
        for k in 0..n {
            ev.push(mem(end + f64::from(k), 30_000 + u64::from(k) * 64, -1024));
        }
    } else {
        ev.push(mem(head + 30.0, 9_000, -64));
        ev.push(mem(head + 31.0, x(n), -2048));
    }
    if cache {
        for k in 0..n {
            ev.push(mem(
                end + 100.0 + f64::from(k),
                7_000 + u64::from(k) * 64,
                -1024,
            ));
        }
    }
    trace_of(&ev)
}

/// Each `[memory]` event as (bytes, how many events later its free comes,
/// or 0): the trace's allocation pattern without addresses and times.
fn pattern(trace: &Trace) -> Vec<(i64, usize)> {
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut out: Vec<(i64, usize)> = trace.memory.iter().map(|m| (m.bytes, 0)).collect();
    for (i, m) in trace.memory.iter().enumerate() {
        if m.bytes > 0 {
            open.insert(m.addr, i);
        } else if let Some(a) = open.remove(&m.addr) {
            out[a].1 = i - a;
        }
    }
    out
}

fn deepen(trace: &Trace, layers: u32) -> (Trace, ScaleFacts) {
    let target = Target {
        layers: Some(layers),
        seq_len: None,
        new_tokens: None,
    };
    scale(trace, &target).unwrap().value
}

#[test]
fn inference_blocks_repeat_their_chain_and_what_each_keeps() {
    for cache in [false, true] {
        let (scaled, facts) = deepen(&stack(2, false, cache), 5);
        assert_eq!(
            pattern(&scaled),
            pattern(&stack(5, false, cache)),
            "cache {cache}"
        );
        let depth = facts.depth.unwrap();
        assert_eq!((depth.traced, depth.estimated), (2, 5));
        assert_eq!(depth.stacks[0].block, "Block");
        assert_eq!(depth.stacks[0].template, "Block_1");
    }
}

#[test]
fn training_blocks_repeat_forward_and_backward_chains_and_gradients() {
    let (scaled, _) = deepen(&stack(2, true, false), 4);
    assert_eq!(pattern(&scaled), pattern(&stack(4, true, false)));
    // The copies' module frames are numbered as a deeper model's are, the
    // head's after them; every copy's backward node keeps its forward op's
    // sequence number.
    let names: Vec<&str> = scaled
        .python
        .iter()
        .map(|p| scaled.name(p.name))
        .filter(|n| n.starts_with("nn.Module: Block") || n.starts_with("nn.Module: Linear"))
        .collect();
    assert_eq!(
        names,
        [
            "nn.Module: Block_0",
            "nn.Module: Linear_0",
            "nn.Module: Block_1",
            "nn.Module: Linear_1",
            "nn.Module: Block_2",
            "nn.Module: Linear_2",
            "nn.Module: Block_3",
            "nn.Module: Linear_3"
        ]
    );
    let forward: Vec<i64> = scaled
        .ops
        .iter()
        .filter(|o| o.fwd_thread_id == Some(0))
        .filter_map(|o| o.sequence_number)
        .collect();
    let mut backward: Vec<i64> = scaled
        .ops
        .iter()
        .filter(|o| o.fwd_thread_id == Some(1) && o.sequence_number != Some(-1))
        .filter_map(|o| o.sequence_number)
        .collect();
    backward.sort_unstable();
    let mut sorted = forward.clone();
    sorted.sort_unstable();
    assert_eq!(
        forward, sorted,
        "forward sequence numbers follow call order"
    );
    assert_eq!(
        backward, sorted,
        "each backward node has its forward op's number"
    );
}

#[test]
fn the_traced_depth_and_length_are_the_identity() {
    let trace = stack(3, true, true);
    let (same, facts) = deepen(&trace, 3);
    assert_eq!(same, trace);
    assert_eq!(facts.depth.map(|d| (d.traced, d.estimated)), Some((3, 3)));
    assert_eq!(inspect(&trace).layers, Some(3));
    assert_eq!(inspect(&trace).block.as_deref(), Some("Block"));
}

#[test]
fn what_cannot_be_rebuilt_is_refused_with_its_reason() {
    let trace = stack(3, false, false);
    let fewer = Target {
        layers: Some(2),
        seq_len: None,
        new_tokens: None,
    };
    assert!(matches!(
        scale(&trace, &fewer),
        Err(ScaleError::FewerLayers {
            traced: 3,
            layers: 2
        })
    ));
    let zero = Target {
        layers: Some(0),
        seq_len: None,
        new_tokens: None,
    };
    assert!(matches!(scale(&trace, &zero), Err(ScaleError::ZeroLayers)));
    let huge = Target {
        layers: Some(u32::MAX),
        seq_len: None,
        new_tokens: None,
    };
    assert!(matches!(
        scale(&trace, &huge),
        Err(ScaleError::TooManyLayers(_))
    ));
    let long = Target {
        layers: None,
        seq_len: Some(u32::MAX),
        new_tokens: None,
    };
    assert!(matches!(scale(&trace, &long), Err(ScaleError::TooLong(_))));
    // Long enough for a T² tensor past 1 PiB.
    let far = Target {
        layers: None,
        seq_len: Some(MAX_SEQ_LEN),
        new_tokens: None,
    };
    assert!(matches!(
        scale(&length::attention(16, 8), &far),
        Err(ScaleError::TensorTooLarge)
    ));
    let mut bare = trace.clone();
    bare.python.clear();
    let four = Target {
        layers: Some(4),
        seq_len: None,
        new_tokens: None,
    };
    assert!(matches!(
        scale(&bare, &four),
        Err(ScaleError::NoModuleFrames)
    ));
    let one = stack(1, false, false);
    assert!(matches!(
        scale(&one, &four),
        Err(ScaleError::NoRepeatedBlock)
    ));
    // No embedding op: the length cannot be found.
    let longer = Target {
        layers: None,
        seq_len: Some(128),
        new_tokens: None,
    };
    assert!(matches!(
        scale(&trace, &longer),
        Err(ScaleError::LengthNotFound)
    ));
    // Several traces need a length.
    assert!(matches!(
        scale_many(&[trace.clone(), trace], &Target::default()),
        Err(ScaleError::SeveralWithoutLength)
    ));
}

mod hostile {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// A stack with events dropped, moved and resized is rebuilt or
        /// refused, never a panic; a rebuilt trace keeps every event, in
        /// time order.
        #[test]
        fn damaged_stacks_are_rebuilt_or_refused(
            drops in proptest::collection::vec(0usize..64, 0..6),
            shifts in proptest::collection::vec((0usize..64, -300i64..300), 0..6),
            resize in proptest::collection::vec((0usize..64, 1i64..5000), 0..4),
            layers in 1u32..7,
            seq in proptest::option::of(1u32..200),
            train in any::<bool>(),
        ) {
            let mut trace = stack(3, train, true);
            for (i, dt) in &shifts {
                let n = trace.memory.len();
                if let Some(m) = trace.memory.get_mut(i % n) {
                    m.ts = crate::units::Nanos(m.ts.get() + dt * 1000);
                }
            }
            for (i, bytes) in &resize {
                let n = trace.memory.len();
                if let Some(m) = trace.memory.get_mut(i % n) {
                    m.bytes = if m.bytes > 0 { *bytes } else { -*bytes };
                }
            }
            for i in &drops {
                if !trace.memory.is_empty() {
                    let n = trace.memory.len();
                    trace.memory.remove(i % n);
                }
            }
            trace.memory.sort_by_key(|m| m.ts);
            let target = Target { layers: Some(layers), seq_len: seq, new_tokens: None };
            if let Ok(scaled) = scale(&trace, &target) {
                let (out, _) = scaled.value;
                prop_assert!(out.memory.len() >= trace.memory.len());
                prop_assert!(out.memory.windows(2).all(|w| w[0].ts <= w[1].ts));
            }
        }
    }
}

mod length;
