//! The training recipe of a run, from the trace's own evidence: gradient
//! accumulation, activation checkpointing, gradient clipping, torch.compile,
//! DistributedDataParallel and the training loop (plain, the Hugging Face
//! Trainer, Accelerate, PyTorch Lightning). Each fact names what showed it;
//! what memcast could not find becomes a warning, never a silent guess.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::spans::SpanIndex;
use super::{Iteration, Names, Phase};
use crate::diag::Warning;
use crate::trace::Trace;

/// The training loop that drove the run, as its frames show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainingLoop {
    /// A hand-written loop (`optimizer.step()` annotations, no framework frames).
    Plain,
    /// `transformers.Trainer` (`transformers/trainer.py … training_step`).
    HfTrainer,
    /// A loop using Accelerate (`accelerate/accelerator.py … backward`) without the Trainer.
    Accelerate,
    /// PyTorch Lightning (`…/loops/… training_step`, `optimizer_step`).
    Lightning,
    /// Not known: the trace has no Python frames, or no backward pass.
    Unknown,
}

impl TrainingLoop {
    /// A short label for people.
    pub fn label(self) -> &'static str {
        match self {
            TrainingLoop::Plain => "a plain loop",
            TrainingLoop::HfTrainer => "the Hugging Face Trainer",
            TrainingLoop::Accelerate => "Accelerate",
            TrainingLoop::Lightning => "PyTorch Lightning",
            TrainingLoop::Unknown => "not known",
        }
    }
}

/// Activation checkpointing, as the trace shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpointing {
    /// `torch.utils.checkpoint.checkpoint` calls (Python frames), 0 without frames.
    pub calls: u32,
    /// Backward nodes inside which a forward was recomputed (reentrant
    /// `CheckpointFunctionBackward` nodes, or nodes running forward ops such
    /// as `aten::linear` for the non-reentrant form).
    pub recomputations: u32,
    /// The reentrant form (`CheckpointFunction`) was seen.
    pub reentrant: bool,
}

/// The process group of a `torch.distributed` run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Distributed {
    /// `gloo`, `nccl`, ...; `None` when only the ops showed it.
    pub backend: Option<String>,
    pub rank: Option<i64>,
    pub world_size: Option<i64>,
    /// A `DistributedDataParallel` module or its forward annotation was seen.
    pub ddp: bool,
}

/// How the run is structured and which recipes it uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecipe {
    /// Forward/backward passes (micro-batches) per optimizer step: the most
    /// common count over the iterations with a backward pass (`None`: no
    /// backward pass).
    pub micro_batches_per_step: Option<u32>,
    pub checkpointing: Option<Checkpointing>,
    /// Gradient-clipping calls (`clip_grad_norm_`, `clip_grad_value_`, ...).
    pub clip_calls: u32,
    /// `torch.compile` regions were run (`Torch-Compiled Region`,
    /// `CompiledFunction`, `## Call CompiledFxGraph … ##`).
    pub compiled: bool,
    pub distributed: Option<Distributed>,
    pub training_loop: TrainingLoop,
    /// The trace has Python frames (`with_stack=True`).
    pub python_frames: bool,
}

impl Default for RunRecipe {
    fn default() -> RunRecipe {
        RunRecipe {
            micro_batches_per_step: None,
            checkpointing: None,
            clip_calls: 0,
            compiled: false,
            distributed: None,
            training_loop: TrainingLoop::Unknown,
            python_frames: false,
        }
    }
}

/// Composite forward ops that no derivative formula calls: one of them
/// running inside a backward node is a recomputed forward (non-reentrant
/// activation checkpointing).
const FORWARD_ONLY_OPS: &[&str] = &[
    "aten::linear",
    "aten::conv1d",
    "aten::conv2d",
    "aten::conv3d",
    "aten::layer_norm",
    "aten::group_norm",
    "aten::batch_norm",
    "aten::embedding",
    "aten::dropout",
    "aten::scaled_dot_product_attention",
];

const BACKWARD_NODE_PREFIX: &str = "autograd::engine::evaluate_function";

