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

use crate::analyzer::{Analysis, Block};
use crate::trace::NameId;
use crate::units::Nanos;

/// The module classes with sibling instances, per parent path: the stacks
/// of blocks of a model.
#[derive(Debug, Default)]
pub(super) struct Stacks {
    /// (parent path, class) with two or more instance numbers.
    repeated: BTreeSet<(String, String)>,
    /// The prefix of each layer path whose call holds the tensors made in
    /// it.
    scope: BTreeMap<NameId, String>,
}

/// `Class_k` split into its class and instance number.
fn class_of(component: &str) -> Option<(&str, u32)> {
    let (class, k) = component.rsplit_once('_')?;
    Some((class, k.parse().ok()?))
}

impl Stacks {
    /// The stacks of the module paths the trace's ops ran in.
    pub(super) fn of(analysis: &Analysis) -> Stacks {
        let layers: BTreeSet<NameId> = analysis.ops.iter().filter_map(|o| o.layer).collect();
        let mut instances: BTreeMap<(String, String), BTreeSet<u32>> = BTreeMap::new();
        for &layer in &layers {
            let path = analysis.name(layer);
            let mut parent = String::new();
            for component in path.split('/') {
                if let Some((class, k)) = class_of(component) {
                    instances
                        .entry((parent.clone(), class.to_owned()))
                        .or_default()
                        .insert(k);
                }
                if !parent.is_empty() {
                    parent.push('/');
                }
                parent.push_str(component);
            }
        }
        let repeated = instances
            .into_iter()
            .filter(|(_, ks)| ks.len() >= 2)
            .map(|(key, _)| key)
            .collect();
        let mut stacks = Stacks {
            repeated,
            scope: BTreeMap::new(),
        };
        let transformers = analysis.state.hf_model_type.is_some();
        for layer in layers {
            let path = analysis.name(layer);
            let scope = if transformers {
                stacks.scope_of(path)
            } else {
                path.to_owned()
            };
            stacks.scope.insert(layer, scope);
        }
        stacks
    }

    /// The prefix of `path` up to its outermost block of a stack, or all of
    /// it when no component is one.
    fn scope_of(&self, path: &str) -> String {
        let mut parent = String::new();
        for component in path.split('/') {
            let stacked = class_of(component).is_some_and(|(class, _)| {
                self.repeated.contains(&(parent.clone(), class.to_owned()))
            });
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(component);
            if stacked {
                return parent;
            }
        }
        parent
    }

    /// When the call of the module scope that made `block` returns: the end
    /// of the last forward op, from the one that made it on, that ran inside
    /// that scope before an op outside it. `None` without module frames.
    pub(super) fn call_end(&self, analysis: &Analysis, block: &Block) -> Option<Nanos> {
        let scope = self.scope.get(&block.layer?)?;
        let inside = |layer: Option<NameId>| {
            layer.is_some_and(|l| {
                let path = analysis.name(l);
                path.strip_prefix(scope.as_str())
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
