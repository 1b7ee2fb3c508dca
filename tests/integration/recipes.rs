//! Training recipes and traces recorded with fewer profiler options: the run's
//! structure (iterations = optimizer steps, micro-batches, phases, the loop)
//! found from the trace's own evidence, and the relations between a recipe
//! and its plain twin that follow from PyTorch's semantics
//! (`../shared/fixtures/traces-recipes/README.md`, `traces-options/README.md`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use memcast::analyzer::{self, Analysis, BlockRole, Phase, TrainingLoop};
use memcast::orchestrator::{Category, EventKind, Phase as SchedulePhase, Schedule};
use memcast::report::Report;
use memcast::trace::Trace;
use memcast::{Config, Prepared};

use crate::common;

/// One GPU: the relations are about the schedule, not the verdicts.
fn config() -> Config {
    Config::for_gpus("a100-80gb", &["a100-80gb".to_owned()]).unwrap()
}

/// One fixture: its trace, analysis, prepared schedule, report and sidecar.
struct Run {
    analysis: Analysis,
    prepared: Prepared,
    report: Report,
    meta: serde_json::Value,
}

fn run_trace(trace: Trace) -> (Analysis, Prepared, Report) {
    let analysis = analyzer::analyze(&trace, &config().analyzer).unwrap().value;
    let prepared = common::prepare_parsed(trace, &config());
    let report = memcast::estimate(&prepared, &config(), &mut |_| {})
        .unwrap()
        .value;
    (analysis, prepared, report)
}

fn parse(relative: &str) -> Trace {
    memcast::trace::parse(&common::read_shared(relative))
        .unwrap_or_else(|err| panic!("{relative}: {err}"))
        .value
}

fn meta_of(relative: &str) -> serde_json::Value {
    let path = relative.trim_end_matches(".json.gz").to_owned() + ".meta.json";
    serde_json::from_slice(&common::read_shared(&path)).unwrap()
}

/// Every recipe and options fixture, run once for the whole binary.
fn runs() -> &'static BTreeMap<String, Run> {
    static RUNS: OnceLock<BTreeMap<String, Run>> = OnceLock::new();
    RUNS.get_or_init(|| {
        common::fixtures_in("traces-recipes")
            .into_iter()
            .chain(common::fixtures_in("traces-options"))
            .map(|relative| {
                let (analysis, prepared, report) = run_trace(parse(&relative));
                let meta = meta_of(&relative);
                let name = relative.rsplit('/').next().unwrap_or_default();
                let name = name.trim_end_matches(".json.gz").to_owned();
                (
                    name,
                    Run {
                        analysis,
                        prepared,
                        report,
                        meta,
                    },
                )
            })
            .collect()
    })
}

fn run(name: &str) -> &'static Run {
    runs()
        .get(name)
        .unwrap_or_else(|| panic!("missing fixture {name}"))
}

fn peak(name: &str) -> u64 {
    run(name).report.peak.allocated_bytes.get()
}

fn pct(a: u64, b: u64) -> f64 {
    100.0 * (a as f64 - b as f64) / b as f64
}

/// The trace without what `with_stack=True` adds: its Python frames.
fn without_stack(mut trace: Trace) -> Trace {
    trace.python.clear();
    trace.header.with_stack = None;
    trace
}

#[test]
fn every_recipe_and_options_fixture_is_estimated_with_its_structure() {
    for (name, run) in runs() {
        let recipe = &run.report.summary.recipe;
        let summary = serde_json::json!({
            "peak_allocated_bytes": run.report.peak.allocated_bytes,
            "breakdown_at_peak": run.report.breakdown_at_peak,
            "recipe": recipe,
            "phases_of_first_iteration": run.analysis.iterations.first().map(|it| {
                it.phases.iter().map(|p| p.phase.label()).collect::<Vec<_>>()
            }),
            "warnings": run.report.warnings.iter().map(|w| w.code.as_str()).collect::<Vec<_>>(),
        });
        insta::assert_json_snapshot!(format!("recipe_{name}"), summary);
    }
}

/// Iterations are optimizer steps; a step holds as many forward/backward
/// passes as the job accumulates micro-batches (`loss.backward()` per
/// micro-batch, one `optimizer.step()`).
#[test]
fn micro_batches_per_step_are_the_jobs_own() {
    for (name, run) in runs() {
        let Some(want) = run.meta["recipe"]["micro_batches_per_step"].as_u64() else {
            continue;
        };
        assert_eq!(
            run.report.summary.recipe.micro_batches_per_step,
            Some(want as u32),
            "{name}"
        );
        for it in &run.analysis.iterations {
            let passes = it
                .phases
                .iter()
                .filter(|p| p.phase == Phase::Backward)
                .count();
            assert_eq!(passes as u64, want, "{name} iteration {}", it.index);
        }
    }
}