/// Finds the recipe; pushes a warning for each recipe memcast handles
/// differently from a plain loop, and for what it could not find.
pub(crate) fn find(
    trace: &Trace,
    index: &SpanIndex,
    iterations: &[Iteration],
    names: &Names,
    warnings: &mut Vec<Warning>,
) -> RunRecipe {
    let frame_names: Vec<&str> = index
        .frames
        .spans
        .iter()
        .map(|f| names.get(f.name))
        .collect();
    let any_frame = |pred: &dyn Fn(&str) -> bool| frame_names.iter().any(|n| pred(n));
    let op_names = || index.ops.spans.iter().map(|o| names.get(o.name));
    let annotation_names = || index.annotations.iter().map(|a| names.get(a.name));

    // Micro-batches per step: the most common count, the larger on ties.
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for it in iterations.iter().filter(|it| it.micro_batches > 0) {
        *counts.entry(it.micro_batches).or_default() += 1;
    }
    let micro_batches_per_step = counts
        .iter()
        .max_by_key(|&(k, n)| (*n, *k))
        .map(|(k, _)| *k);

    // Activation checkpointing.
    let calls = frame_names
        .iter()
        .filter(|n| n.starts_with("torch/utils/checkpoint.py(") && n.ends_with("): checkpoint"))
        .count();
    let reentrant = op_names()
        .filter(|n| *n == "CheckpointFunctionBackward")
        .count();
    let ops = &index.ops;
    let non_reentrant = ops
        .spans
        .iter()
        .enumerate()
        .filter(|(_, o)| names.get(o.name).starts_with(BACKWARD_NODE_PREFIX))
        .filter(|&(node, _)| {
            // A node whose subtree runs a forward-only op.
            let nested = ops.spans.iter().skip(node + 1);
            let end = ops.spans.get(node).map(|o| (o.tid, o.end));
            nested
                .take_while(|o| end.is_some_and(|(tid, e)| o.tid == tid && o.start <= e))
                .any(|o| FORWARD_ONLY_OPS.contains(&names.get(o.name)))
        })
        .count();
    let recomputations = reentrant + non_reentrant;
    let checkpointing = (calls > 0 || recomputations > 0).then(|| Checkpointing {
        calls: u32::try_from(calls).unwrap_or(u32::MAX),
        recomputations: u32::try_from(recomputations).unwrap_or(u32::MAX),
        reentrant: reentrant > 0,
    });

    let clip_calls = iterations
        .iter()
        .flat_map(|it| it.phases.iter())
        .filter(|p| p.phase == Phase::ClipGrad)
        .count();

    let compiled = op_names()
        .any(|n| n.starts_with("Torch-Compiled Region") || n == "CompiledFunction")
        || annotation_names().any(|n| n.starts_with("## Call CompiledFxGraph"));

    let ddp = annotation_names().any(|n| n == "DistributedDataParallel.forward")
        || any_frame(&|n| n.starts_with("nn.Module: DistributedDataParallel_"));
    let collectives = op_names().any(|n| n.starts_with("c10d::"));
    let distributed = match &trace.header.distributed {
        Some(info) => Some(Distributed {
            backend: info.backend.clone(),
            rank: info.rank,
            world_size: info.world_size,
            ddp,
        }),
        None if ddp || collectives => Some(Distributed {
            backend: None,
            rank: None,
            world_size: None,
            ddp,
        }),
        None => None,
    };

    let python_frames = !index.frames.spans.is_empty();
    let has_backward = micro_batches_per_step.is_some();
    let training_loop = if !python_frames || !has_backward {
        TrainingLoop::Unknown
    } else if any_frame(&|n| {
        n.starts_with("transformers/trainer.py(") && n.ends_with("): training_step")
    }) {
        TrainingLoop::HfTrainer
    } else if any_frame(&|n| {
        (n.starts_with("pytorch_lightning/") || n.starts_with("lightning/pytorch/"))
            && (n.ends_with("): training_step") || n.ends_with("): optimizer_step"))
    }) {
        TrainingLoop::Lightning
    } else if any_frame(&|n| {
        n.starts_with("accelerate/accelerator.py(") && n.ends_with("): backward")
    }) {
        TrainingLoop::Accelerate
    } else {
        TrainingLoop::Plain
    };

    let recipe = RunRecipe {
        micro_batches_per_step,
        checkpointing,
        clip_calls: u32::try_from(clip_calls).unwrap_or(u32::MAX),
        compiled,
        distributed,
        training_loop,
        python_frames,
    };
    warn(&recipe, trace, iterations, names, index, warnings);
    recipe
}

