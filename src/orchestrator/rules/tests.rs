//! The rules on a hand-built training loop.
//!
//! Long file: the rules' tests share one hand-built training loop (`Loop`),
//! so they stay together.

use std::collections::BTreeMap;

use super::captured::category_of;
use super::lifetimes::{rule_batch_handover, rule_gradients, Handover};
use super::order::Key;
use super::setup::module_class;
use super::*;
use crate::analyzer::{self, Block, BlockRole};
use crate::analyzer::{
    DeviceSummary, Iteration, OptimizerFacts, Parameter, PhaseSpan, ZeroGradFacts,
};
use crate::orchestrator::{orchestrate, OptimizerPath};
use crate::trace::{Device, NameId};
use analyzer::Phase as P;

/// A hand-built analysis of a tiny training loop: two parameters (a
/// Linear weight of 4,000 bytes and a BatchNorm weight and bias of 40
/// bytes each), three iterations of 1,000 ns:
/// data loading [0,100) → zero_grad [100,150) → forward [150,400) →
/// backward [400,700) → optimizer step [700,900).
struct Loop {
    analysis: Analysis,
    next_event: usize,
}

const PERIOD: i64 = 1_000;

impl Loop {
    /// The loop's analysis without blocks: names, three iterations with
    /// their phases, the parameters and the optimizer facts.
    fn new(optimizer: &str) -> Loop {
        let names = vec![
            "M_0/Linear_0".to_owned(),
            "M_0/BatchNorm2d_0".to_owned(),
            "aten::mkldnn_convolution".to_owned(),
            "aten::mul".to_owned(),
        ];
        let parameter = |index: usize, bytes: u64, layer: u32| Parameter {
            index,
            shape: vec![(bytes / 4) as i64],
            numel: bytes / 4,
            dtype: Some("float".to_owned()),
            bytes: Bytes(bytes),
            layer: Some(NameId(layer)),
            sized_by_gradient: false,
        };
        let iterations = (0..3)
            .map(|i| {
                let base = i * PERIOD;
                let span = |phase, start: i64, end: i64| PhaseSpan {
                    phase,
                    start: Nanos(base + start),
                    end: Nanos(base + end),
                };
                Iteration {
                    index: i as usize,
                    label: Some(format!("ProfilerStep#{i}")),
                    start: Nanos(base),
                    end: Nanos(base + 999),
                    phases: vec![
                        span(P::DataLoading, 0, 100),
                        span(P::ZeroGrad, 100, 150),
                        span(P::Forward, 150, 400),
                        span(P::Backward, 400, 700),
                        span(P::OptimizerStep, 700, 900),
                    ],
                    micro_batches: 1,
                    zero_grad: None,
                    allocated_by_phase: BTreeMap::new(),
                    n_allocs: 0,
                    n_frees: 0,
                    peak: Bytes::ZERO,
                }
            })
            .collect();
        Loop {
            analysis: Analysis {
                origin: Nanos::ZERO,
                names,
                events: Vec::new(),
                blocks: Vec::new(),
                unmatched_frees: Vec::new(),
                ops: Vec::new(),
                iterations,
                parameters: vec![
                    parameter(0, 4_000, 0),
                    parameter(1, 40, 1),
                    parameter(2, 40, 1),
                ],
                parameter_totals: Default::default(),
                zero_grad: ZeroGradFacts {
                    n_calls: 3,
                    placement: None,
                    set_to_none: Some(true),
                },
                optimizer: OptimizerFacts {
                    class_name: Some(optimizer.to_owned()),
                    n_steps: 3,
                    uses_foreach: false,
                    torch_optim: Some(true),
                    n_state_blocks: 0,
                    state_bytes: Bytes::ZERO,
                },
                devices: DeviceSummary::default(),
                peak: Default::default(),
                layers_at_peak: Vec::new(),
                batch_size: None,
                recipe: analyzer::RunRecipe::default(),
                autocast: Vec::new(),
                inference_mode: Vec::new(),
                op_inputs: Vec::new(),
                state: crate::analyzer::resident::ModelState {
                    has_shapes: true,
                    ..Default::default()
                },
                generation: None,
                quant_kernels: Vec::new(),
                kernel_calls: Default::default(),
                moe: None,
            },
            next_event: 0,
        }
    }

    /// Adds a block allocated at `iteration`'s `alloc` offset and freed at
    /// the absolute time `free`.
    fn block(
        &mut self,
        iteration: usize,
        alloc: i64,
        free: Option<i64>,
        size: u64,
        phase: P,
        role: BlockRole,
    ) -> usize {
        let id = self.analysis.blocks.len();
        let alloc_ts = Nanos(iteration as i64 * PERIOD + alloc);
        let alloc_event = self.next_event;
        self.next_event += 2;
        let free_phase = free.map(|t| {
            let offset = t.rem_euclid(PERIOD);
            match offset {
                0..100 => P::DataLoading,
                100..150 => P::ZeroGrad,
                150..400 => P::Forward,
                400..700 => P::Backward,
                700..900 => P::OptimizerStep,
                _ => P::Other,
            }
        });
        self.analysis.blocks.push(Block {
            id,
            addr: 4096 * id as u64,
            size: Bytes(size),
            device: Device::Cpu,
            alloc_ts,
            free_ts: free.map(Nanos),
            alloc_event,
            free_event: free.map(|_| alloc_event + 1),
            alloc_op: None,
            alloc_op_name: Some(NameId(3)),
            free_op: None,
            free_op_name: None,
            layer: Some(NameId(0)),
            alloc_iteration: Some(iteration),
            alloc_phase: phase,
            free_iteration: free.map(|t| (t / PERIOD) as usize),
            free_phase,
            op_internal: false,
            internal_to: None,
            cpu_scratch: false,
            role,
        });
        id
    }