/// Each parameter counts once however often AccumulateGrad runs: every
/// micro-batch's backward runs it once per parameter.
#[test]
fn accumulation_counts_every_parameter_once() {
    for name in ["resnet18_sgd_bs8_accum4", "distilgpt2_trainer_bs4_accum2"] {
        let run = run(name);
        let want = run.meta["trainable_param_bytes"].as_u64().unwrap();
        let got = run.prepared.parameter_bytes.get();
        assert!(
            pct(got, want).abs() <= 1.0,
            "{name}: parameters {got} vs {want}"
        );
    }
}

/// Accumulation keeps the first micro-batch's gradients alive through the
/// next micro-batch's forward and backward, whose new gradients are
/// transients added into them: the peak lies between the plain micro-batch's
/// and that plus the trainable bytes.
#[test]
fn accumulation_lies_between_its_twin_and_the_twin_plus_its_gradients() {
    let (a, t) = (
        peak("resnet18_sgd_bs8_accum4"),
        peak("resnet18_sgd_bs8_plain"),
    );
    let trainable = run("resnet18_sgd_bs8_plain").meta["trainable_param_bytes"]
        .as_u64()
        .unwrap();
    assert!(
        a as f64 >= t as f64 * 0.995 && a as f64 <= t as f64 + trainable as f64 * 1.01,
        "accum4 {a} vs plain {t} (+{trainable})"
    );
    // From the second micro-batch on, the new gradient is not a gradient.
    let analysis = &run("resnet18_sgd_bs8_accum4").analysis;
    let n_params = analysis.parameters.len();
    let first = &analysis.iterations[0];
    let gradients = analysis
        .blocks
        .iter()
        .filter(|b| b.alloc_iteration == Some(first.index))
        .filter(|b| matches!(b.role, BlockRole::Gradient { .. }))
        .count();
    assert_eq!(
        gradients, n_params,
        "one gradient block per parameter per step"
    );
}

/// Checkpointing recomputes each checkpointed stage inside backward and keeps
/// only what each checkpoint saves: never above the plain twin.
#[test]
fn checkpointing_recomputes_in_backward_and_is_not_above_its_twin() {
    let name = "distilgpt2_adamw_bs8_ckpt_clip";
    let (c, t) = (peak(name), peak("distilgpt2_adamw_bs8_plain"));
    assert!(c as f64 <= t as f64 * 1.02, "{c} vs twin {t}");
    let ckpt = run(name).report.summary.recipe.checkpointing.unwrap();
    assert!(ckpt.calls > 0 && ckpt.recomputations > 0, "{ckpt:?}");
}

/// Clipping runs between the last backward and the step; its norms are
/// temporaries of that phase, never optimizer state.
#[test]
fn clipping_is_its_own_phase_of_temporaries() {
    for name in [
        "distilgpt2_adamw_bs8_ckpt_clip",
        "distilgpt2_trainer_bs8",
        "distilgpt2_trainer_bs4_accum2",
    ] {
        let run = run(name);
        for it in &run.analysis.iterations {
            assert!(
                it.phases.iter().any(|p| p.phase == Phase::ClipGrad),
                "{name}: iteration {} has no clipping phase",
                it.index
            );
        }
        let schedule = &run.prepared.orchestrated.schedule;
        let clip: Vec<_> = schedule
            .blocks
            .iter()
            .filter(|b| b.phase == SchedulePhase::ClipGrad)
            .collect();
        assert!(!clip.is_empty(), "{name}");
        assert!(
            clip.iter()
                .all(|b| b.category != Category::OptimizerState && b.category != Category::Gradient),
            "{name}"
        );
    }
}

