//! `analyzer::analyze`: golden checks of every real fixture against its
//! `.meta.json`, and one small hand-written trace per rule.

// Test helpers here panic on purpose: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use memcast::analyzer::{
    self, Analysis, AnalyzeError, AnalyzerConfig, BlockRole, Phase, ZeroGradPlacement,
};
use memcast::trace::{self, Device, Trace};
use memcast::{Bytes, Nanos};

use crate::common;

pub(crate) struct Fixture {
    pub name: String,
    pub meta: serde_json::Value,
    pub trace: Trace,
    pub parse_warnings: Vec<memcast::Warning>,
    pub analysis: Analysis,
}

/// Every real fixture, parsed and analyzed once for all tests of the binary.
pub(crate) fn fixtures() -> &'static [Fixture] {
    static CELL: OnceLock<Vec<Fixture>> = OnceLock::new();
    CELL.get_or_init(|| {
        common::trace_fixtures()
            .into_iter()
            .map(|name| {
                let bytes = common::read_shared(&format!("fixtures/traces/{name}"));
                let parsed = trace::parse(&bytes).unwrap();
                let (trace, parse_warnings) = (parsed.value, parsed.warnings);
                let analyzed = analyzer::analyze(&trace, &AnalyzerConfig::standard()).unwrap();
                assert!(
                    analyzed.warnings.is_empty(),
                    "{name}: {:?}",
                    analyzed.warnings
                );
                let meta_name = name.replace(".json.gz", ".meta.json");
                let meta = serde_json::from_slice(&common::read_shared(&format!(
                    "fixtures/traces/{meta_name}"
                )))
                .unwrap();
                Fixture {
                    name,
                    meta,
                    trace,
                    parse_warnings,
                    analysis: analyzed.value,
                }
            })
            .collect()
    })
}

fn local(name: &str) -> (Trace, Analysis, Vec<memcast::Warning>) {
    let bytes = std::fs::read(common::local_fixture(name)).unwrap();
    let trace = trace::parse(&bytes).unwrap().value;
    let analyzed = analyzer::analyze(&trace, &AnalyzerConfig::standard()).unwrap();
    (trace, analyzed.value, analyzed.warnings)
}

fn u64_of(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap()
}

#[test]
fn parameter_bytes_are_recovered_exactly() {
    for f in fixtures() {
        let totals = f.analysis.parameter_totals;
        assert_eq!(
            totals.bytes.get(),
            u64_of(&f.meta["param_bytes"]),
            "{}",
            f.name
        );
        assert_eq!(totals.numel, u64_of(&f.meta["param_count"]), "{}", f.name);
        let sum: Bytes = f.analysis.parameters.iter().map(|p| p.bytes).sum();
        assert_eq!(sum, totals.bytes);
        assert!(f
            .analysis
            .parameters
            .iter()
            .enumerate()
            .all(|(i, p)| p.index == i));
    }
}