    /// A steady loop: per iteration a batch (freed after the next
    /// load), an activation, a CPU scratch block, a gradient per
    /// parameter (freed in the next zero_grad) and one step temporary
    /// per parameter; the optimizer state (one block per parameter plus
    /// a 4-byte step counter) in the first step.
    fn training(optimizer: &str) -> Loop {
        let mut lp = Loop::new(optimizer);
        for i in 0..3usize {
            let next = |offset: i64| (i < 2).then_some((i as i64 + 1) * PERIOD + offset);
            lp.block(i, 50, next(60), 64, P::DataLoading, BlockRole::Batch);
            lp.block(
                i,
                60,
                Some(i as i64 * PERIOD + 70),
                32,
                P::DataLoading,
                BlockRole::Other,
            );
            lp.block(
                i,
                200,
                Some(i as i64 * PERIOD + 600),
                10_000,
                P::Forward,
                BlockRole::Other,
            );
            let scratch = lp.block(
                i,
                210,
                Some(i as i64 * PERIOD + 220),
                777,
                P::Forward,
                BlockRole::Other,
            );
            lp.analysis.blocks[scratch].cpu_scratch = true;
            lp.analysis.blocks[scratch].op_internal = true;
            for (param, size) in [(0usize, 4_000u64), (1, 40), (2, 40)] {
                lp.block(
                    i,
                    500 + param as i64,
                    next(120),
                    size,
                    P::Backward,
                    BlockRole::Gradient { param },
                );
            }
            if i == 0 {
                for size in [4_000u64, 40, 40] {
                    lp.block(
                        0,
                        710,
                        None,
                        size,
                        P::OptimizerStep,
                        BlockRole::OptimizerState,
                    );
                    lp.block(0, 711, None, 4, P::OptimizerStep, BlockRole::OptimizerState);
                }
                lp.analysis.optimizer.n_state_blocks = 6;
            }
            // Per-tensor step: one parameter's temporary at a time.
            for (j, size) in [4_000u64, 40, 40].into_iter().enumerate() {
                let at = 800 + 2 * j as i64;
                let free = Some(i as i64 * PERIOD + at + 1);
                lp.block(i, at, free, size, P::OptimizerStep, BlockRole::Other);
            }
        }
        lp
    }
}

fn run(analysis: &Analysis, iterations: u32, path: OptimizerPath) -> (Schedule, Vec<Warning>) {
    let config = OrchestratorConfig {
        iterations,
        optimizer_path: path,
        autocast: Default::default(),
        parameters: Default::default(),
        remodel_foreach: false,
    };
    let out = orchestrate(analysis, &config).unwrap();
    out.value.schedule.check().unwrap();
    (out.value.schedule, out.warnings)
}

fn blocks_of(schedule: &Schedule, category: Category) -> Vec<(usize, &ScheduledBlock)> {
    schedule
        .blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.category == category)
        .collect()
}

fn free_time(schedule: &Schedule, block: usize) -> Option<Nanos> {
    schedule
        .events
        .iter()
        .find(|e| e.kind == EventKind::Free && e.block.index() == block)
        .map(|e| e.time)
}

fn live_bytes_at(schedule: &Schedule, time: i64, category: Category) -> u64 {
    let mut live = BTreeMap::new();
    for event in schedule.events.iter().take_while(|e| e.time.get() <= time) {
        match event.kind {
            EventKind::Alloc => {
                live.insert(event.block, ());
            }
            EventKind::Free => {
                live.remove(&event.block);
            }
        }
    }
    live.keys()
        .filter_map(|id| schedule.block(*id))
        .filter(|b| b.category == category)
        .map(|b| b.size.get())
        .sum()
}

#[test]
fn parameters_come_first_in_module_order_and_stay() {
    let lp = Loop::training("SGD");
    let (schedule, warnings) = run(&lp.analysis, 3, OptimizerPath::Captured);
    let first: Vec<(Category, u64)> = schedule
        .events
        .iter()
        .take(6)
        .filter_map(|e| schedule.block(e.block))
        .map(|b| (b.category, b.size.get()))
        .collect();
    assert_eq!(
        first,
        vec![
            (Category::Parameter, 4_000),
            (Category::Parameter, 40),
            (Category::Parameter, 40),
            (Category::Buffer, 40),
            (Category::Buffer, 40),
            (Category::Buffer, 8),
        ]
    );
    for (id, _) in blocks_of(&schedule, Category::Parameter) {
        assert_eq!(free_time(&schedule, id), None);
    }
    assert!(!warnings.iter().any(|w| w.code == "no_parameters"));
}

#[test]
fn module_class_strips_the_instance_counter() {
    assert_eq!(module_class("A_0/Seq_1/BatchNorm2d_13"), "BatchNorm2d");
    assert_eq!(module_class("BatchNorm1d"), "BatchNorm1d");
    assert_eq!(module_class("A_0/my_layer"), "my_layer");
    assert_eq!(module_class("A_0/layer_"), "layer_");
}