/// The Trainer zeroes gradients with `model.zero_grad()` after the step: no
/// annotation, only its frame, and its frees are where the gradients die.
#[test]
fn the_trainers_zero_grad_frees_the_gradients_after_the_step() {
    for name in ["distilgpt2_trainer_bs8", "distilgpt2_trainer_bs4_accum2"] {
        let run = run(name);
        assert_eq!(
            run.report.summary.recipe.training_loop,
            TrainingLoop::HfTrainer
        );
        for it in &run.analysis.iterations {
            let zero = it.phases.iter().find(|p| p.phase == Phase::ZeroGrad);
            let step = it.phases.iter().find(|p| p.phase == Phase::OptimizerStep);
            let (Some(zero), Some(step)) = (zero, step) else {
                panic!("{name}: iteration {} lacks zero_grad or step", it.index);
            };
            assert!(zero.start >= step.end, "{name}: zero_grad after the step");
        }
        assert!(
            no_gradient_into_the_next_forward(&run.prepared.orchestrated.schedule),
            "{name}"
        );
    }
}

/// Whether every gradient allocated in an iteration is freed before the
/// next iteration's forward starts.
fn no_gradient_into_the_next_forward(schedule: &Schedule) -> bool {
    let mut freed: BTreeMap<u32, memcast::Nanos> = BTreeMap::new();
    for event in &schedule.events {
        if event.kind == EventKind::Free {
            freed.insert(event.block.0, event.time);
        }
    }
    schedule
        .blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.category == Category::Gradient)
        .all(|(id, b)| {
            let Some(iteration) = b.iteration else {
                return true;
            };
            let next_forward = schedule
                .phases
                .iter()
                .find(|w| w.iteration == iteration + 1 && w.phase == SchedulePhase::Forward);
            match (next_forward, freed.get(&(id as u32))) {
                (None, _) => true,
                (Some(f), Some(&t)) => t <= f.start,
                (Some(_), None) => false,
            }
        })
}

/// torch.compile: AccumulateGrad still runs per parameter after the compiled
/// backward, so parameters and gradients are found through it.
#[test]
fn compiled_regions_keep_parameters_and_gradients() {
    let run = run("resnet18_sgd_bs8_compile");
    assert!(run.report.summary.recipe.compiled);
    assert!(run
        .report
        .warnings
        .iter()
        .any(|w| w.code == "torch_compile"));
    let want = run.meta["param_bytes"].as_u64().unwrap();
    assert!(pct(run.prepared.parameter_bytes.get(), want).abs() <= 1.0);
    let n_params = run.analysis.parameters.len();
    for it in &run.analysis.iterations {
        let gradients = run
            .analysis
            .blocks
            .iter()
            .filter(|b| b.alloc_iteration == Some(it.index))
            .filter(|b| matches!(b.role, BlockRole::Gradient { .. }))
            .count();
        assert_eq!(gradients, n_params, "iteration {}", it.index);
    }
}

/// DDP: the trace header names the process group; the estimate is one rank's.
#[test]
fn ddp_is_found_and_one_rank_is_estimated() {
    let run = run("resnet18_adam_bs8_ddp2");
    let dist = run.report.summary.recipe.distributed.clone().unwrap();
    assert!(dist.ddp);
    assert_eq!(dist.backend.as_deref(), Some("gloo"));
    assert_eq!(dist.world_size, Some(2));
    assert!(run
        .report
        .warnings
        .iter()
        .any(|w| w.code == "distributed_one_rank"));
    assert!(run.report.summary.recipe.checkpointing.is_none());
}

/// The same training run recorded without `with_stack` gives the same peak
/// (1 %) on every options group: the phases come from the markers and ops.
/// (Variants without `record_shapes` size their parameters from other
/// evidence; their relation is checked where that evidence is modelled.)
#[test]
fn options_variants_without_stack_keep_the_peak() {
    let variants: Vec<&String> = runs().keys().filter(|n| n.ends_with("_nostack")).collect();
    assert!(!variants.is_empty());
    for name in variants {
        let full = name.trim_end_matches("_nostack").to_owned() + "_full";
        let (a, f) = (peak(name), peak(&full));
        assert!(pct(a, f).abs() <= 1.0, "{name}: {a} vs {f}");
        let warnings = &run(name).report.warnings;
        assert!(warnings.iter().any(|w| w.code == "no_python_frames"));
    }
}

/// Removing the Python frames from any real trace (what `with_stack=False`
/// leaves out) keeps the peak within 1 %: the estimate never depends on them.
#[test]
fn every_fixture_without_its_frames_keeps_its_peak() {
    let mut names: Vec<String> = common::trace_fixtures()
        .into_iter()
        .map(|n| format!("fixtures/traces/{n}"))
        .collect();
    names.extend(common::fixtures_in("traces-nograd"));
    names.extend(common::fixtures_in("traces-recipes"));
    for relative in names {
        let trace = parse(&relative);
        let (_, _, full) = run_trace(trace.clone());
        let (_, _, bare) = run_trace(without_stack(trace));
        let (a, f) = (
            bare.peak.allocated_bytes.get(),
            full.peak.allocated_bytes.get(),
        );
        assert!(
            pct(a, f).abs() <= 1.0,
            "{relative}: {a} without frames vs {f}"
        );
    }
}

