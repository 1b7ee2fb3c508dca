//! Optimizer state made before the trace: how many parameter-shaped tensors a
//! `torch.optim` optimizer keeps per trainable parameter, from its class and
//! what its step's ops show about its settings.

/// What the last recorded optimizer step ran (top-level ops inside its span).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepOps {
    /// `mul_` / `_foreach_mul_` on parameter-shaped tensors (list elements counted).
    pub muls: u32,
    /// `lerp_` / `_foreach_lerp_`.
    pub lerps: u32,
    /// `maximum` / `_foreach_maximum_` (AMSGrad).
    pub maximums: u32,
}

/// Parameter-shaped state tensors per trainable parameter of `class`
/// (`Optimizer.step#<class>.step`) with `n_params` trainable parameters, or
/// `None` for an optimizer this table does not know. From
/// `torch/optim/<name>.py`'s `_init_group`: SGD keeps `momentum_buffer` when
/// momentum is on (its step then runs `buf.mul_(momentum)`); Adam and AdamW
/// `exp_avg`, `exp_avg_sq` (+ `max_exp_avg_sq` with AMSGrad, whose step runs
/// `maximum`); RMSprop `square_avg` (and `grad_avg` when centered: `lerp_`;
/// and `momentum_buffer` with momentum: a second `mul_` per parameter);
/// Adagrad `sum`; Adamax `exp_avg`, `exp_inf`; NAdam, RAdam `exp_avg`,
/// `exp_avg_sq`; Adadelta `square_avg`, `acc_delta`; Rprop `prev`,
/// `step_size`; ASGD `ax`. Scalar counters (`step`, NAdam's `mu_product`)
/// are host scalars on CUDA and not counted.
pub fn state_tensors_per_parameter(class: &str, ops: StepOps, n_params: u32) -> Option<u32> {
    let n = n_params.max(1);
    Some(match class {
        "SGD" => u32::from(ops.muls > 0),
        "Adam" | "AdamW" => 2 + u32::from(ops.maximums > 0),
        "RMSprop" => 1 + u32::from(ops.lerps > 0) + u32::from(ops.muls > n),
        "Adagrad" | "ASGD" => 1,
        "Adamax" | "NAdam" | "RAdam" | "Adadelta" | "Rprop" => 2,
        _ => return None,
    })
}

/// Adafactor's factored second moment for one parameter of `dims` (4-byte
/// elements): a row and a column vector for a matrix or higher, the full
/// tensor for a vector.
pub fn adafactor_state_elements(dims: &[i64]) -> u64 {
    let d = |x: i64| u64::try_from(x).unwrap_or(0);
    match dims {
        [] => 0,
        [n] => d(*n),
        [lead @ .., rows, cols] => {
            let batch = lead.iter().map(|&x| d(x)).fold(1, u64::saturating_mul);
            batch.saturating_mul(d(*rows).saturating_add(d(*cols)))
        }
    }
}