/// A resident tensor made before the trace, read last at `last_read`.
fn state_item(
    kind: crate::analyzer::resident::StateKind,
    bytes: u64,
    last_read: Option<i64>,
) -> crate::analyzer::resident::StateItem {
    crate::analyzer::resident::StateItem {
        kind,
        trainable: false,
        bytes: Bytes(bytes),
        shape: Vec::new(),
        dtype: None,
        layer: None,
        source: crate::analyzer::resident::StateSource::OptimizerClass,
        first_read: None,
        last_read: last_read.map(Nanos),
        block: None,
    }
}

/// A frozen parameter of `elements` the forward reads as `aten::linear`'s
/// weight.
fn linear_weight(bytes: u64, elements: i64) -> crate::analyzer::resident::StateItem {
    crate::analyzer::resident::StateItem {
        shape: vec![elements],
        source: crate::analyzer::resident::StateSource::OpArgument {
            op: "aten::linear".to_owned(),
            argument: 1,
            known_op: true,
        },
        ..state_item(crate::analyzer::resident::StateKind::Parameter, bytes, None)
    }
}

#[test]
fn state_made_before_the_trace_is_allocated_at_setup() {
    use crate::analyzer::resident::StateKind;
    let item = state_item;
    let mut lp = Loop::training("Adagrad");
    lp.analysis.state.items = vec![
        item(StateKind::Parameter, 1_000, None),
        item(StateKind::Buffer, 16, None),
        item(StateKind::OptimizerState, 4_000, None),
        item(StateKind::OptimizerState, 40, None),
        item(StateKind::Activation, 64, Some(300)),
        item(StateKind::Bucket, 4_080, Some(1_200)),
    ];
    let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
    let setup: Vec<(Category, u64, bool)> = schedule
        .blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.phase == Phase::Setup)
        .map(|(i, b)| (b.category, b.size.get(), free_time(&schedule, i).is_some()))
        .collect();
    // the trainable parameters (BatchNorm's with its buffers), then the
    // frozen one, the other buffer, the optimizer state, the activation
    // (freed after its last read) and the buckets (freed when rebuilt)
    assert_eq!(
        setup,
        vec![
            (Category::Parameter, 4_000, false),
            (Category::Parameter, 40, false),
            (Category::Parameter, 40, false),
            (Category::Buffer, 40, false),
            (Category::Buffer, 40, false),
            (Category::Buffer, 8, false),
            (Category::Parameter, 1_000, false),
            (Category::Buffer, 16, false),
            (Category::OptimizerState, 4_000, false),
            (Category::OptimizerState, 40, false),
            (Category::Activation, 64, true),
            (Category::Bucket, 4_080, true),
        ]
    );
}

#[test]
fn lazily_made_optimizer_state_is_made_at_the_first_step() {
    let state = |bytes| {
        state_item(
            crate::analyzer::resident::StateKind::OptimizerState,
            bytes,
            None,
        )
    };
    // AdamW builds its state in its first step(), not in its constructor.
    let mut lp = Loop::training("AdamW");
    lp.analysis.state.items = vec![state(4_000), state(40)];
    let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
    let first_step = schedule
        .phases
        .iter()
        .filter(|w| w.phase == Phase::OptimizerStep)
        .min_by_key(|w| w.start)
        .unwrap();
    let made: Vec<(u64, Option<u32>, Option<Nanos>, bool)> = schedule
        .blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.op.as_deref() == Some("AdamW state made before the trace"))
        .map(|(i, b)| {
            let at = schedule
                .events
                .iter()
                .find(|e| e.block.0 as usize == i)
                .map(|e| e.time);
            (
                b.size.get(),
                b.iteration,
                at,
                free_time(&schedule, i).is_some(),
            )
        })
        .collect();
    let at = Some(first_step.start);
    assert_eq!(
        made,
        vec![
            (4_000, Some(first_step.iteration), at, false),
            (40, Some(first_step.iteration), at, false)
        ]
    );
    assert!(schedule
        .blocks
        .iter()
        .all(|b| b.phase != Phase::Setup || b.category != Category::OptimizerState));
}

#[test]
fn the_parameter_bytes_given_replace_the_frozen_part() {
    use crate::orchestrator::ParameterOverride;
    let mut lp = Loop::training("Adam");
    lp.analysis.state.has_shapes = true;
    lp.analysis.state.items = vec![linear_weight(1_000, 250)];
    let parameters = |total: Option<u64>, frozen: Option<u64>| {
        let config = OrchestratorConfig {
            iterations: 3,
            optimizer_path: OptimizerPath::Captured,
            parameters: ParameterOverride {
                total: total.map(Bytes),
                frozen: frozen.map(Bytes),
            },
            autocast: Default::default(),
            remodel_foreach: false,
        };
        orchestrate(&lp.analysis, &config).map(|o| {
            let s = o.value.schedule;
            (
                s.blocks
                    .iter()
                    .filter(|b| b.category == Category::Parameter)
                    .map(|b| b.size.get())
                    .sum::<u64>(),
                o.warnings.iter().any(|w| w.code == "parameters_from_user"),
            )
        })
    };
    // trainable 4,080 from the trace, frozen 1,000 found
    assert_eq!(parameters(None, None).unwrap(), (5_080, false));
    assert_eq!(parameters(Some(10_080), None).unwrap(), (10_080, true));
    assert_eq!(parameters(None, Some(3_000)).unwrap(), (7_080, true));
    assert_eq!(parameters(Some(9_000), Some(3_000)).unwrap(), (7_080, true));
    assert!(matches!(
        parameters(Some(1_000), Some(3_000)),
        Err(crate::orchestrator::OrchestrateError::ParameterOverrideInconsistent { .. })
    ));
}