#[test]
fn iterations_follow_the_profiler_steps() {
    for f in fixtures() {
        let its = &f.analysis.iterations;
        assert_eq!(
            its.len() as u64,
            u64_of(&f.meta["iterations"]),
            "{}",
            f.name
        );
        let labels: Vec<&str> = its.iter().filter_map(|i| i.label.as_deref()).collect();
        let expected: Vec<&str> = f.meta["trace"]["profiler_steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(labels, expected, "{}", f.name);
        for it in its {
            let phases: Vec<Phase> = it.phases.iter().map(|p| p.phase).collect();
            for phase in [
                Phase::DataLoading,
                Phase::ZeroGrad,
                Phase::Forward,
                Phase::Backward,
                Phase::OptimizerStep,
            ] {
                assert_eq!(
                    phases.iter().filter(|&&p| p == phase).count(),
                    1,
                    "{} {:?}: {phases:?}",
                    f.name,
                    it.label
                );
            }
            assert!(it.phases.windows(2).all(|w| w[0].start <= w[1].start));
            assert!(it
                .phases
                .iter()
                .all(|p| it.start <= p.start && p.end <= it.end));
            // Backward comes after forward; the step after backward.
            let at = |phase| it.phases.iter().find(|p| p.phase == phase).unwrap();
            assert!(
                at(Phase::Forward).end <= at(Phase::Backward).start,
                "{}",
                f.name
            );
            assert!(
                at(Phase::Backward).end <= at(Phase::OptimizerStep).start,
                "{}",
                f.name
            );
        }
        assert!(its.windows(2).all(|w| w[0].end <= w[1].start), "{}", f.name);
    }
}

#[test]
fn blocks_pair_every_memory_event() {
    for f in fixtures() {
        let a = &f.analysis;
        let stats = &f.meta["trace"];
        assert_eq!(a.events.len() as u64, u64_of(&stats["num_memory_events"]));
        assert_eq!(
            a.blocks.len() as u64,
            u64_of(&stats["num_alloc_events"]),
            "{}",
            f.name
        );
        let n_freed = a.blocks.iter().filter(|b| b.free_ts.is_some()).count() as u64;
        assert_eq!(n_freed, u64_of(&stats["num_free_events"]), "{}", f.name);
        assert!(a.unmatched_frees.is_empty(), "{}", f.name);
        for (i, block) in a.blocks.iter().enumerate() {
            assert_eq!(block.id, i);
            let alloc = &a.events[block.alloc_event];
            assert_eq!(alloc.block, Some(i));
            assert_eq!(alloc.delta, block.size.get() as i64);
            assert_eq!(alloc.addr, block.addr);
            if let Some(free) = block.free_event {
                assert!(free > block.alloc_event);
                assert_eq!(a.events[free].delta, -(block.size.get() as i64));
                assert_eq!(Some(a.events[free].ts), block.free_ts);
            }
        }
        assert!(a
            .blocks
            .windows(2)
            .all(|w| w[0].alloc_event < w[1].alloc_event));
        assert_eq!(
            a.devices.events_by_device.get(&Device::Cpu),
            Some(&a.events.len())
        );
        assert!(!a.devices.recorded_on_cuda);
    }
}

#[test]
fn blocks_reproduce_total_allocated_at_every_event() {
    for f in fixtures() {
        let a = &f.analysis;
        let mut live: i64 = 0;
        let mut max = 0;
        for (i, event) in a.events.iter().enumerate() {
            let block = &a.blocks[event.block.unwrap()];
            if block.alloc_event == i {
                live += block.size.get() as i64;
            } else {
                assert_eq!(block.free_event, Some(i));
                live -= block.size.get() as i64;
            }
            assert_eq!(Some(live), event.total_allocated, "{} event {i}", f.name);
            max = max.max(live);
        }
        let stats = &f.meta["trace"];
        assert_eq!(
            max as u64,
            u64_of(&stats["max_total_allocated_bytes"]),
            "{}",
            f.name
        );
        assert_eq!(a.peak.bytes.get(), max as u64, "{}", f.name);
        assert_eq!(
            live as u64,
            u64_of(&stats["total_allocated_at_last_event_bytes"]),
            "{}",
            f.name
        );
        let persistent: u64 = a.persistent_blocks().map(|b| b.size.get()).sum();
        assert_eq!(persistent, live as u64, "{}", f.name);
    }
}

#[test]
fn gradients_are_one_block_per_parameter_per_iteration() {
    for f in fixtures() {
        let a = &f.analysis;
        let param_bytes = u64_of(&f.meta["param_bytes"]);
        let set_to_none = f.meta["zero_grad_set_to_none"].as_bool().unwrap();
        let mut by_iteration: BTreeMap<usize, (usize, u64)> = BTreeMap::new();
        for block in &a.blocks {
            let BlockRole::Gradient { param } = block.role else {
                continue;
            };
            assert_eq!(block.size, a.parameters[param].bytes, "{}", f.name);
            assert_eq!(block.alloc_phase, Phase::Backward, "{}", f.name);
            // Freed by the next zero_grad, or still live at the end.
            assert!(
                block.free_phase.is_none() || block.free_phase == Some(Phase::ZeroGrad),
                "{} {:?}",
                f.name,
                block.free_phase
            );
            let slot = by_iteration
                .entry(block.alloc_iteration.unwrap())
                .or_default();
            slot.0 += 1;
            slot.1 += block.size.get();
        }
        let n_params = a.parameters.len();
        let expected_iterations = if set_to_none { a.iterations.len() } else { 1 };
        assert_eq!(by_iteration.len(), expected_iterations, "{}", f.name);
        for (n, bytes) in by_iteration.values() {
            assert_eq!((*n, *bytes), (n_params, param_bytes), "{}", f.name);
        }
    }
}

#[test]
fn optimizer_state_matches_the_optimizer() {
    for f in fixtures() {
        let a = &f.analysis;
        let facts = &a.optimizer;
        let class = f.meta["optimizer_class"].as_str().unwrap();
        assert_eq!(facts.class_name.as_deref(), Some(class), "{}", f.name);
        assert_eq!(facts.n_steps, a.iterations.len());
        assert_eq!(facts.torch_optim, Some(true), "{}", f.name);
        assert_eq!(facts.uses_foreach, f.name.contains("foreach"), "{}", f.name);
        let p = a.parameter_totals.bytes.get();
        let n = a.parameter_totals.count as u64;
        let expected = match class {
            "SGD" => p,
            "Adam" | "AdamW" => 2 * p + 4 * n,
            "Adagrad" => 0,
            other => panic!("no expectation for {other}"),
        };
        assert_eq!(facts.state_bytes.get(), expected, "{}", f.name);
        let marked: u64 = a
            .blocks
            .iter()
            .filter(|b| b.role == BlockRole::OptimizerState)
            .map(|b| b.size.get())
            .sum();
        assert_eq!(marked, expected, "{}", f.name);
        assert!(a
            .blocks
            .iter()
            .filter(|b| b.role == BlockRole::OptimizerState)
            .all(|b| b.free_ts.is_none()
                && b.alloc_iteration == Some(0)
                && b.alloc_phase == Phase::OptimizerStep));
    }
}

#[test]
fn zero_grad_facts_match_the_sidecar() {
    for f in fixtures() {
        let z = &f.analysis.zero_grad;
        let expected = match f.meta["zero_grad_position"].as_str().unwrap() {
            "pos0" => ZeroGradPlacement::BeforeBackward,
            "pos1" => ZeroGradPlacement::BeforeForward,
            other => panic!("{other}"),
        };
        assert_eq!(z.placement, Some(expected), "{}", f.name);
        assert!(f
            .analysis
            .iterations
            .iter()
            .all(|it| it.zero_grad == Some(expected)));
        assert_eq!(
            z.set_to_none,
            f.meta["zero_grad_set_to_none"].as_bool(),
            "{}",
            f.name
        );
        assert_eq!(z.n_calls, 3);
    }
}

#[test]
fn batches_are_the_two_loader_tensors_per_iteration() {
    for f in fixtures() {
        let batches: Vec<_> = f
            .analysis
            .blocks
            .iter()
            .filter(|b| b.role == BlockRole::Batch)
            .collect();
        assert_eq!(batches.len(), 2 * f.analysis.iterations.len(), "{}", f.name);
        let per_iteration: u64 = batches
            .iter()
            .filter(|b| b.alloc_iteration == Some(0))
            .map(|b| b.size.get())
            .sum();
        // The input tensor plus the int64 labels.
        let numel: u64 = f.meta["input_shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(u64_of)
            .product();
        let elem = match f.meta["input_dtype"].as_str().unwrap() {
            "float32" => 4,
            "int64" => 8,
            other => panic!("{other}"),
        };
        let batch = u64_of(&f.meta["batch_size"]);
        assert!(per_iteration >= numel * elem, "{}", f.name);
        assert!(per_iteration <= numel * elem + batch * 8 * 64, "{}", f.name);
    }
}

#[test]
fn attribution_is_consistent() {
    for f in fixtures() {
        let a = &f.analysis;
        let mut with_layer = 0;
        for block in &a.blocks {
            if let Some(op) = block.alloc_op {
                let op = &a.ops[op];
                assert!(op.start <= block.alloc_ts && block.alloc_ts <= op.end);
                assert_eq!(Some(op.name), block.alloc_op_name);
            }
            if block.op_internal {
                let owner = &a.ops[block.internal_to.unwrap()];
                assert!(owner.start <= block.alloc_ts);
                assert!(block.free_ts.unwrap() <= owner.end);
            }
            assert!(!block.cpu_scratch || block.op_internal);
            if let Some(layer) = block.layer {
                with_layer += 1;
                assert!(!a.name(layer).is_empty());
            }
        }
        // Every forward block has a layer; backward blocks get theirs through
        // the forward op linked to their autograd node, except the seed
        // gradient (`aten::ones_like`) of each backward pass.
        let without_layer = |phase| {
            a.blocks
                .iter()
                .filter(|b| b.alloc_phase == phase && b.layer.is_none())
                .count()
        };
        assert_eq!(without_layer(Phase::Forward), 0, "{}", f.name);
        assert!(
            without_layer(Phase::Backward) <= 4 * a.iterations.len(),
            "{}",
            f.name
        );
        assert!(with_layer > 0, "{}", f.name);
        assert!(!a.layers_at_peak.is_empty());
        assert!(a
            .layers_at_peak
            .windows(2)
            .all(|w| w[0].bytes >= w[1].bytes));
    }
}

#[test]
fn gradient_layers_of_resnet_are_its_modules() {
    let f = fixtures()
        .iter()
        .find(|f| f.name == "resnet18_sgd_bs16_pos1.json.gz")
        .unwrap();
    let a = &f.analysis;
    let first = &a.parameters[0];
    assert_eq!(first.shape, [64, 3, 7, 7]);
    assert_eq!(first.dtype.as_deref(), Some("float"));
    assert_eq!(a.name(first.layer.unwrap()), "ResNet_0/Conv2d_0");
    let last = a.parameters.last().unwrap();
    assert_eq!(last.shape, [1000]);
    assert_eq!(a.name(last.layer.unwrap()), "ResNet_0/Linear_0");
    let _ = &f.trace;
}

#[test]
fn the_analysis_is_deterministic() {
    let f = &fixtures()[0];
    let again = analyzer::analyze(&f.trace, &AnalyzerConfig::standard()).unwrap();
    assert_eq!(again.value, f.analysis);
}

// Hand-written traces, one rule each (see tests/fixtures/*.json).

#[test]
fn tiny_step_pairs_reused_addresses_and_counts_unknown_frees() {
    let (_, a, warnings) = local("tiny_step.json");
    assert_eq!(a.blocks.len(), 9);
    assert_eq!(a.unmatched_frees.len(), 1);
    assert_eq!(a.events[a.unmatched_frees[0]].delta, -16);
    assert_eq!(
        warnings.iter().map(|w| w.code.as_str()).collect::<Vec<_>>(),
        ["free_of_unknown_block"]
    );
    // Address 100 is used twice: the batch (64 B, freed) and a later 128 B block.
    let at_100: Vec<_> = a.blocks.iter().filter(|b| b.addr == 100).collect();
    assert_eq!(at_100.len(), 2);
    assert_eq!(at_100[0].size, Bytes(64));
    assert!(at_100[0].free_ts.is_some());
    assert_eq!(at_100[1].size, Bytes(128));
    assert_eq!(at_100[1].free_ts, None);
    let persistent: Vec<u64> = a.persistent_blocks().map(|b| b.addr).collect();
    assert_eq!(persistent, [400, 500, 100]);
}

#[test]
fn tiny_step_attributes_ops_layers_and_roles() {
    let (_, a, _) = local("tiny_step.json");
    let block = |addr: u64| a.blocks.iter().find(|b| b.addr == addr).unwrap();
    let op_name = |b: &analyzer::Block| b.alloc_op_name.map(|n| a.name(n).to_owned());
    let layer = |b: &analyzer::Block| b.layer.map(|n| a.name(n).to_owned());

    // Batch: allocated under the loader's aten::cat and outliving __next__.
    assert_eq!(block(100).role, BlockRole::Batch);
    assert_eq!(op_name(block(100)).as_deref(), Some("aten::cat"));
    assert_eq!(block(100).alloc_phase, Phase::DataLoading);
    // A temporary freed inside aten::cat is operator-internal, not a batch.
    assert!(block(101).op_internal);
    assert_eq!(block(101).role, BlockRole::Other);
    // An activation outlives its op and belongs to the Linear layer.
    assert!(!block(200).op_internal);
    assert_eq!(layer(block(200)).as_deref(), Some("Net_0/Linear_0"));
    assert_eq!(block(200).free_phase, Some(Phase::Backward));
    assert_eq!(block(200).free_op, None);
    // Scratch of a oneDNN kernel.
    assert!(block(300).op_internal && block(300).cpu_scratch);
    assert_eq!(layer(block(300)).as_deref(), Some("Net_0/Conv2d_0"));
    // aten::addmm allocates and frees it itself: the CPU kernel's private
    // scratch (a CUDA addmm makes none but cuBLAS's workspace).
    assert!(block(201).op_internal && block(201).cpu_scratch);
    // A temporary the loader's aten::cat made and freed: scratch too.
    assert!(block(101).cpu_scratch);
    // The gradient: made in backward, linked to the forward layer by sequence
    // number, matched to AccumulateGrad's shape.
    assert_eq!(block(400).role, BlockRole::Gradient { param: 0 });
    assert_eq!(layer(block(400)).as_deref(), Some("Net_0/Linear_0"));
    assert_eq!(block(400).alloc_phase, Phase::Backward);
    assert_eq!(a.parameters.len(), 1);
    assert_eq!(a.parameters[0].shape, [2, 3]);
    assert_eq!(a.parameters[0].bytes, Bytes(24));
    assert_eq!(a.name(a.parameters[0].layer.unwrap()), "Net_0/Linear_0");
    // Optimizer state: first step, never freed; the step's scalar temporary is not.
    assert_eq!(block(500).role, BlockRole::OptimizerState);
    assert_eq!(block(501).role, BlockRole::Other);
    assert_eq!(block(501).alloc_op, None);
    assert_eq!(a.optimizer.state_bytes, Bytes(24));
    assert_eq!(a.optimizer.class_name.as_deref(), Some("SGD"));
    // The backward op is linked to its forward op.
    let mm = a.ops.iter().find(|o| a.name(o.name) == "aten::mm").unwrap();
    assert!(mm.backward);
    let forward = &a.ops[mm.forward_op.unwrap()];
    assert_eq!(a.name(forward.name), "aten::linear");
}

#[test]
fn tiny_step_phases_and_zero_grad() {
    let (_, a, _) = local("tiny_step.json");
    assert_eq!(a.iterations.len(), 1);
    let it = &a.iterations[0];
    assert_eq!(it.label.as_deref(), Some("ProfilerStep#0"));
    let phases: Vec<(Phase, i64, i64)> = it
        .phases
        .iter()
        .map(|p| (p.phase, p.start.get() / 1000, p.end.get() / 1000))
        .collect();
    assert_eq!(
        phases,
        [
            (Phase::DataLoading, 10, 50),
            (Phase::ZeroGrad, 60, 70),
            (Phase::Forward, 100, 300),
            (Phase::Backward, 400, 700),
            (Phase::OptimizerStep, 750, 850),
        ]
    );
    assert_eq!(it.zero_grad, Some(ZeroGradPlacement::BeforeForward));
    // Nothing to free and no aten::zero_: unknown.
    assert_eq!(a.zero_grad.set_to_none, None);
    assert_eq!(
        it.allocated_by_phase.get(&Phase::DataLoading),
        Some(&Bytes(80))
    );
    assert_eq!(it.allocated_by_phase.get(&Phase::Other), Some(&Bytes(128)));
    assert_eq!(a.origin, Nanos(0));
}

#[test]
fn iterations_without_step_markers_are_inferred() {
    let (_, a, warnings) = local("no_schedule.json");
    assert!(warnings.iter().any(|w| w.code == "iterations_inferred"));
    assert_eq!(a.iterations.len(), 2);
    assert!(a.iterations.iter().all(|it| it.label.is_none()));
    // The second iteration opens with its forward pass.
    assert_eq!(a.iterations[1].start, Nanos(1_100_000));
    assert_eq!(
        a.zero_grad.placement,
        Some(ZeroGradPlacement::BeforeBackward)
    );
    assert_eq!(a.zero_grad.set_to_none, Some(true));
    let gradients: Vec<(u64, Option<Phase>)> = a
        .blocks
        .iter()
        .filter(|b| matches!(b.role, BlockRole::Gradient { param: 0 }))
        .map(|b| (b.addr, b.free_phase))
        .collect();
    assert_eq!(gradients, [(20, Some(Phase::ZeroGrad)), (21, None)]);
    assert_eq!(a.optimizer.class_name.as_deref(), Some("Adam"));
    assert_eq!(a.optimizer.n_state_blocks, 3);
    assert_eq!(a.optimizer.state_bytes, Bytes(52));
    let temp = a.blocks.iter().find(|b| b.addr == 33).unwrap();
    assert_eq!(
        (temp.role, temp.alloc_iteration),
        (BlockRole::Other, Some(1))
    );
}

#[test]
fn cuda_traces_are_recognised_and_python_frames_can_be_optional() {
    let bytes = std::fs::read(common::local_fixture("cuda_memory.json")).unwrap();
    let t = trace::parse(&bytes).unwrap().value;
    assert_eq!(
        analyzer::analyze(&t, &AnalyzerConfig::standard()).unwrap_err(),
        AnalyzeError::GpuTraceWithoutPythonFrames
    );
    let config = AnalyzerConfig {
        require_python_frames: false,
        ..AnalyzerConfig::standard()
    };
    let a = analyzer::analyze(&t, &config).unwrap().value;
    assert!(a.devices.recorded_on_cuda);
    assert_eq!(a.devices.events_by_device.get(&Device::Cuda), Some(&3));
    assert_eq!(a.blocks.len(), 2);
    assert_eq!(a.blocks[0].device, Device::Cuda);
    assert_eq!(a.name(a.blocks[0].alloc_op_name.unwrap()), "aten::empty");
    assert_eq!(a.peak.bytes, Bytes(1024));
}

#[test]
fn no_python_frames_is_a_warning_naming_with_stack() {
    let text = r#"{"traceEvents": [{"ph": "i", "name": "[memory]", "tid": 1, "ts": 1.0,
      "args": {"Addr": 10, "Bytes": 8, "Total Allocated": 8, "Device Type": 0}}]}"#;
    let t = trace::parse(text.as_bytes()).unwrap().value;
    let warned = analyzer::analyze(&t, &AnalyzerConfig::standard()).unwrap();
    let warning = warned
        .warnings
        .iter()
        .find(|w| w.code == "no_python_frames")
        .unwrap();
    assert!(warning.message.contains("with_stack=True"));
    assert_eq!(warned.value.blocks.len(), 1);
    assert_eq!(
        analyzer::analyze(&Trace::default(), &AnalyzerConfig::standard()).unwrap_err(),
        AnalyzeError::NoMemoryEvents
    );
}

