//! Where the model's Python code lets go of a tensor that autograd no longer
//! keeps: a guess from the module frames, for rule `autocast_input_casts`.
//!
//! A tensor lives while anything refers to it: autograd's saved tensors, or
//! a Python variable. In a frame, a variable lives until it is rebound or
//! the frame returns; a value returned goes on living in the caller's
//! variables (`attention_output, _ = self.attention(...)` keeps the second
//! value until the caller returns). On the CPU trace these references are
//! hidden behind autograd's when autograd kept the tensor for backward:
//! its CPU lifetime ends in backward. Under CUDA autocast the reader may
//! keep a cast copy instead, and the tensor then dies when its last Python
//! reference does, which no trace records.
//!
//! Which frame holds it is the code's choice, so this is a guess, made
//! from one convention:
//! - a model of Hugging Face transformers (its `transformers/models/`
//!   frames): its attention modules return their weights beside their
//!   output, and the decoder or encoder layer binds them
//!   (`hidden_states, _ = self.self_attn(...)` in `modeling_llama.py` and
//!   the models copied from it), so a tensor lives until the call of the
//!   block of the model's stack that made it returns (the outermost module
//!   whose class has sibling instances under its parent: `BertLayer_1`
//!   under `BertEncoder_0`). On an H200 (torch 2.11, transformers' BERT
//!   with eager attention under bf16 autocast) the fp32 attention
//!   probabilities after dropout die when their `BertLayer` returns
//!   (`tests/data/gpu-h200/bertL_bf16_bs4_seq512_L2.cuda.json.gz`), not
//!   when the matrix product that reads them does;
//! - any other model: until the module that made it returns, its locals
//!   gone (the CS336 models' softmax probabilities die with their attention
//!   module's call, `benches/scale/gpu_pairs.py`).

use std::collections::{BTreeMap, BTreeSet};

use super::super::setup::module_class;
use crate::analyzer::{Analysis, Block};
use crate::trace::NameId;
use crate::units::Nanos;

/// The scope whose call holds the tensors made in each module path: in a
/// transformers model, the path up to its block of the model's stack (the
/// outermost module whose class has sibling instances under its parent);
/// elsewhere (no entry) the path itself.
#[derive(Debug, Default)]
pub(super) struct Stacks {
    scope: BTreeMap<NameId, String>,
}

impl Stacks {
    /// The scopes of the module paths the trace's ops ran in.
    pub(super) fn of(analysis: &Analysis) -> Stacks {
        if analysis.state.hf_model_type.is_none() {
            return Stacks::default();
        }
        let layers: BTreeSet<NameId> = analysis.ops.iter().filter_map(|o| o.layer).collect();
        // Each component's instances (`Class_k`), per parent path and class.
        let mut instances: BTreeMap<(String, &str), BTreeSet<&str>> = BTreeMap::new();
        for &layer in &layers {
            let mut parent = String::new();
            for component in analysis.name(layer).split('/') {
                instances
                    .entry((parent.clone(), module_class(component)))
                    .or_default()
                    .insert(component);
                push_component(&mut parent, component);
            }
        }
        let stacked = |parent: &str, component: &str| {
            instances
                .get(&(parent.to_owned(), module_class(component)))
                .is_some_and(|ks| ks.len() >= 2)
        };
        let scope = layers
            .iter()
            .map(|&layer| {
                let mut prefix = String::new();
                for component in analysis.name(layer).split('/') {
                    let outermost = stacked(&prefix, component);
                    push_component(&mut prefix, component);
                    if outermost {
                        break;
                    }
                }
                (layer, prefix)
            })
            .collect();
        Stacks { scope }
    }

    /// When the call of the module scope that made `block` returns: the end
    /// of the last forward op, from the one that made it on, that ran inside
    /// that scope before an op outside it. `None` without module frames.
    pub(super) fn call_end(&self, analysis: &Analysis, block: &Block) -> Option<Nanos> {
        let layer = block.layer?;
        let scope = self
            .scope
            .get(&layer)
            .map_or_else(|| analysis.name(layer), String::as_str);
        let inside = |layer: Option<NameId>| {
            layer.is_some_and(|l| {
                let path = analysis.name(l);
                path.strip_prefix(scope)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            })
        };
        let first = block.alloc_op?;
        let top = analysis.ops.get(super::top_of(analysis, Some(first))?)?;
        let tid = top.tid;
        let mut end = inside(top.layer).then_some(top.end);
        for op in analysis
            .ops
            .get(first..)?
            .iter()
            .take_while(|o| o.tid == tid)
        {
            if op.parent.is_some() {
                continue;
            }
            // A backward op carries its forward op's module path.
            if op.backward || !inside(op.layer) {
                break;
            }
            end = Some(end.map_or(op.end, |e: Nanos| e.max(op.end)));
        }
        end
    }
}

/// `path` with `component` appended as its last module.
fn push_component(path: &mut String, component: &str) {
    if !path.is_empty() {
        path.push('/');
    }
    path.push_str(component);
}