// ---- One small hand-written trace per rule (tests/fixtures/recipe_*.json) ----

fn local(name: &str) -> (Analysis, Prepared, Report, Vec<String>) {
    let bytes = std::fs::read(common::local_fixture(name)).unwrap();
    let trace = memcast::trace::parse(&bytes).unwrap().value;
    let warned = analyzer::analyze(&trace, &config().analyzer).unwrap();
    let (_, prepared, report) = run_trace(trace);
    let codes = report.warnings.iter().map(|w| w.code.clone()).collect();
    (warned.value, prepared, report, codes)
}

/// Two micro-batches per step: one parameter, one gradient per step (the
/// first micro-batch's), the second micro-batch's new gradient a transient
/// freed inside its AccumulateGrad.
#[test]
fn accumulation_rules_on_a_small_trace() {
    for name in [
        "recipe_accumulation.json",
        "recipe_accumulation_nostack.json",
    ] {
        let (a, prepared, report, codes) = local(name);
        assert_eq!(a.parameters.len(), 1, "{name}");
        assert_eq!(prepared.parameter_bytes.get(), 64, "{name}");
        assert!(
            a.iterations.iter().all(|it| it.micro_batches == 2),
            "{name}"
        );
        assert_eq!(report.summary.recipe.micro_batches_per_step, Some(2));
        assert!(codes.iter().any(|c| c == "gradient_accumulation"), "{name}");
        let roles: Vec<(u64, bool)> = a
            .blocks
            .iter()
            .filter(|b| b.size.get() == 64 && b.alloc_phase == Phase::Backward)
            .map(|b| (b.addr, matches!(b.role, BlockRole::Gradient { .. })))
            .collect();
        assert_eq!(
            roles,
            [(20, true), (21, false), (20, true), (21, false)],
            "{name}"
        );
        let forwards = a.iterations[0]
            .phases
            .iter()
            .filter(|p| p.phase == Phase::Forward)
            .count();
        assert_eq!(forwards, 2, "{name}: one forward per micro-batch");
    }
}

/// The Trainer's loop: its frames name it; `model.zero_grad()` (a frame, no
/// annotation) after the step is the zero_grad; without frames the same
/// frees are inferred as one; clipping norms are temporaries of their phase.
#[test]
fn trainer_rules_on_a_small_trace() {
    let (a, prepared, report, codes) = local("recipe_trainer.json");
    assert_eq!(report.summary.recipe.training_loop, TrainingLoop::HfTrainer);
    assert!(codes.iter().any(|c| c == "loop_hf_trainer"));
    let (b, bare_prepared, bare, bare_codes) = local("recipe_trainer_nostack.json");
    assert_eq!(bare.summary.recipe.training_loop, TrainingLoop::Unknown);
    assert!(bare_codes.iter().any(|c| c == "zero_grad_inferred"));
    for (analysis, prepared) in [(&a, &prepared), (&b, &bare_prepared)] {
        for it in &analysis.iterations {
            assert!(it.phases.iter().any(|p| p.phase == Phase::ZeroGrad));
            assert!(it.phases.iter().any(|p| p.phase == Phase::ClipGrad));
        }
        let grad = analysis
            .blocks
            .iter()
            .find(|b| matches!(b.role, BlockRole::Gradient { .. }))
            .unwrap();
        assert_eq!(grad.free_phase, Some(Phase::ZeroGrad));
        let schedule = &prepared.orchestrated.schedule;
        assert!(no_gradient_into_the_next_forward(schedule));
        let clip: Vec<_> = schedule
            .blocks
            .iter()
            .filter(|b| b.phase == SchedulePhase::ClipGrad)
            .collect();
        assert!(!clip.is_empty());
        assert!(clip
            .iter()
            .all(|b| b.category == Category::Activation || b.category == Category::Temporary));
    }
    assert_eq!(report.peak.allocated_bytes, bare.peak.allocated_bytes);
}