#[test]
fn iterations_are_inferred_when_step_markers_are_removed() {
    for f in fixtures()
        .iter()
        .filter(|f| f.name.starts_with("resnet18_sgd_bs16_pos1") || f.name.starts_with("mobilenet"))
    {
        let mut unmarked = f.trace.clone();
        unmarked
            .annotations
            .retain(|a| !f.trace.name(a.name).starts_with("ProfilerStep#"));
        let analyzed = analyzer::analyze(&unmarked, &AnalyzerConfig::standard()).unwrap();
        assert!(analyzed
            .warnings
            .iter()
            .any(|w| w.code == "iterations_inferred"));
        let a = analyzed.value;
        assert_eq!(
            a.iterations.len(),
            f.analysis.iterations.len(),
            "{}",
            f.name
        );
        // Every phase is the same span as with markers.
        for (inferred, marked) in a.iterations.iter().zip(&f.analysis.iterations) {
            assert_eq!(inferred.phases, marked.phases, "{}", f.name);
            assert_eq!(inferred.zero_grad, marked.zero_grad, "{}", f.name);
        }
        let roles = |a: &Analysis| a.blocks.iter().map(|b| b.role).collect::<Vec<_>>();
        assert_eq!(roles(&a), roles(&f.analysis), "{}", f.name);
        assert_eq!(a.parameter_totals, f.analysis.parameter_totals);
        assert_eq!(a.zero_grad, f.analysis.zero_grad);
    }
}

