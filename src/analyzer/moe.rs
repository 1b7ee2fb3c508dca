//! Mixture-of-experts layers: their experts, the traced routing, and how
//! much the routing can move memory.
//!
//! Hugging Face models from transformers 5 fuse a layer's experts into one
//! module (`MixtralExperts`, …) holding 3-D weights `[experts, out, in]`,
//! and run them one of two ways (`integrations/moe.py`):
//! - `grouped_mm` (the default): the routed rows, sorted by expert, go
//!   through `aten::_grouped_mm`, which loops over the experts in C++, one
//!   `aten::mm` child per expert whose rows are that expert's tokens (zero
//!   for an idle expert). Every allocation is sized by the tokens, the
//!   routed rows (tokens × top-k) and the expert count — never by one
//!   expert's share — so the memory does not depend on the routing.
//! - `eager`: a Python loop over the experts that received tokens, each
//!   selecting its slice of the 3-D weights (`aten::select`, index in
//!   `Concrete Inputs`) and running `mm`s on its own rows: every block of
//!   that expert's step is sized by its share.
//!
//! The routing is data: the estimate holds for the traced one. For the
//! eager loop the worst routing the shapes allow sends every token to one
//! expert (a token's top-k experts are distinct, so no expert gets more
//! rows than there are tokens); [`Moe::worst_routing_extra_bytes`] is what
//! the largest expert step would then add: its bytes per row (its blocks
//! over its rows) times the rows it did not get.

use serde::{Deserialize, Serialize};

use super::lifecycle::Life;
use super::spans::SpanIndex;
use super::Names;
use crate::diag::Warning;
use crate::trace::{Dtype, Trace};
use crate::units::{Bytes, Nanos};

/// The most experts a layer is read with (DeepSeek-V3 routes among 256; a
/// count past this comes from a corrupt shape).
const MAX_EXPERTS: u64 = 1 << 16;

/// The traced routing of one MoE layer (its first call).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRouting {
    /// The experts module's path.
    pub layer: String,
    /// Tokens routed in that call (the router's rows), if seen.
    pub tokens: Option<u64>,
    /// Rows each expert received, by expert index.
    pub tokens_per_expert: Vec<u64>,
}

/// What the trace shows of a mixture-of-experts model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moe {
    /// `grouped_mm` or `eager`.
    pub implementation: String,
    /// MoE layers (experts modules) and experts in each.
    pub layers: u32,
    pub experts: u32,
    /// Experts per token: routed rows over tokens, when both are seen.
    pub top_k: Option<u32>,
    /// Each layer's first call.
    pub routing: Vec<LayerRouting>,
    /// Whether no allocation depends on how tokens are routed.
    pub routing_invariant: bool,
    /// For a routing-dependent run: what the worst routing could add to
    /// the live memory of the traced one (see the module docs).
    pub worst_routing_extra_bytes: Bytes,
    /// One expert's weights in one layer (its slice of the layer's 3-D
    /// parameters; set from the resident state).
    #[serde(default)]
    pub expert_parameter_bytes: Bytes,
}

/// One experts-module call: its layer, ops and per-expert rows.
struct ExpertsCall {
    layer: super::NameId,
    start: Nanos,
    tokens: Option<u64>,
    /// (expert, rows, step start) in call order.
    steps: Vec<(u64, u64, Nanos)>,
    end: Nanos,
}