/// A model built inside the profiled region: a trainable parameter whose
/// block the trace allocated is that block, not a second setup block.
#[test]
fn a_parameter_built_in_the_trace_is_not_added_again() {
    use crate::analyzer::resident::StateItem;
    let mut lp = Loop::training("Adam");
    lp.analysis.state.has_shapes = true;
    let setup_parameters = |lp: &Loop| {
        let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
        schedule
            .blocks
            .iter()
            .filter(|b| b.category == Category::Parameter && b.phase == Phase::Setup)
            .map(|b| b.size.get())
            .sum::<u64>()
    };
    assert_eq!(setup_parameters(&lp), 4_080);
    lp.analysis.state.items = vec![StateItem {
        trainable: true,
        block: Some(0),
        ..linear_weight(4_000, 1_000)
    }];
    assert_eq!(setup_parameters(&lp), 80);
}

#[test]
fn host_and_cpu_only_blocks_are_dropped() {
    let lp = Loop::training("Adam");
    let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
    let sizes: Vec<u64> = schedule.blocks.iter().map(|b| b.size.get()).collect();
    assert!(!sizes.contains(&777), "cpu scratch kept");
    assert!(!sizes.contains(&32), "data loader work kept");
    assert!(!sizes.contains(&4), "host step counters kept");
    // A custom optimizer keeps its small state.
    let mut custom = Loop::training("MyOptimizer");
    custom.analysis.optimizer.torch_optim = Some(false);
    let (schedule, _) = run(&custom.analysis, 3, OptimizerPath::Captured);
    assert_eq!(
        schedule
            .blocks
            .iter()
            .filter(|b| b.size == Bytes(4))
            .count(),
        3
    );
}

#[test]
fn a_cuda_trace_keeps_only_its_cuda_blocks() {
    let mut lp = Loop::training("SGD");
    lp.analysis.devices.recorded_on_cuda = true;
    for block in lp
        .analysis
        .blocks
        .iter_mut()
        .filter(|b| b.size == Bytes(10_000))
    {
        block.device = Device::Cuda;
    }
    let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
    assert_eq!(blocks_of(&schedule, Category::Activation).len(), 3);
    assert!(blocks_of(&schedule, Category::Gradient).is_empty());
}

#[test]
fn a_rocm_trace_keeps_its_hip_blocks() {
    let mut lp = Loop::training("SGD");
    lp.analysis.devices.recorded_on_cuda = true;
    for block in &mut lp.analysis.blocks {
        block.device = Device::Hip;
    }
    let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
    assert_eq!(blocks_of(&schedule, Category::Activation).len(), 3);
    assert_eq!(blocks_of(&schedule, Category::Gradient).len(), 9);
}

#[test]
fn categories_follow_roles_and_lifetimes() {
    let lp = Loop::training("SGD");
    let b = &lp.analysis.blocks;
    assert_eq!(category_of(&b[0]), Category::Batch);
    assert_eq!(category_of(&b[2]), Category::Activation);
    assert_eq!(category_of(&b[3]), Category::Temporary);
    assert_eq!(category_of(&b[4]), Category::Gradient);
    let step_temporary = b
        .iter()
        .find(|x| x.alloc_phase == P::OptimizerStep && x.free_ts.is_some())
        .unwrap();
    assert_eq!(category_of(step_temporary), Category::Temporary);
    let state = b
        .iter()
        .find(|x| x.role == BlockRole::OptimizerState)
        .unwrap();
    assert_eq!(category_of(state), Category::OptimizerState);
}

#[test]
fn gradients_live_until_the_next_zero_grad() {
    let key = |time| Key::captured(Nanos(time), 0, 0);
    let gradient = |free: Option<i64>| Item {
        size: Bytes(8),
        category: Category::Gradient,
        iteration: Some(0),
        phase: Phase::Backward,
        op: None,
        layer: None,
        alloc: key(500),
        free: free.map(key),
        source: Some(0),
        rule: None,
        on: crate::kernels::ArchSet::ALL,
        per_gpu: None,
    };
    let zero_grad = |iteration, start, end| PhaseWindow {
        iteration,
        phase: Phase::ZeroGrad,
        start: Nanos(start),
        end: Nanos(end),
    };
    let zero_grads = [zero_grad(0, 100, 150), zero_grad(1, 1_100, 1_150)];
    // Freed inside zero_grad: kept. Freed early (a CPU-only release): moved
    // to the next zero_grad. Never freed: stays.
    let mut items = vec![gradient(Some(1_120)), gradient(Some(600)), gradient(None)];
    assert_eq!(rule_gradients(&mut items, &zero_grads), 1);
    assert_eq!(items[0].free.map(|k| k.time), Some(Nanos(1_120)));
    assert_eq!(items[1].free.map(|k| k.time), Some(Nanos(1_100)));
    assert_eq!(items[2].free, None);
    // No later zero_grad: the gradient is never freed.
    let mut late = vec![gradient(Some(600))];
    rule_gradients(&mut late, &zero_grads[..1]);
    assert_eq!(late[0].free, None);
}

