//! The run and the model in one line each, as both shells show them.

use crate::analyzer::RunKind;
use crate::report::{Report, RunSummary};

use super::{exact, short, thousands};

/// "training: 3 iterations simulated (3 captured), optimizer AdamW
/// (foreach), target GPU a100-80gb"; a forward-only run says it has no
/// optimizer instead of calling it unknown.
pub fn run_line(report: &Report) -> String {
    let s = &report.summary;
    let optimizer = match (&s.optimizer, s.run_kind) {
        (Some(name), _) => format!(
            "optimizer {name}{}",
            if s.foreach_modelled { " (foreach)" } else { "" }
        ),
        (None, RunKind::Inference | RunKind::ForwardWithAutograd) => "no optimizer".to_owned(),
        (None, _) => "optimizer not named in the trace".to_owned(),
    };
    let kind = if report.job_kind == crate::report::JobKind::Generation {
        "generation"
    } else {
        s.run_kind.label()
    };
    format!(
        "{}: {} iterations simulated ({} captured), {optimizer}, target GPU {}",
        kind.replace('_', " "),
        s.iterations_simulated,
        s.iterations_captured,
        report.reference_gpu
    )
}

/// The recipe the run was simulated with, as the trace shows it: "4
/// micro-batch(es) per optimizer step, activation checkpointing
/// (reentrant), gradient clipping, loop: a plain loop". Checkpointing names
/// its form, which decides what backward recomputes and keeps (a reentrant
/// `CheckpointFunction` re-runs its block's forward under grad inside its
/// own backward node; the non-reentrant form recomputes through saved-tensor
/// hooks).
pub fn recipe_line(s: &RunSummary) -> String {
    let recipe = &s.recipe;
    let mut structure: Vec<String> = Vec::new();
    if let Some(k) = recipe.micro_batches_per_step {
        structure.push(format!("{k} micro-batch(es) per optimizer step"));
    }
    if let Some(c) = recipe.checkpointing {
        structure.push(format!(
            "activation checkpointing ({})",
            if c.reentrant {
                "reentrant"
            } else {
                "non-reentrant"
            }
        ));
    }
    if recipe.clip_calls > 0 {
        structure.push("gradient clipping".to_owned());
    }
    if recipe.compiled {
        structure.push("torch.compile".to_owned());
    }
    if let Some(d) = &recipe.distributed {
        structure.push(format!(
            "one rank of {} ({})",
            d.world_size
                .map_or_else(|| "several".to_owned(), |w| w.to_string()),
            d.backend.as_deref().unwrap_or("unknown backend")
        ));
    }
    structure.push(format!("loop: {}", recipe.training_loop.label()));
    structure.join(", ")
}

/// "124 parameter tensors, 1.20 GiB (0.0 MiB trainable, 1.20 GiB frozen, of
/// which 310.0 MiB stored in 4-bit NF4, plus 9,437,184 B of quantisation
/// state), buffers 0.0 MiB".
pub fn model_line(s: &RunSummary) -> String {
    let quantized = if s.quantized_parameter_bytes.is_zero() && s.quant_state_bytes.is_zero() {
        String::new()
    } else {
        let scheme = s
            .capture
            .as_ref()
            .and_then(|c| c.quantization.as_deref())
            .map(|q| match q {
                "nf4" => "4-bit NF4".to_owned(),
                "int8" => "8-bit (LLM.int8())".to_owned(),
                other => other.to_owned(),
            })
            .or_else(|| s.quantization.clone())
            .unwrap_or_else(|| "quantized form".to_owned());
        format!(
            ", of which {} stored in {scheme}, plus {} of quantisation state",
            short(s.quantized_parameter_bytes),
            exact(s.quant_state_bytes)
        )
    };
    format!(
        "{} parameter tensors, {} ({} trainable, {} frozen{quantized}), buffers {}",
        thousands(u64::from(s.n_parameters)),
        short(s.parameter_bytes),
        short(s.trainable_parameter_bytes),
        short(s.frozen_parameter_bytes),
        short(s.buffer_bytes)
    )
}