/// Finds the MoE layers (`None` for a dense model).
pub(crate) fn find(trace: &Trace, index: &SpanIndex, names: &Names, life: &Life) -> Option<Moe> {
    let spans = &index.ops.spans;
    let dims_at = |idx: usize, pos: u16| -> Option<Vec<i64>> {
        index
            .tensor_arg(trace, idx, pos)
            .map(|a| trace.numbers(a.dims).to_vec())
    };
    let floating_at = |idx: usize, pos: u16| {
        index
            .tensor_arg(trace, idx, pos)
            .and_then(|a| a.dtype)
            .and_then(|d| Dtype::from_name(trace.name(d)))
            .is_some_and(|d| d.size().is_some())
    };
    let concrete_at = |idx: usize, pos: u16| -> Option<i64> {
        let op = index.ops.source_in(idx, &trace.ops)?;
        let c = trace.concrete_args(op).iter().find(|c| c.position == pos)?;
        trace.numbers(c.values).first().copied()
    };
    let rows = |d: &[i64]| d.first().map_or(0, |&r| r.max(0) as u64);
    let mut experts = 0_u64;
    let mut grouped = false;
    let mut calls: Vec<ExpertsCall> = Vec::new();
    let mut last_topk: Option<(u64, u64)> = None; // (rows, experts)
    let mut open: Option<usize> = None; // the call being filled
    for (idx, span) in spans.iter().enumerate() {
        let name = names.get(span.name);
        if name == "aten::topk" && span.parent.is_none() {
            if let Some(d) = dims_at(idx, 0) {
                let e = d.last().map_or(0, |&x| x.max(0) as u64);
                let numel = d
                    .iter()
                    .map(|&x| x.max(0).unsigned_abs())
                    .fold(1, u64::saturating_mul);
                last_topk = numel.checked_div(e).map(|t| (t, e));
            }
            continue;
        }
        let Some(layer) = span.layer else { continue };
        // grouped_mm: one `mm` child per expert, in expert order
        let weight3 = |pos| dims_at(idx, pos).filter(|d| d.len() == 3);
        let step = if name == "aten::_grouped_mm" {
            let Some(w) = weight3(1) else { continue };
            grouped = true;
            experts = experts.max(rows(&w));
            let children: Vec<(usize, u64)> = spans
                .iter()
                .enumerate()
                .skip(idx + 1)
                .take_while(|(_, c)| c.tid == span.tid && c.start <= span.end)
                .filter(|(_, c)| c.parent == Some(idx) && names.get(c.name) == "aten::mm")
                .filter_map(|(j, _)| Some((j, rows(&dims_at(j, 0)?))))
                .collect();
            Some(
                children
                    .into_iter()
                    .enumerate()
                    .map(|(e, (_, n))| (e as u64, n, span.start))
                    .collect::<Vec<_>>(),
            )
        } else if name == "aten::select" && span.parent.is_none() {
            // eager: an expert's slice of a 3-D weight, then its rows
            let Some(w) = weight3(0).filter(|_| floating_at(idx, 0)) else {
                continue;
            };
            let (Some(0), Some(e)) = (concrete_at(idx, 1), concrete_at(idx, 2)) else {
                continue;
            };
            experts = experts.max(rows(&w));
            let n = spans
                .iter()
                .enumerate()
                .skip(idx + 1)
                .take_while(|(_, c)| c.tid == span.tid && c.layer == Some(layer))
                .find(|(_, c)| matches!(names.get(c.name), "aten::mm" | "aten::linear"))
                .and_then(|(j, _)| dims_at(j, 0))
                .map(|d| {
                    d.iter()
                        .rev()
                        .skip(1)
                        .map(|&x| x.max(0).unsigned_abs())
                        .fold(1, u64::saturating_mul)
                });
            n.map(|n| vec![(e.max(0) as u64, n, span.start)])
        } else {
            None
        };
        let Some(step) = step else { continue };
        let frame_start = index
            .frames
            .innermost(span.tid, span.start)
            .and_then(|f| {
                index.frames.chain(f).find(|&i| {
                    index.frames.spans.get(i).is_some_and(|fr| {
                        fr.layer == Some(layer) && names.get(fr.name).starts_with("nn.Module: ")
                    })
                })
            })
            .and_then(|f| index.frames.spans.get(f))
            .map(|f| (f.start, f.end));
        let (start, end) = frame_start.unwrap_or((span.start, span.end));
        let same = open
            .and_then(|c| calls.get(c))
            .is_some_and(|c| c.layer == layer && c.start == start);
        if !same {
            calls.push(ExpertsCall {
                layer,
                start,
                tokens: last_topk.filter(|&(_, e)| e == experts).map(|(t, _)| t),
                steps: Vec::new(),
                end,
            });
            open = Some(calls.len() - 1);
        }
        if let Some(c) = open.and_then(|c| calls.get_mut(c)) {
            for s in step {
                if !c.steps.iter().any(|x| x.0 == s.0) || grouped {
                    c.steps.push(s);
                }
            }
        }
    }
    // More experts than any model has is a corrupt shape, not a MoE: the
    // per-expert tables below are as long as the count.
    if calls.is_empty() || !(2..=MAX_EXPERTS).contains(&experts) {
        return None;
    }
    // A grouped_mm layer runs two or three grouped products (up, down):
    // each expert's rows are those of its first one.
    let per_expert = |c: &ExpertsCall| -> Vec<u64> {
        let mut v = vec![0_u64; experts as usize];
        let mut seen = vec![false; experts as usize];
        for &(e, n, _) in &c.steps {
            if let (Some(slot), Some(s)) = (v.get_mut(e as usize), seen.get_mut(e as usize)) {
                if !*s {
                    *slot = n;
                    *s = true;
                }
            }
        }
        v
    };
    let mut layers: Vec<super::NameId> = Vec::new();
    let mut routing = Vec::new();
    for c in &calls {
        if !layers.contains(&c.layer) {
            layers.push(c.layer);
            routing.push(LayerRouting {
                layer: names.get(c.layer).to_owned(),
                tokens: c.tokens,
                tokens_per_expert: per_expert(c),
            });
        }
    }
    let top_k = routing.iter().find_map(|r| {
        let routed = r
            .tokens_per_expert
            .iter()
            .fold(0_u64, |s, &n| s.saturating_add(n));
        let t = r.tokens.filter(|&t| t > 0)?;
        (routed % t == 0)
            .then(|| u32::try_from(routed / t).ok())
            .flatten()
    });
    let worst = if grouped {
        0
    } else {
        calls
            .iter()
            .filter_map(|c| {
                let t = c.tokens?;
                let mut worst = 0_u64;
                for (i, &(_, n, from)) in c.steps.iter().enumerate() {
                    let to = c.steps.get(i + 1).map_or(c.end, |s| s.2);
                    let bytes = life
                        .blocks
                        .iter()
                        .filter(|b| b.alloc_ts >= from && b.alloc_ts < to)
                        .map(|b| b.size.get())
                        .fold(0, u64::saturating_add);
                    if n > 0 && t > n {
                        worst = worst.max((bytes / n).saturating_mul(t - n));
                    }
                }
                Some(worst)
            })
            .max()
            .unwrap_or(0)
    };
    Some(Moe {
        implementation: if grouped { "grouped_mm" } else { "eager" }.to_owned(),
        layers: u32::try_from(layers.len()).unwrap_or(u32::MAX),
        experts: u32::try_from(experts).unwrap_or(u32::MAX),
        top_k,
        routing,
        routing_invariant: grouped,
        worst_routing_extra_bytes: Bytes(worst),
        expert_parameter_bytes: Bytes::ZERO,
    })
}