/// Optimizer state made before the trace: when the first recorded
/// `Optimizer.step` of a `torch.optim` optimizer allocates no persistent
/// state (Adagrad builds it in its constructor; with a profiler schedule
/// the unrecorded steps built it), its state is resident from the start:
/// [`state_tensors_per_parameter`] tensors of each trainable parameter's
/// size (Adafactor: its factored row and column statistics). Scalar step
/// counters stay on the host on a CUDA run and are not counted.
pub(super) fn state_before_trace(
    input: &super::Inputs<'_>,
    warnings: &mut Vec<crate::diag::Warning>,
) -> Vec<super::StateItem> {
    use super::{StateItem, StateKind, StateSource};
    use crate::units::Bytes;
    let facts = input.optimizer;
    let (Some(class), true) = (facts.class_name.as_deref(), facts.n_state_blocks == 0) else {
        return Vec::new();
    };
    if facts.torch_optim == Some(false) || input.parameters.is_empty() {
        return Vec::new();
    }
    let names = input.names;
    // What the step runs in its steady state: the last recorded step (the
    // first may be the one that made the state, e.g. SGD's momentum buffer
    // cloned from the gradient, when the state of a rebuilt deeper job was
    // left to be sized here).
    let Some(step) = input
        .index
        .annotations
        .iter()
        .filter(|a| names.get(a.name).starts_with(super::OPT_STEP_PREFIX))
        .max_by_key(|a| a.start)
    else {
        return Vec::new();
    };
    let spans = &input.index.ops.spans;
    let mut ops = StepOps::default();
    for (idx, o) in spans.iter().enumerate() {
        if o.start < step.start || o.start > step.end {
            continue;
        }
        if o.parent
            .and_then(|p| spans.get(p))
            .is_some_and(|p| p.start >= step.start)
        {
            continue;
        }
        let name = names.get(o.name);
        let Some(source) = input.index.ops.source_in(idx, &input.trace.ops) else {
            continue;
        };
        let args = input.trace.tensor_args(source);
        let n = if name.starts_with("aten::_foreach_") {
            args.iter()
                .filter(|a| a.position == 0 && a.list_index.is_some())
                .count()
        } else {
            usize::from(
                args.iter()
                    .any(|a| a.position == 0 && a.list_index.is_none() && a.dims.len > 0),
            )
        };
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        let base = name
            .strip_prefix("aten::_foreach_")
            .or_else(|| name.strip_prefix("aten::"))
            .unwrap_or(name);
        match base {
            "mul_" => ops.muls += n,
            "lerp_" => ops.lerps += n,
            "maximum" | "maximum_" => ops.maximums += n,
            _ => {}
        }
    }
    let n_params = u32::try_from(input.parameters.len()).unwrap_or(u32::MAX);
    let per_param: Vec<(u64, u32)> = if class == "Adafactor" {
        input
            .parameters
            .iter()
            .map(|p| (adafactor_state_elements(&p.shape).saturating_mul(4), 1))
            .collect()
    } else {
        let Some(k) = state_tensors_per_parameter(class, ops, n_params) else {
            warnings.push(crate::diag::Warning::new(
                "optimizer_state_unknown",
                format!("{class} allocated no state in the first recorded step, and memcast does not know how much state it keeps per parameter: its state made before the trace is not counted"),
            ));
            return Vec::new();
        };
        input
            .parameters
            .iter()
            .map(|p| (p.bytes.get(), k))
            .collect()
    };
    let mut items = Vec::new();
    for (p, &(bytes, k)) in input.parameters.iter().zip(&per_param) {
        for _ in 0..k {
            items.push(StateItem {
                kind: StateKind::OptimizerState,
                trainable: false,
                bytes: Bytes(bytes),
                shape: p.shape.clone(),
                dtype: p.dtype.clone(),
                layer: p.layer,
                source: StateSource::OptimizerClass,
                first_read: None,
                last_read: None,
                block: None,
            });
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factored_state_of_a_hostile_shape_saturates() {
        assert_eq!(
            adafactor_state_elements(&[i64::MAX, i64::MAX, 2, 3]),
            u64::MAX
        );
        assert_eq!(adafactor_state_elements(&[-4, 2, 3]), 0);
        assert_eq!(adafactor_state_elements(&[4, 2, 3]), 4 * (2 + 3));
    }

    #[test]
    fn state_follows_the_optimizer_and_its_step() {
        let none = StepOps::default();
        assert_eq!(state_tensors_per_parameter("SGD", none, 62), Some(0));
        assert_eq!(
            state_tensors_per_parameter("SGD", StepOps { muls: 62, ..none }, 62),
            Some(1)
        );
        assert_eq!(state_tensors_per_parameter("Adam", none, 62), Some(2));
        assert_eq!(
            state_tensors_per_parameter(
                "AdamW",
                StepOps {
                    maximums: 62,
                    ..none
                },
                62
            ),
            Some(3)
        );
        assert_eq!(
            state_tensors_per_parameter("RMSprop", StepOps { muls: 62, ..none }, 62),
            Some(1)
        );
        assert_eq!(
            state_tensors_per_parameter(
                "RMSprop",
                StepOps {
                    muls: 124,
                    lerps: 62,
                    ..none
                },
                62
            ),
            Some(3)
        );
        assert_eq!(state_tensors_per_parameter("Lion", none, 62), None);
        assert_eq!(adafactor_state_elements(&[768, 3072]), 768 + 3072);
        assert_eq!(adafactor_state_elements(&[768]), 768);
    }
}