#[test]
fn an_inference_loop_is_cut_at_its_repeated_module_calls() {
    let text = r#"{"traceEvents": [
      {"ph": "X", "cat": "python_function", "name": "infer.py(1): <module>", "tid": 1, "ts": 0, "dur": 1000, "args": {"Python id": 1}},
      {"ph": "X", "cat": "python_function", "name": "nn.Module: Tokenizer_0", "tid": 1, "ts": 5, "dur": 10, "args": {"Python id": 2, "Python parent id": 1}},
      {"ph": "X", "cat": "python_function", "name": "nn.Module: Net_0", "tid": 1, "ts": 100, "dur": 100, "args": {"Python id": 3, "Python parent id": 1}},
      {"ph": "X", "cat": "python_function", "name": "nn.Module: Net_0", "tid": 1, "ts": 400, "dur": 100, "args": {"Python id": 4, "Python parent id": 1}},
      {"ph": "X", "cat": "python_function", "name": "nn.Module: Net_0", "tid": 1, "ts": 700, "dur": 100, "args": {"Python id": 5, "Python parent id": 1}},
      {"ph": "i", "name": "[memory]", "tid": 1, "ts": 150, "args": {"Addr": 1, "Bytes": 8, "Total Allocated": 8, "Device Type": 0}},
      {"ph": "i", "name": "[memory]", "tid": 1, "ts": 450, "args": {"Addr": 1, "Bytes": -8, "Total Allocated": 0, "Device Type": 0}}
    ]}"#;
    let t = trace::parse(text.as_bytes()).unwrap().value;
    let analyzed = analyzer::analyze(&t, &AnalyzerConfig::standard()).unwrap();
    assert!(analyzed
        .warnings
        .iter()
        .any(|w| w.code == "iterations_inferred"));
    let a = analyzed.value;
    let starts: Vec<i64> = a
        .iterations
        .iter()
        .map(|it| it.start.get() / 1000)
        .collect();
    assert_eq!(starts, [0, 400, 700]);
    let block = &a.blocks[0];
    assert_eq!(
        (
            block.alloc_iteration,
            block.alloc_phase,
            block.free_iteration
        ),
        (Some(0), Phase::Forward, Some(1))
    );
    assert_eq!(a.name(block.layer.unwrap()), "Net_0");
}