/// One expert's weights in one layer: the 3-D parameters the experts
/// modules read, over experts and layers.
pub(crate) fn set_expert_bytes(moe: &mut Moe, state: &super::resident::ModelState, names: &Names) {
    let experts = i64::from(moe.experts);
    let total: u64 = state
        .of(super::resident::StateKind::Parameter)
        .filter(|p| p.shape.len() == 3 && p.shape.first() == Some(&experts))
        .filter(|p| {
            p.layer
                .is_some_and(|l| moe.routing.iter().any(|r| r.layer == names.get(l)))
        })
        .map(|p| p.bytes.get())
        .fold(0, u64::saturating_add);
    let per = u64::from(moe.experts) * u64::from(moe.layers);
    moe.expert_parameter_bytes = Bytes(total.checked_div(per).unwrap_or(0));
}

/// What the estimate assumes of the routing, and the bound.
pub(crate) fn routing_warning(moe: &Moe) -> Warning {
    let shares = moe
        .routing
        .first()
        .map(|r| {
            let list: Vec<String> = r.tokens_per_expert.iter().map(u64::to_string).collect();
            format!(" (the first layer's experts got {} rows)", list.join(", "))
        })
        .unwrap_or_default();
    let bound = if moe.routing_invariant {
        "its experts run as one grouped matrix product, whose allocations are sized by the tokens, the routed rows and the expert count, never by one expert's share, so every routing needs the same memory".to_owned()
    } else {
        format!(
            "its experts run one after another, each on its own rows, so memory follows the routing: if one expert received every token, the live memory could grow by up to {} bytes (that expert's bytes per row times the rows it did not get)",
            moe.worst_routing_extra_bytes.get()
        )
    };
    Warning::new(
        "moe_routing",
        format!(
            "a mixture-of-experts model: {} layers of {} experts{}, {} bytes of weights per expert per layer; the estimate holds for the traced routing{shares}; {bound}",
            moe.layers,
            moe.experts,
            moe.top_k.map(|k| format!(", {k} per token")).unwrap_or_default(),
            moe.expert_parameter_bytes.get(),
        ),
    )
}