#[test]
fn set_to_none_false_keeps_gradients_across_iterations() {
    let mut lp = Loop::training("SGD");
    lp.analysis.zero_grad.set_to_none = Some(false);
    // The gradients of the first iteration are never freed, later
    // iterations add into them through temporaries.
    let gradient_blocks: Vec<usize> = lp
        .analysis
        .blocks
        .iter()
        .filter(|b| matches!(b.role, BlockRole::Gradient { .. }))
        .map(|b| b.id)
        .collect();
    for (n, id) in gradient_blocks.into_iter().enumerate() {
        let block = &mut lp.analysis.blocks[id];
        if n < 3 {
            block.free_ts = None;
            block.free_event = None;
        } else {
            block.role = BlockRole::Other;
            block.op_internal = true;
            block.free_ts = Some(block.alloc_ts.saturating_add(Nanos(5)));
            block.free_event = Some(block.alloc_event + 1);
        }
    }
    let (schedule, warnings) = run(&lp.analysis, 3, OptimizerPath::Captured);
    assert!(warnings.iter().any(|w| w.code == "gradients_kept"));
    for iteration in 1..3 {
        // During the forward of iterations 1 and 2 all gradients are live.
        let time = iteration * PERIOD + 300;
        assert_eq!(live_bytes_at(&schedule, time, Category::Gradient), 4_080);
    }
    let set_to_none = Loop::training("SGD");
    let (schedule, _) = run(&set_to_none.analysis, 3, OptimizerPath::Captured);
    // With set_to_none, iteration 1's forward runs without gradients.
    assert_eq!(
        live_bytes_at(&schedule, PERIOD + 300, Category::Gradient),
        0
    );
    assert_eq!(
        live_bytes_at(&schedule, PERIOD + 650, Category::Gradient),
        4_080
    );
}

#[test]
fn a_batch_is_freed_after_the_next_load_at_the_latest() {
    let item = |free: Option<i64>| Item {
        size: Bytes(64),
        category: Category::Batch,
        iteration: Some(0),
        phase: Phase::DataLoading,
        op: None,
        layer: None,
        alloc: Key::captured(Nanos(50), 0, 0),
        free: free.map(|t| Key::captured(Nanos(t), 0, 1)),
        source: Some(0),
        rule: None,
        on: crate::kernels::ArchSet::ALL,
        per_gpu: None,
    };
    let loads = [
        Handover {
            iteration: 0,
            deadline: Nanos(100),
        },
        Handover {
            iteration: 1,
            deadline: Nanos(1_100),
        },
    ];
    let mut items = vec![item(Some(1_101)), item(None), item(Some(1_050))];
    assert_eq!(rule_batch_handover(&mut items, &loads), 2);
    assert_eq!(items[0].free.map(|k| k.time), Some(Nanos(1_100)));
    assert_eq!(items[1].free.map(|k| k.time), Some(Nanos(1_100)));
    assert_eq!(items[2].free.map(|k| k.time), Some(Nanos(1_050)));
    // Both batches are alive at the hand-over in the orchestrated loop.
    let lp = Loop::training("SGD");
    let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
    assert_eq!(live_bytes_at(&schedule, PERIOD + 55, Category::Batch), 128);
    assert_eq!(live_bytes_at(&schedule, PERIOD + 65, Category::Batch), 64);
}

#[test]
fn foreach_replaces_per_tensor_step_temporaries_with_lists() {
    let lp = Loop::training("Adam");
    let (captured, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
    let (foreach, warnings) = run(&lp.analysis, 3, OptimizerPath::CudaDefault);
    assert!(warnings
        .iter()
        .any(|w| w.code == "optimizer_foreach_modelled"));
    let step = |schedule: &Schedule| -> Vec<(Option<u32>, u64, Option<String>)> {
        blocks_of(schedule, Category::Temporary)
            .into_iter()
            .filter(|(_, b)| b.phase == Phase::OptimizerStep)
            .map(|(_, b)| (b.iteration, b.size.get(), b.op.clone()))
            .collect()
    };
    assert_eq!(step(&captured).len(), 9);
    let lists = step(&foreach);
    assert_eq!(lists.len(), 9);
    assert!(lists
        .iter()
        .all(|(_, _, op)| op.as_deref() == Some("aten::_foreach_sqrt")));
    // The whole list is live at once: all parameters' worth, after the
    // first step has built its state.
    assert_eq!(live_bytes_at(&foreach, 712, Category::Temporary), 4_080);
    assert_eq!(live_bytes_at(&captured, 805, Category::Temporary), 0);
    assert_eq!(live_bytes_at(&foreach, 899, Category::Temporary), 4_080);
    assert_eq!(live_bytes_at(&foreach, 901, Category::Temporary), 0);
    // Adagrad holds two lists.
    assert_eq!(foreach_temporary_lists("Adagrad").map(<[_]>::len), Some(2));
    assert_eq!(foreach_temporary_lists("SGD").map(<[_]>::len), Some(0));
    assert_eq!(foreach_temporary_lists("Lion"), None);
}

#[test]
fn a_step_that_runs_a_closure_updates_after_it() {
    // Lightning's automatic optimization: `optimizer.step(closure)` runs
    // forward, zero_grad and backward inside the step; the foreach lists
    // come after the closure, not during its forward.
    let mut lp = Loop::training("Adam");
    for it in &mut lp.analysis.iterations {
        let base = it.start.get();
        for span in &mut it.phases {
            if span.phase == P::OptimizerStep {
                span.start = Nanos(base + 90);
            }
        }
    }
    let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::CudaDefault);
    assert_eq!(live_bytes_at(&schedule, 300, Category::Temporary), 0);
    assert_eq!(
        live_bytes_at(&schedule, PERIOD + 300, Category::Temporary),
        0
    );
    assert_eq!(
        live_bytes_at(&schedule, PERIOD + 712, Category::Temporary),
        4_080
    );
}