/// DDP over gloo: the header names the group; a block allocated inside a
/// `c10d::` collective (gloo's staging copy) has no NCCL counterpart.
#[test]
fn ddp_rules_on_a_small_trace() {
    let (_, prepared, report, codes) = local("recipe_ddp_gloo.json");
    let dist = report.summary.recipe.distributed.clone().unwrap();
    assert_eq!(
        (
            dist.backend.as_deref(),
            dist.rank,
            dist.world_size,
            dist.ddp
        ),
        (Some("gloo"), Some(0), Some(2), true)
    );
    assert!(codes.iter().any(|c| c == "distributed_one_rank"));
    let dropped = prepared
        .orchestrated
        .facts
        .rule_counts
        .iter()
        .find(|r| r.rule == memcast::orchestrator::RuleId::CpuCollectiveTemporaries)
        .map(|r| r.blocks);
    assert_eq!(dropped, Some(1));
}

/// torch.compile: found from its ops and annotations; AccumulateGrad after
/// the compiled backward still gives the parameter and its gradient.
#[test]
fn compile_rules_on_a_small_trace() {
    let (a, _, report, codes) = local("recipe_compiled.json");
    assert!(report.summary.recipe.compiled);
    assert!(codes.iter().any(|c| c == "torch_compile"));
    assert_eq!(a.parameters.len(), 1);
    assert!(a
        .blocks
        .iter()
        .any(|b| matches!(b.role, BlockRole::Gradient { .. })));
}

/// Non-reentrant checkpointing: a forward op inside a backward node is a
/// recomputation, simulated where it ran.
#[test]
fn checkpoint_rules_on_a_small_trace() {
    let (a, _, report, codes) = local("recipe_checkpoint.json");
    let ckpt = report.summary.recipe.checkpointing.unwrap();
    assert_eq!(
        (ckpt.calls, ckpt.recomputations, ckpt.reentrant),
        (1, 1, false)
    );
    assert!(codes.iter().any(|c| c == "activation_checkpointing"));
    let recomputed = a.blocks.iter().find(|b| b.size.get() == 800).unwrap();
    assert_eq!(recomputed.alloc_phase, Phase::Backward);
}