fn warn(
    recipe: &RunRecipe,
    trace: &Trace,
    iterations: &[Iteration],
    names: &Names,
    index: &SpanIndex,
    warnings: &mut Vec<Warning>,
) {
    if let Some(k) = recipe.micro_batches_per_step.filter(|&k| k > 1) {
        warnings.push(Warning::new(
            "gradient_accumulation",
            format!("each optimizer step runs {k} micro-batches (forward and backward passes): every parameter counts once, the first micro-batch's backward makes the gradients and later ones add into them (each new gradient a transient); batch sizes in this report are per micro-batch"),
        ));
    }
    if let Some(c) = recipe.checkpointing {
        warnings.push(Warning::new(
            "activation_checkpointing",
            format!(
                "activation checkpointing ({}): the forward keeps only what each checkpoint saves, and {} recomputation(s) inside backward are simulated as recorded",
                if c.reentrant { "reentrant CheckpointFunction" } else { "torch.utils.checkpoint" },
                c.recomputations
            ),
        ));
    }
    if recipe.clip_calls > 0 {
        warnings.push(Warning::new(
            "gradient_clipping",
            format!("gradient clipping ran {} time(s): its per-parameter norms and total norm are temporaries of the clipping phase, before the optimizer step", recipe.clip_calls),
        ));
    }
    if recipe.compiled {
        warnings.push(Warning::new(
            "torch_compile",
            "the model ran through torch.compile: activations are those the compiled graph allocated with the CPU's C++ kernels; the GPU's Triton kernels fuse differently, so the activations on a GPU may differ",
        ));
    }
    if let Some(d) = &recipe.distributed {
        let world = d
            .world_size
            .map_or_else(|| "several".to_owned(), |w| w.to_string());
        let rank = d.rank.map_or_else(String::new, |r| format!(" (rank {r})"));
        let backend = d.backend.as_deref().unwrap_or("an unknown backend");
        warnings.push(Warning::new(
            "distributed_one_rank",
            format!(
                "this trace is one process{rank} of a {} over {world} processes ({backend}): memcast estimated this one rank",
                if d.ddp { "DistributedDataParallel job" } else { "torch.distributed job" }
            ),
        ));
    }
    match recipe.training_loop {
        TrainingLoop::HfTrainer => warnings.push(Warning::new(
            "loop_hf_trainer",
            "the Hugging Face Trainer's loop was recognised: backward through Accelerate, gradient clipping (max_grad_norm), and model.zero_grad() after the optimizer step, which frees the gradients before the next forward",
        )),
        TrainingLoop::Accelerate => warnings.push(Warning::new(
            "loop_accelerate",
            "an Accelerate loop was recognised (accelerator.backward)",
        )),
        TrainingLoop::Lightning => warnings.push(Warning::new(
            "loop_lightning",
            "PyTorch Lightning's loop was recognised: the optimizer step runs the last micro-batch's training_step, zero_grad and backward inside its closure; those keep their own phases",
        )),
        TrainingLoop::Plain | TrainingLoop::Unknown => {}
    }
    // What could not be found, for a loop memcast does not know.
    let training = index
        .ops
        .spans
        .iter()
        .any(|o| names.get(o.name) == "torch::autograd::AccumulateGrad");
    let steps = iterations
        .iter()
        .flat_map(|it| it.phases.iter())
        .any(|p| p.phase == Phase::OptimizerStep);
    if training && !steps {
        warnings.push(Warning::new(
            "loop_no_optimizer_step",
            "backward ran (AccumulateGrad) but no optimizer step was found (no Optimizer.step#… annotation, which every torch.optim optimizer records): either the optimizer is not a torch.optim.Optimizer or its step was not profiled; optimizer state and step temporaries are only what the trace shows",
        ));
    }
    if training && recipe.micro_batches_per_step.is_none() {
        warnings.push(Warning::new(
            "loop_no_backward_pass",
            "AccumulateGrad ran but no backward pass was found (no backward frame and no run of autograd-engine ops at the top level): gradients may not be placed in their phase",
        ));
    }
    let zero_grads = iterations
        .iter()
        .flat_map(|it| it.phases.iter())
        .any(|p| p.phase == Phase::ZeroGrad);
    if training && steps && !zero_grads && trace.memory.len() > 1 {
        warnings.push(Warning::new(
            "loop_no_zero_grad",
            "no zero_grad was found (no Optimizer.zero_grad annotation, no zero_grad frame, no gradients freed between steps): the gradients are kept alive across iterations as the trace shows them",
        ));
    }
}