#[test]
fn foreach_is_not_modelled_for_custom_or_foreach_captured_optimizers() {
    let mut custom = Loop::training("Adam");
    custom.analysis.optimizer.torch_optim = Some(false);
    let (_, warnings) = run(&custom.analysis, 3, OptimizerPath::CudaDefault);
    assert!(warnings.iter().any(|w| w.code == "optimizer_custom"));
    let mut captured = Loop::training("Adam");
    captured.analysis.optimizer.uses_foreach = true;
    let (schedule, warnings) = run(&captured.analysis, 3, OptimizerPath::CudaDefault);
    assert!(warnings
        .iter()
        .any(|w| w.code == "optimizer_foreach_captured"));
    assert!(!schedule
        .blocks
        .iter()
        .any(|b| b.op.as_deref() == Some("aten::_foreach_sqrt")));
    let unknown = Loop::training("Lion");
    let (_, warnings) = run(&unknown.analysis, 3, OptimizerPath::CudaDefault);
    assert!(warnings
        .iter()
        .any(|w| w.code == "optimizer_foreach_unknown"));
}

#[test]
fn more_iterations_repeat_the_last_one_and_chain_its_frees() {
    let lp = Loop::training("SGD");
    let (three, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
    let (five, warnings) = run(&lp.analysis, 5, OptimizerPath::Captured);
    assert!(warnings.iter().any(|w| w.code == "iterations_repeated"));
    assert_eq!(five.iterations.len(), 5);
    assert_eq!(five.iterations[4].source, 2);
    assert_eq!(five.iterations[4].start, Nanos(4 * PERIOD));
    let gradients = blocks_of(&five, Category::Gradient);
    assert_eq!(gradients.len(), 15);
    // Every iteration's gradients are freed in the next zero_grad; the
    // last ones stay.
    let freed = gradients
        .iter()
        .filter(|(id, _)| free_time(&five, *id).is_some())
        .count();
    assert_eq!(freed, 12);
    for iteration in 1..5 {
        assert_eq!(
            live_bytes_at(&five, iteration * PERIOD + 300, Category::Gradient),
            0
        );
        assert_eq!(
            live_bytes_at(&five, iteration * PERIOD + 650, Category::Gradient),
            4_080
        );
        assert_eq!(
            live_bytes_at(&five, iteration * PERIOD + 55, Category::Batch),
            128
        );
    }
    // The first three iterations are the same as with three.
    let cut = |s: &Schedule| -> Vec<(Nanos, EventKind, u64)> {
        s.events
            .iter()
            .filter(|e| e.time < Nanos(3 * PERIOD - 1))
            .filter_map(|e| Some((e.time, e.kind, s.block(e.block)?.size.get())))
            .collect()
    };
    assert_eq!(cut(&three), cut(&five));
}

#[test]
fn repeated_iterations_never_overlap_a_long_last_iteration() {
    // Captured step times vary: the last iteration here lasts 1,600 ns
    // although iterations start 1,000 ns apart.
    let mut lp = Loop::training("SGD");
    lp.analysis.iterations[2].end = Nanos(2 * PERIOD + 1_600);
    let (five, _) = run(&lp.analysis, 5, OptimizerPath::Captured);
    let spans = &five.iterations;
    for pair in spans.windows(2) {
        assert!(pair[1].start > pair[0].end, "{pair:?}");
    }
    assert_eq!(spans[3].start, Nanos(2 * PERIOD + 1_600 + 1));
    for event in &five.events {
        let block = five.block(event.block).unwrap();
        if event.kind == EventKind::Alloc {
            if let Some(iteration) = block.iteration {
                let span = spans[iteration as usize];
                assert!(
                    span.start <= event.time && event.time <= span.end,
                    "{block:?} at {:?} outside {span:?}",
                    event.time
                );
            }
        }
    }
    // Steady state: iterations 1 to 4 hold the same gradients mid-backward.
    for span in &spans[1..] {
        let mid_backward = span.start.get() + 650;
        assert_eq!(
            live_bytes_at(&five, mid_backward, Category::Gradient),
            4_080
        );
    }
}

#[test]
fn fewer_iterations_cut_the_trace() {
    let lp = Loop::training("SGD");
    let (one, _) = run(&lp.analysis, 1, OptimizerPath::Captured);
    assert_eq!(one.iterations.len(), 1);
    assert!(one.events.iter().all(|e| e.time < Nanos(PERIOD)));
    // The first iteration's gradients are freed by the second, not simulated.
    assert_eq!(live_bytes_at(&one, PERIOD, Category::Gradient), 4_080);
}

#[test]
fn iterations_are_not_repeated_without_two_matching_ones() {
    let mut lp = Loop::training("SGD");
    // Make iteration 2 allocate something iteration 1 does not.
    lp.block(
        2,
        300,
        Some(2 * PERIOD + 310),
        5,
        P::Forward,
        BlockRole::Other,
    );
    let (schedule, warnings) = run(&lp.analysis, 5, OptimizerPath::Captured);
    assert!(warnings.iter().any(|w| w.code == "iterations_not_repeated"));
    assert_eq!(schedule.iterations.len(), 3);
}

#[test]
fn workspaces_go_to_the_first_forward_and_backward() {
    let lp = Loop::training("SGD");
    let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
    let workspaces: Vec<(Nanos, Phase)> = schedule
        .events
        .iter()
        .filter_map(|e| {
            let b = schedule.block(e.block)?;
            (b.category == Category::Workspace).then_some((e.time, b.phase))
        })
        .collect();
    assert_eq!(
        workspaces,
        vec![(Nanos(150), Phase::Forward), (Nanos(400), Phase::Backward)]
    );
}

#[test]
fn workspaces_follow_the_first_matrix_product_of_each_pass() {
    let mut lp = Loop::training("SGD");
    lp.analysis.names[3] = "aten::addmm".to_owned();
    let (schedule, _) = run(&lp.analysis, 3, OptimizerPath::Captured);
    let mut previous: Option<&ScheduledBlock> = None;
    let mut found = Vec::new();
    for event in &schedule.events {
        let block = schedule.block(event.block).unwrap();
        if block.category == Category::Workspace {
            // Right after the output of the product that needs it.
            let before = previous.unwrap();
            assert_eq!(before.op.as_deref(), Some("aten::addmm"));
            found.push((event.time, block.phase));
        }
        previous = Some(block);
    }
    assert_eq!(
        found,
        vec![(Nanos(200), Phase::Forward), (Nanos(500), Phase::Backward)]
    );
}

/// The first product's output is allocated before the kernel asks cuBLAS
/// for its workspace, also where a rule re-made that output (an autocast
/// type change: a new item at the same moment, after the traced one): the
/// workspace follows every block the op makes at that moment, as an H200
/// recorded it (distilgpt2_adamw_bf16_bs8_seq512.cuda.json.gz).
#[test]
fn the_workspace_follows_an_output_a_rule_made_again() {
    let item = |rank: usize, source: Option<usize>, size: u64| Item {
        size: Bytes(size),
        category: Category::Activation,
        iteration: Some(0),
        phase: Phase::Forward,
        op: Some("aten::addmm".to_owned()),
        layer: None,
        alloc: Key::captured(Nanos(200), 0, rank),
        free: None,
        source,
        rule: source.is_none().then_some(RuleId::AutocastLowerOps),
        on: crate::kernels::ArchSet::ALL,
        per_gpu: None,
    };
    let traced = item(5, Some(0), 0);
    let made_again = item(9, None, 18 << 20);
    let items = [traced.clone(), made_again.clone()];
    let workspaces = super::workspaces::rule_cublas_workspaces(&items, &[], Some(Nanos(100)));
    let forward = workspaces
        .iter()
        .find(|w| w.phase == Phase::Forward)
        .unwrap();
    assert_eq!(forward.alloc, made_again.alloc);
    // Without the rule's item, the traced output's moment as before.
    let workspaces =
        super::workspaces::rule_cublas_workspaces(std::slice::from_ref(&traced), &[], None);
    assert_eq!(workspaces[0].alloc, traced.alloc);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]
    /// Any mix of blocks, roles and lifetimes gives a consistent schedule
    /// (every block allocated once, freed at most once, never before its
    /// allocation, events in time order), for any iteration count.
    #[test]
    fn any_analysis_gives_a_consistent_schedule(
        blocks in proptest::collection::vec(
            (0usize..3, 0i64..999, proptest::option::of(0i64..3_000), 1u64..100_000, 0usize..6, 0usize..4),
            1..60,
        ),
        iterations in 1u32..7,
        foreach in proptest::bool::ANY,
    ) {
        let phases = [P::DataLoading, P::ZeroGrad, P::Forward, P::Backward, P::OptimizerStep, P::Other];
        let mut lp = Loop::new("Adam");
        for (iteration, alloc, free, size, phase, role) in blocks {
            let start = iteration as i64 * PERIOD + alloc;
            let free = free.map(|f| start + f).filter(|&f| f < 3 * PERIOD);
            let role = match role {
                0 => BlockRole::Gradient { param: 0 },
                1 => BlockRole::OptimizerState,
                2 => BlockRole::Batch,
                _ => BlockRole::Other,
            };
            lp.block(iteration, alloc, free, size, phases[phase], role);
        }
        let config = OrchestratorConfig {
            iterations,
            optimizer_path: if foreach { OptimizerPath::CudaDefault } else { OptimizerPath::Captured },
            autocast: Default::default(),
            parameters: Default::default(),
        remodel_foreach: false,
        };
        let first = orchestrate(&lp.analysis, &config).unwrap();
        proptest::prop_assert_eq!(first.value.schedule.check(), Ok(()));
        let again = orchestrate(&lp.analysis, &config).unwrap();
        proptest::prop_assert_eq!(first, again);
    }
}