/// The header's `distributedInfo` is read when it is an object and ignored
/// (not an error) in any other shape.
#[test]
fn distributed_info_is_read_leniently() {
    let with = |info: &str| {
        let text = format!(
            r#"{{"distributedInfo": {info}, "traceEvents": [{{"ph": "i", "name": "[memory]", "tid": 1, "ts": 1, "args": {{"Addr": 1, "Bytes": 8, "Device Type": 0}}}}]}}"#
        );
        memcast::trace::parse(text.as_bytes())
            .unwrap()
            .value
            .header
            .distributed
    };
    let info =
        with(r#"{"backend": "nccl", "rank": "3", "world_size": 8, "pg_config": [{"x": 1}]}"#)
            .unwrap();
    assert_eq!(
        (info.backend.as_deref(), info.rank, info.world_size),
        (Some("nccl"), Some(3), Some(8))
    );
    for odd in ["null", "7", "\"gloo\"", "[1, 2]", "true"] {
        assert_eq!(with(odd), None, "{odd}");
    }
    assert_eq!(with("{}").unwrap().backend, None);
}

fn data_trace(name: &str) -> Trace {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/traces")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|err| panic!("{path:?}: {err}"));
    memcast::trace::parse(&bytes).unwrap().value
}

/// `tensorboard_trace_handler` with `schedule(wait=1, warmup=1, active=2,
/// repeat=2)` writes one `*.pt.trace.json.gz` per cycle; the second cycle's
/// steps are `ProfilerStep#6` and `#7`. Each file is estimated on its own.
#[test]
fn a_later_cycle_of_a_repeat_schedule_is_a_trace_like_any_other() {
    let (analysis, _, report) =
        run_trace(data_trace("resnet18_sgd_bs4_tb_cycle2.pt.trace.json.gz"));
    let labels: Vec<_> = analysis
        .iterations
        .iter()
        .map(|it| it.label.clone())
        .collect();
    assert_eq!(
        labels,
        [
            Some("ProfilerStep#6".to_owned()),
            Some("ProfilerStep#7".to_owned())
        ]
    );
    assert_eq!(report.summary.recipe.micro_batches_per_step, Some(1));
    assert_eq!(report.summary.recipe.training_loop, TrainingLoop::Plain);
    assert_eq!(report.summary.parameter_bytes.get(), 46_758_048);
}

/// Lightning: `optimizer.step(closure)` runs the training step, zero_grad and
/// backward inside the `Optimizer.step` annotation; they keep their phases,
/// the optimizer's own work stays the step, and a clip hook that ran no op
/// clipped nothing.
#[test]
fn lightnings_closure_keeps_its_phases_inside_the_step() {
    let (analysis, _, report) = run_trace(data_trace("resnet18_lightning_sgd_bs4.json.gz"));
    assert_eq!(report.summary.recipe.training_loop, TrainingLoop::Lightning);
    assert_eq!(report.summary.recipe.micro_batches_per_step, Some(1));
    assert_eq!(report.summary.recipe.clip_calls, 0);
    for it in &analysis.iterations {
        let step = it
            .phases
            .iter()
            .find(|p| p.phase == Phase::OptimizerStep)
            .unwrap();
        let backward = it
            .phases
            .iter()
            .find(|p| p.phase == Phase::Backward)
            .unwrap();
        assert!(
            step.start <= backward.start && backward.end <= step.end,
            "closure inside step"
        );
        assert!(it.phases.iter().any(|p| p.phase == Phase::ZeroGrad));
    }
}

/// LoRA with activation checkpointing under the Hugging Face Trainer, 2
/// micro-batches per step (`profile_hf_trainer.py --model distilgpt2
/// --n-layer 1 --batch-size 1 --seq-len 16 --grad-accum 2 --iters 2
/// --checkpointing --lora-rank 8`). The Trainer makes the frozen input
/// embeddings' output a leaf that requires grad, so every backward pass runs
/// `AccumulateGrad` for that activation too: it is no parameter, gets no
/// optimizer state, and its gradient dies with the graph. Gradients are the
/// trainable bytes and AdamW keeps two tensors per trainable parameter.
#[test]
fn lora_with_checkpointing_and_accumulation_counts_only_the_adapters() {
    let name = "distilgpt2_trainer_lora_ckpt_accum2";
    let (analysis, prepared, report) = run_trace(data_trace(&format!("{name}.json.gz")));
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join(format!("tests/data/traces/{name}.meta.json")),
        )
        .unwrap(),
    )
    .unwrap();
    let trainable = meta["trainable_param_bytes"].as_u64().unwrap();
    assert_eq!(report.summary.recipe.micro_batches_per_step, Some(2));
    assert!(report.summary.recipe.checkpointing.is_some());
    assert_eq!(report.summary.recipe.training_loop, TrainingLoop::HfTrainer);
    let got = report.summary.trainable_parameter_bytes.get();
    assert!(
        pct(got, trainable).abs() <= 1.0,
        "trainable {got} vs {trainable}"
    );
    assert!(report
        .warnings
        .iter()
        .any(|w| w.code == "gradient_of_a_leaf_activation"));

    // The schedule: each iteration's gradients are the trainable bytes, the
    // optimizer state twice them.
    let schedule = &prepared.orchestrated.schedule;
    let mut gradients: BTreeMap<Option<u32>, u64> = BTreeMap::new();
    for block in schedule
        .blocks
        .iter()
        .filter(|b| b.category == Category::Gradient)
    {
        *gradients.entry(block.iteration).or_default() += block.size.get();
    }
    assert!(!gradients.is_empty());
    for (iteration, bytes) in &gradients {
        assert!(
            *bytes as f64 <= trainable as f64 * 1.01,
            "iteration {iteration:?}: gradients {bytes} vs trainable {trainable}"
        );
    }
    let state = common::category_bytes(schedule, Category::OptimizerState).get();
    assert!(
        pct(state, 2 * trainable).abs() <= 2.0,
        "AdamW state {state} vs 2 x {trainable}"
    );
    let n_gradient_blocks = analysis
        .blocks
        .iter()
        .filter(|b| matches!(b.role, BlockRole::Gradient { .. }))
        .count();
    assert_eq!(
        n_gradient_blocks,
        analysis.parameters.len() * analysis.iterations.len(),
        "one gradient block per parameter per step"
    );

    // What `memcast estimate --json` shows at the peak.
    let at_peak = &report.breakdown_at_peak;
    assert!(
        at_peak.gradients.get() as f64 <= trainable as f64 * 1.01,
        "gradients at peak {} vs {trainable}",
        at_peak.gradients
    );
    assert!(
        at_peak.optimizer_state.get() as f64 <= 2.0 * trainable as f64 * 1.02,
        "optimizer state at peak {} vs 2 x {trainable}",
        at_peak.optimizer_state
    );
}