/// Random small traces: the analyzer never panics, every allocation becomes
/// one block, and the blocks reproduce the running total.
#[test]
fn random_traces_keep_the_invariants() {
    use proptest::prelude::*;

    const NAMES: [&str; 10] = [
        "ProfilerStep#0",
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        "Optimizer.zero_grad#SGD.zero_grad",
        "Optimizer.step#SGD.step",
        "nn.Module: Net_0",
        "torch/_tensor.py(1): backward",
        "autograd::engine::evaluate_function: MmBackward0",
        "torch::autograd::AccumulateGrad",
        "aten::mkldnn_convolution",
        "aten::zero_",
    ];
    let span = (
        0usize..4,
        0usize..NAMES.len(),
        0i64..1000,
        0i64..300,
        0i64..3,
    );
    let memory = (0i64..1300, 0u64..6, 1i64..5, any::<bool>());
    let strategy = (
        proptest::collection::vec(span, 0..40),
        proptest::collection::vec(memory, 1..60),
    );
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    runner
        .run(&strategy, |(spans, memory)| {
            let mut events = Vec::new();
            for (kind, name, ts, dur, seq) in spans {
                let cat = ["cpu_op", "python_function", "user_annotation", "cpu_op"][kind];
                events.push(serde_json::json!({
                    "ph": "X", "cat": cat, "name": NAMES[name], "tid": 1, "ts": ts, "dur": dur,
                    "args": {"Sequence number": seq, "Fwd thread id": seq % 2,
                             "Input Dims": [[seq + 1, 2]], "Input type": ["float"]}
                }));
            }
            // Allocations and frees that always pair up, with address reuse.
            let mut live: std::collections::BTreeMap<u64, i64> = Default::default();
            let mut total = 0;
            let mut memory = memory;
            memory.sort_by_key(|m| m.0);
            for (ts, addr, size, free) in memory {
                let bytes = match live.remove(&addr) {
                    Some(size) if free => -size,
                    Some(size) => {
                        live.insert(addr, size);
                        continue;
                    }
                    None => {
                        live.insert(addr, size * 8);
                        size * 8
                    }
                };
                total += bytes;
                events.push(serde_json::json!({
                    "ph": "i", "name": "[memory]", "tid": 1, "ts": ts,
                    "args": {"Addr": addr, "Bytes": bytes, "Total Allocated": total, "Device Type": 0}
                }));
            }
            let text = serde_json::json!({ "traceEvents": events }).to_string();
            let Ok(parsed) = trace::parse(text.as_bytes()) else {
                return Ok(());
            };
            let config = AnalyzerConfig {
                require_python_frames: false,
                ..AnalyzerConfig::standard()
            };
            let a = analyzer::analyze(&parsed.value, &config).unwrap().value;
            let n_allocs = a.events.iter().filter(|e| e.delta > 0).count();
            prop_assert_eq!(a.blocks.len(), n_allocs);
            prop_assert!(a.unmatched_frees.is_empty());
            let mut running = 0;
            for event in &a.events {
                running += event.delta;
                prop_assert_eq!(Some(running), event.total_allocated);
            }
            for block in &a.blocks {
                prop_assert!(!block.cpu_scratch || block.op_internal);
                if let BlockRole::Gradient { param } = block.role {
                    prop_assert!(param < a.parameters.len());
                }
            }
            prop_assert!(a.iterations.windows(2).all(|w| w[0].start <= w[1].start));
            Ok(())
        })
        .unwrap();
}