#[test]
fn orchestration_is_deterministic_and_rejects_bad_input() {
    let lp = Loop::training("Adam");
    let a = run(&lp.analysis, 4, OptimizerPath::CudaDefault);
    let b = run(&lp.analysis, 4, OptimizerPath::CudaDefault);
    assert_eq!(a, b);
    let config = OrchestratorConfig {
        iterations: 0,
        optimizer_path: OptimizerPath::CudaDefault,
        autocast: Default::default(),
        parameters: Default::default(),
        remodel_foreach: false,
    };
    assert!(matches!(
        orchestrate(&lp.analysis, &config),
        Err(super::super::OrchestrateError::NoIterations(0))
    ));
    let config = OrchestratorConfig {
        iterations: u32::MAX,
        optimizer_path: OptimizerPath::CudaDefault,
        autocast: Default::default(),
        parameters: Default::default(),
        remodel_foreach: false,
    };
    assert!(matches!(
        orchestrate(&lp.analysis, &config),
        Err(super::super::OrchestrateError::TooManyIterations(u32::MAX))
    ));
    let empty = Loop::new("SGD");
    assert!(matches!(
        orchestrate(&empty.analysis, &OrchestratorConfig::standard()),
        Err(super::super::OrchestrateError::NoBlocks)
    ));
}

