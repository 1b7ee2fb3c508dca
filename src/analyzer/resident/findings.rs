//! What the resident state's findings say: the run kind, the totals, the
//! tie decision and the warnings that tell how sure each finding is.

use super::ties::{Tie, TieEvidence};
use super::{ModelState, RunKind, StateItem, StateKind, StateSource, StateTotals, TieFinding};
use crate::diag::Warning;
use crate::trace::NameId;
use crate::units::Bytes;
use crate::units::Nanos;
use std::collections::BTreeMap;

pub(super) fn tie_finding(tie: &Tie, hf_model_type: Option<&str>) -> TieFinding {
    let why = match &tie.evidence {
        TieEvidence::Gradients(g) => format!("training ran AccumulateGrad {g} time(s) for it"),
        TieEvidence::HuggingFace { model_type, tied } => format!(
            "Hugging Face {model_type} {} its input and output embeddings by default",
            if *tied { "ties" } else { "does not tie" }
        ),
        TieEvidence::NoFrames => {
            "without module frames the reads cannot be told apart, so it was counted once"
                .to_owned()
        }
        TieEvidence::Separate => match hf_model_type {
            Some(t) => format!("{t}: counted separately"),
            None => "not a Hugging Face model: each module's weight was counted".to_owned(),
        },
    };
    TieFinding {
        shape: tie.dims.clone(),
        bytes_each: Bytes(tie.bytes_each),
        reads: tie.reads,
        kept: tie.kept,
        exact: matches!(tie.evidence, TieEvidence::Gradients(_)),
        why,
    }
}

/// The warnings that say what was inferred and how sure it is.
pub(super) fn state_warnings(state: &ModelState, warnings: &mut Vec<Warning>) {
    let t = &state.totals;
    if !state.has_shapes && t.n_trainable > 0 {
        warnings.push(Warning::new(
            "parameters_from_gradients",
            format!(
                "the trace has no shapes (it was recorded without record_shapes): {} trainable parameters ({} bytes) were sized from their gradient blocks; parameters that get no gradient (frozen ones, or all of them in a forward-only run) leave no trace without shapes and are not counted: give the parameter bytes yourself if the model has any",
                t.n_trainable,
                t.trainable.get()
            ),
        ));
    }
    if !state.has_module_frames && t.n_parameters > 0 {
        warnings.push(Warning::new(
            "parameters_without_modules",
            "the trace has no module frames (it was recorded without with_stack): weights were found from the known layer ops only (linear, convolution, embedding, norms), parameters read by other ops (custom layers, RMSNorm weights) are missed, and a module called twice in an iteration is counted twice",
        ));
    }
    if let Some(tie) = &state.tie {
        if !tie.exact && tie.reads > 1 {
            warnings.push(Warning::new(
                "tied_weights_guessed",
                format!(
                    "{} modules read a {:?} weight of the input embedding's shape ({} bytes each); {}: counted {} time(s). A trace cannot show whether weights are tied: if this is wrong, give the parameter bytes yourself",
                    tie.reads,
                    tie.shape,
                    tie.bytes_each.get(),
                    tie.why,
                    tie.kept
                ),
            ));
        }
    }
    if t.activations_before_trace > Bytes::ZERO {
        warnings.push(Warning::new(
            "activations_before_trace",
            format!(
                "{} bytes of activations made before the trace (an earlier batch, a KV cache) are read by the forward pass: they are allocated before the first iteration and freed after their last read",
                t.activations_before_trace.get()
            ),
        ));
    }
    if state.distributed {
        warnings.push(Warning::new(
            "distributed_one_rank",
            format!(
                "a DistributedDataParallel run: this is the estimate of one rank (the one traced); {} bytes of gradient buckets made when the model was wrapped are resident from the start",
                t.buckets.get()
            ),
        ));
    }
}

/// The run's kind: backward passes train; without them, autograd sequence
/// numbers on the forward ops mean autograd was on.
pub(super) fn run_kind(backward: bool, autograd_on: bool, items: &[StateItem]) -> RunKind {
    let frozen = items
        .iter()
        .any(|i| i.kind == StateKind::Parameter && !i.trainable);
    match (backward, autograd_on) {
        (true, _) if frozen => RunKind::FineTuning,
        (true, _) => RunKind::Training,
        (false, true) => RunKind::ForwardWithAutograd,
        (false, false) => RunKind::Inference,
    }
}

pub(super) fn totals(items: &[StateItem]) -> StateTotals {
    let mut t = StateTotals::default();
    for i in items {
        match i.kind {
            StateKind::Parameter => {
                t.n_parameters += 1;
                t.parameters += i.bytes;
                if i.dtype.as_deref().is_some_and(is_integer_dtype) {
                    t.quantized += i.bytes;
                }
                if i.trainable {
                    t.n_trainable += 1;
                    t.trainable += i.bytes;
                } else {
                    t.frozen += i.bytes;
                }
            }
            StateKind::Buffer => t.buffers += i.bytes,
            StateKind::Activation => t.activations_before_trace += i.bytes,
            StateKind::OptimizerState => t.optimizer_state_before_trace += i.bytes,
            StateKind::Bucket => t.buckets += i.bytes,
            StateKind::QuantState => t.quant_state += i.bytes,
        }
    }
    t
}

/// An integer `Input type` (a quantized weight's storage).
fn is_integer_dtype(dtype: &str) -> bool {
    matches!(
        dtype,
        "signed char"
            | "unsigned char"
            | "short int"
            | "int"
            | "long int"
            | "c10::Float8_e4m3fn"
            | "c10::Float8_e5m2"
    )
}

/// The NF4/FP4 code table of each 4-bit layer. bitsandbytes keeps the 16
/// values a 4-bit weight decodes to in its `QuantState.code` (float32,
/// made per weight by `get_4bit_type` when it quantizes, or loaded per
/// weight from the checkpoint's `quant_map`), but its 4-bit kernels take
/// the quantisation type by name, so no op reads the table. One is added
/// per layer whose 4-bit quantisation state the kernels read.
pub(super) fn four_bit_code_tables(items: &[StateItem]) -> Vec<StateItem> {
    const FOUR_BIT_OPS: &[&str] = &[
        "bitsandbytes::gemm_4bit",
        "bitsandbytes::dequantize_4bit",
        "bitsandbytes::dequantize_blockwise",
    ];
    const VALUES: i64 = 16;
    let mut tables: BTreeMap<NameId, Option<Nanos>> = BTreeMap::new();
    for i in items.iter().filter(|i| i.kind == StateKind::QuantState) {
        let four_bit = matches!(&i.source, StateSource::OpArgument { op, .. } if FOUR_BIT_OPS.contains(&op.as_str()));
        if let (true, Some(layer)) = (four_bit, i.layer) {
            let first = tables.entry(layer).or_insert(i.first_read);
            *first = (*first).min(i.first_read);
        }
    }
    tables
        .into_iter()
        .map(|(layer, first_read)| StateItem {
            kind: StateKind::QuantState,
            trainable: false,
            bytes: Bytes(VALUES as u64 * 4),
            shape: vec![VALUES],
            dtype: Some("float".to_owned()),
            layer: Some(layer),
            source: StateSource::FourBitCodeTable,
            first_read,
            last_read: first_read,
            block: None,
        })
        .collect()
}