#[test]
fn every_rule_is_listed_once_under_its_serde_name() {
    let mut seen = std::collections::BTreeSet::new();
    for rule in RuleId::ALL {
        assert!(seen.insert(rule), "{rule:?} twice");
        assert_eq!(
            serde_json::to_string(&rule).unwrap(),
            format!("\"{}\"", rule.name())
        );
        assert!(!rule.summary().is_empty());
    }
    // The report lists counts in RuleId's order: it is ALL's.
    assert!(RuleId::ALL.windows(2).all(|pair| pair[0] < pair[1]));
}

#[test]
fn a_grad_scaler_adds_its_scale_and_tracker_once_and_two_flags_per_step() {
    let lp = Loop::training("Adam");
    let mut config = OrchestratorConfig::standard();
    config.iterations = 3;
    let plain = orchestrate(&lp.analysis, &config).unwrap().value;
    config.autocast.grad_scaler = true;
    let scaled = orchestrate(&lp.analysis, &config).unwrap().value;
    scaled.schedule.check().unwrap();
    let scaler: Vec<&ScheduledBlock> = scaled
        .schedule
        .blocks
        .iter()
        .filter(|b| b.op.as_deref().is_some_and(|o| o.starts_with("GradScaler")))
        .collect();
    assert_eq!(scaler.len(), 2 + 2 * 3);
    assert!(scaler.iter().all(|b| b.size == Bytes(4)));
    let kept = scaler
        .iter()
        .filter(|b| b.category == Category::OptimizerState)
        .count();
    assert_eq!(kept, 2);
    assert_eq!(
        scaled.schedule.blocks.len(),
        plain.schedule.blocks.len() + scaler.len()
    );
}

#[test]
fn bnb_cuda_kernels_replace_the_cpu_backends_temporaries() {
    use crate::analyzer::quantized::{QuantKernel, QuantOp};
    use crate::analyzer::OpSpan;
    let mut lp = Loop::training("SGD");
    let a = &mut lp.analysis;
    let name = |a: &mut Analysis, n: &str| {
        a.names.push(n.to_owned());
        NameId(a.names.len() as u32 - 1)
    };
    let op = |a: &mut Analysis, name: NameId, start: i64, end: i64, parent: Option<usize>| {
        a.ops.push(OpSpan {
            name,
            tid: 1,
            start: Nanos(start),
            end: Nanos(end),
            parent,
            sequence_number: None,
            backward: false,
            forward_op: None,
            layer: Some(NameId(0)),
            inputs: 0..0,
        });
        a.ops.len() - 1
    };
    let (outer, matmul, dequant) = (
        name(a, "MatMul8bitLt"),
        name(a, "bitsandbytes::int8_linear_matmul"),
        name(a, "bitsandbytes::int8_mm_dequant"),
    );
    let outer = op(a, outer, 300, 340, None);
    let matmul = op(a, matmul, 310, 320, Some(outer));
    let dequant = op(a, dequant, 322, 330, Some(outer));
    let kernel = |op, kind, m, k, n| QuantKernel {
        op,
        kind,
        m,
        k,
        n,
        input_elem: 4,
        absmax_blocks: 0,
    };
    a.quant_kernels = vec![
        kernel(matmul, QuantOp::Int8LinearMatmul, 10, 20, 30),
        kernel(dequant, QuantOp::Int8MmDequant, 10, 0, 30),
    ];
    // the float32 copy of the int8 weight, inside the matmul; its int32
    // output, freed after the dequantization; a float32 temporary of the
    // CPU's dequantization
    for (alloc, free, size, inside) in [
        (311, 319, 2_400, matmul),
        (318, 331, 1_200, outer),
        (323, 328, 1_201, dequant),
    ] {
        let b = lp.block(0, alloc, Some(free), size, P::Forward, BlockRole::Other);
        lp.analysis.blocks[b].internal_to = Some(inside);
        lp.analysis.blocks[b].op_internal = true;
    }
    let (schedule, _) = run(&lp.analysis, 1, OptimizerPath::Captured);
    let sizes: Vec<u64> = schedule.blocks.iter().map(|b| b.size.get()).collect();
    assert!(
        !sizes.contains(&2_400),
        "the CPU's float32 weight copy is dropped"
    );
    assert!(
        !sizes.contains(&1_201),
        "the CPU's dequantization temporary is dropped"
    );
    assert!(sizes.contains(&1_200), "the int32 output stays");
    // cuBLASLt writes the int32 result directly; int8_mm_dequant's kernel
    // writes a float16 [10, 30] result, cast to float32
    let added: Vec<_> = schedule
        .blocks
        .iter()
        .filter(|b| b.op.as_deref() == Some("bitsandbytes::int8_mm_dequant"))
        .map(|b| (b.size.get(), b.category))
        .collect();
    assert_eq!(added, vec![(600, Category::Temporary)]);
}
