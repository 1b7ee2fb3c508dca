//! `--new-tokens N`: the trace of a `generate()` run that makes N new tokens,
//! rebuilt from a trace of fewer.
//!
//! The rule, from how Hugging Face's `generate` runs: one call of the model
//! for the prompt, then one per new token, each call the same ops on one
//! more cached position than the call before. So the last call (the
//! *template*) is copied `N - n` times just before itself, and every
//! allocation of a copy takes the size its step would have: the size it has
//! in the call before the template plus, per step, what it grew by from
//! that call to the template (the KV cache `torch.cat` makes one position
//! larger, the attention scores one key longer; what does not grow keeps its
//! size). The template becomes the last step, grown likewise. A tensor a
//! call makes and the next call frees (a `DynamicCache` layer's keys and
//! values, replaced by the next `torch.cat`) is chained through the copies;
//! one a call makes that outlives the next call's start (the logits
//! `generate` reads) is freed in each copy when the next copy ends; one made
//! and freed inside the call is each copy's own. The copies' ops and the
//! grown template's keep their names and times but not their argument
//! shapes (recorded for the traced step, they no longer fit the grown sizes;
//! the other calls still show every weight the model reads).
//!
//! Refused with the reason: a trace with no generation of at least three
//! calls (the growth per step needs two decode steps), generations of
//! different lengths in one trace, a last call whose events do not match the
//! call before it one for one, an allocation that shrinks from one step to
//! the next, and fewer tokens than traced.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::copy::{self, Copies, Extra, Place, Repeat, Seg, When};
use super::events::pair;
use super::frames::module_frames;
use super::ScaleError;
use crate::trace::Trace;

/// What `--new-tokens` rebuilt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenFacts {
    /// Calls of the model per generation in the trace (new tokens made).
    pub traced: u32,
    /// New tokens estimated.
    pub estimated: u32,
    /// Generations rebuilt (one per profiled iteration).
    pub generations: u32,
    /// Allocations of the last call that grow with each step.
    pub growing: u32,
    /// StaticCache blocks made for the longer generation.
    #[serde(default)]
    pub static_cache: u32,
}

/// One generation's last call and the call before it.
#[derive(Clone)]
pub(super) struct Gen {
    pub(super) template: (i64, i64),
    pred: (i64, i64),
    /// The first call (the prompt's).
    prefill: (i64, i64),
}

/// The rebuilt trace and what was done; `gens`: the trace's
/// [`generations`] where they were found already.
pub(super) fn extend(
    trace: &Trace,
    gens: Option<&[(Gen, u32)]>,
    new_tokens: u32,
) -> Result<(Trace, TokenFacts), ScaleError> {
    let found;
    let gens = match gens {
        Some(gens) => gens,
        None => {
            found = generations(trace)?;
            &found
        }
    };
    let traced = gens.first().map_or(0, |g| g.1);
    if new_tokens < traced {
        return Err(ScaleError::FewerTokens {
            traced,
            asked: new_tokens,
        });
    }
    let mut facts = TokenFacts {
        traced,
        estimated: new_tokens,
        generations: u32::try_from(gens.len()).unwrap_or(u32::MAX),
        growing: 0,
        static_cache: 0,
    };
    if new_tokens == traced {
        return Ok((trace.clone(), facts));
    }
    let plan = plan(trace, gens, new_tokens - traced, &mut facts)?;
    Ok((copy::apply(trace, &plan), facts))
}

/// The copies of each generation's last step, and every address and size
/// in them: see the module docs. One function because the links of a step
/// (made and freed inside it, chained from the step before, outliving it)
/// and its growth are decided together, position by position.
fn plan(
    trace: &Trace,
    gens: &[(Gen, u32)],
    copies: u32,
    facts: &mut TokenFacts,
) -> Result<Copies, ScaleError> {
    let k = i64::from(copies);
    let traced = facts.traced;
    let mut plan = Copies::new(trace, copies);
    let ts: Vec<i64> = trace.memory.iter().map(|m| m.ts.get()).collect();
    let within = |(s, e): (i64, i64)| -> Vec<usize> {
        (ts.partition_point(|&x| x < s)..ts.partition_point(|&x| x <= e)).collect()
    };
    let partner = pair(&trace.memory);
    // Each free's allocation (the reverse of `partner`).
    let made_of: FxHashMap<usize, usize> = partner
        .iter()
        .enumerate()
        .filter_map(|(a, f)| f.map(|f| (f, a)))
        .collect();
    let size = |i: usize| trace.memory.get(i).map_or(0, |m| m.bytes);
    // Generations whose StaticCache grew: (from, to, traced positions).
    let mut reshaped: Vec<(i64, i64, i64)> = Vec::new();
    for (g, _) in gens {
        let (t_ev, p_ev) = (within(g.template), within(g.pred));
        let same = t_ev.len() == p_ev.len()
            && t_ev
                .iter()
                .zip(&p_ev)
                .all(|(&a, &b)| (size(a) > 0) == (size(b) > 0));
        if !same {
            return Err(ScaleError::StepsDiffer(format!(
                "its last call has {} memory events and the call before it {}",
                t_ev.len(),
                p_ev.len()
            )));
        }
        let pos_t: FxHashMap<usize, usize> =
            t_ev.iter().enumerate().map(|(i, &e)| (e, i)).collect();
        let pos_p: FxHashMap<usize, usize> =
            p_ev.iter().enumerate().map(|(i, &e)| (e, i)).collect();
        // Growth per step of each position's allocation.
        let mut delta = vec![0i64; t_ev.len()];
        for (i, (&a, &b)) in t_ev.iter().zip(&p_ev).enumerate() {
            if size(a) > 0 {
                let d = size(a) - size(b);
                if d < 0 {
                    return Err(ScaleError::StepsDiffer(format!(
                        "an allocation of {} bytes in the call before the last is {} bytes in the last",
                        size(b),
                        size(a)
                    )));
                }
                if let Some(slot) = delta.get_mut(i) {
                    *slot = d;
                }
                facts.growing += u32::from(d > 0);
            }
        }
        // The size an allocation at position i has in copy c (0: the
        // template, made the last step).
        let grown = |i: usize, c: i64| -> i64 {
            let base = p_ev.get(i).map_or(0, |&b| size(b));
            let steps = if c == 0 { k + 1 } else { c };
            base.saturating_add(delta.get(i).copied().unwrap_or(0).saturating_mul(steps))
        };
        let r = plan.repeats.len();
        plan.repeats.push(Repeat {
            seg: Seg {
                start: g.template.0,
                end: g.template.1,
            },
            place: Place::BeforeInOrder,
            stack: None,
            events: t_ev.clone(),
        });
        let at = |i: usize| t_ev.get(i).copied().unwrap_or(usize::MAX);
        // Addresses per (position, copy); the template keeps its own.
        let mut addr: BTreeMap<(usize, u32), u64> = BTreeMap::new();
        for (i, &a) in t_ev.iter().enumerate() {
            if size(a) <= 0 {
                continue;
            }
            let f = partner.get(a).copied().flatten();
            match f.and_then(|f| pos_t.get(&f)) {
                Some(&j) => {
                    // made and freed inside the call: each copy its own
                    for c in 1..=copies {
                        let x = plan.fresh();
                        addr.insert((i, c), x);
                        addr.insert((j, c), x);
                    }
                }
                None => {
                    for c in 1..=copies {
                        let x = plan.fresh();
                        addr.insert((i, c), x);
                    }
                    // outlives the call: freed when the next copy ends,
                    // unless the next call frees it (the chain below)
                    let chained = p_ev
                        .get(i)
                        .and_then(|&b| partner.get(b).copied().flatten())
                        .is_some_and(|pf| pos_t.contains_key(&pf));
                    if f.is_some() && !chained {
                        for c in 1..=copies {
                            let Some(&x) = addr.get(&(i, c)) else {
                                continue;
                            };
                            plan.extra.push(Extra {
                                when: When::In {
                                    repeat: r,
                                    copy: if c == copies { 0 } else { c + 1 },
                                    ts: g.template.1,
                                },
                                like: a,
                                addr: x,
                                bytes: -grown(i, i64::from(c)),
                            });
                        }
                    }
                }
            }
        }
        // Chains: what the call before frees in the next call.
        for (i, &b) in p_ev.iter().enumerate() {
            if size(b) <= 0 {
                continue;
            }
            let Some(&j) = partner
                .get(b)
                .copied()
                .flatten()
                .and_then(|pf| pos_t.get(&pf))
            else {
                continue;
            };
            let original = trace.memory.get(b).map_or(0, |m| m.addr);
            for c in 1..=copies {
                let prev = if c == 1 {
                    original
                } else {
                    addr.get(&(i, c - 1)).copied().unwrap_or(original)
                };
                addr.insert((j, c), prev);
            }
            if let Some(&last) = addr.get(&(i, copies)) {
                addr.insert((j, 0), last);
                // The template frees the last copy's block of the chain.
                plan.bytes.insert((at(j), 0), -grown(i, k));
            }
        }
        for (&(i, c), &x) in &addr {
            plan.addr.insert((at(i), c), Some(x));
        }
        // The template, grown to the last step, and the frees of what it
        // made; the copies' sizes.
        for (i, &a) in t_ev.iter().enumerate() {
            if size(a) <= 0 {
                continue;
            }
            plan.bytes.insert((a, 0), grown(i, 0));
            if let Some(f) = partner.get(a).copied().flatten() {
                plan.bytes.insert((f, 0), -grown(i, 0));
            }
        }
        for c in 1..=copies {
            for (i, &e) in t_ev.iter().enumerate() {
                if !addr.contains_key(&(i, c)) {
                    continue;
                }
                let bytes = if size(e) > 0 {
                    grown(i, i64::from(c))
                } else {
                    // the size of the block it frees
                    let made = made_of
                        .get(&e)
                        .and_then(|&a| {
                            pos_t
                                .get(&a)
                                .map(|&ai| grown(ai, i64::from(c)))
                                .or_else(|| {
                                    pos_p.get(&a).map(|&bi| {
                                        if c == 1 {
                                            size(a)
                                        } else {
                                            grown(bi, i64::from(c) - 1)
                                        }
                                    })
                                })
                        })
                        .unwrap_or(-size(e));
                    -made
                };
                plan.bytes.insert((e, c), bytes);
            }
        }
        // A StaticCache is made once, in the prompt's call, for every
        // position of the generation: it grows by k positions.
        let (blocks, positions) = static_cache(trace, g, traced, k, &partner);
        if let (false, Some(p)) = (blocks.is_empty(), positions) {
            reshaped.push((g.prefill.0, g.template.1, p));
        }
        for (a, bytes) in blocks {
            for e in std::iter::once(a).chain(partner.get(a).copied().flatten()) {
                let own = plan.bytes.get(&(e, 0)).copied().unwrap_or(size(e));
                plan.bytes
                    .insert((e, 0), if own > 0 { bytes } else { -bytes });
            }
            facts.static_cache += 1;
        }
    }
    // Ops of a step (the copied ones and the grown template's) and ops
    // reading a grown StaticCache or a view of it (a 4-d [batch, heads,
    // positions or prompt, head dim] argument: the attention's; weights
    // are never 4-d here) lose their recorded shapes: they no longer fit
    // (the other calls still show every weight the model reads).
    let in_template = |s: i64| {
        gens.iter()
            .any(|(g, _)| g.template.0 <= s && s <= g.template.1)
    };
    for (i, o) in trace.ops.iter().enumerate() {
        let s = o.start.get();
        let reads_cache = reshaped.iter().any(|&(a, b, p)| {
            let prompt = p - i64::from(traced) + 1;
            a <= s
                && s <= b
                && trace.tensor_args(o).iter().any(|t| {
                    let d = trace.numbers(t.dims);
                    let positions = d.len().checked_sub(2).and_then(|i| d.get(i));
                    d.len() >= 4 && (positions == Some(&p) || positions == Some(&prompt))
                })
        });
        if in_template(s) || reads_cache {
            plan.shapeless.insert(i);
        }
    }
    Ok(plan)
}

/// The StaticCache blocks of generation `g` (made by `aten::zeros` in its
/// first call and kept past it) with their size for `k` more positions:
/// the cache holds `prompt + n - 1` positions for `n` calls, so each grows
/// by `k / (prompt + n - 1)` of its size (when it divides evenly).
#[allow(clippy::type_complexity)]
fn static_cache(
    trace: &Trace,
    g: &Gen,
    n: u32,
    k: i64,
    partner: &[Option<usize>],
) -> (Vec<(usize, i64)>, Option<i64>) {
    let (s, e) = g.prefill;
    let zeros: Vec<(i64, i64)> = trace
        .ops
        .iter()
        .filter(|o| s <= o.start.get() && o.start.get() <= e && trace.name(o.name) == "aten::zeros")
        .map(|o| (o.start.get(), o.start.get() + o.dur.get()))
        .collect();
    if zeros.is_empty() {
        return (Vec::new(), None);
    }
    let prompt = super::shape::embedding_ids_dims(trace, s, e).and_then(|d| d.last().copied());
    let Some(positions) = prompt.map(|p| p + i64::from(n) - 1).filter(|&p| p > 0) else {
        return (Vec::new(), None);
    };
    let blocks = trace
        .memory
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m.bytes > 0
                && zeros
                    .iter()
                    .any(|&(a, b)| a <= m.ts.get() && m.ts.get() <= b)
        })
        .filter(|(i, _)| {
            partner
                .get(*i)
                .copied()
                .flatten()
                .and_then(|f| trace.memory.get(f))
                .is_none_or(|f| f.ts.get() > e)
        })
        .filter(|(_, m)| m.bytes % positions == 0)
        .map(|(i, m)| (i, m.bytes / positions * (positions + k)))
        .collect();
    (blocks, Some(positions))
}

/// Calls of the model per generation, if the trace is a generation.
pub(super) fn traced_calls(trace: &Trace) -> Option<u32> {
    generations(trace).ok()?.first().map(|g| g.1)
}

/// Whether the trace is a `generate()` run: three or more calls of the
/// outermost module per profiled iteration and no backward pass (several
/// forward calls with one are micro-batches).
pub(super) fn is_generation(trace: &Trace) -> bool {
    let backward = trace.ops.iter().any(|o| {
        trace
            .name(o.name)
            .starts_with("autograd::engine::evaluate_function")
    });
    !backward && generations(trace).is_ok()
}

/// The generations of the trace: per profiled iteration, the outermost
/// module's calls (at least three), as (last call, call before) and the
/// number of calls; all of one length.
pub(super) fn generations(trace: &Trace) -> Result<Vec<(Gen, u32)>, ScaleError> {
    let mut calls: Vec<(i64, i64)> = module_frames(trace)
        .into_iter()
        .filter(|f| f.ancestors.is_empty())
        .map(|f| (f.start, f.end))
        .collect();
    calls.sort_unstable();
    let mut steps: Vec<(i64, i64)> = trace
        .annotations
        .iter()
        .filter(|a| trace.name(a.name).starts_with("ProfilerStep#"))
        .map(|a| (a.start.get(), a.start.get() + a.dur.get()))
        .collect();
    steps.sort_unstable();
    if steps.is_empty() {
        steps.push((i64::MIN, i64::MAX));
    }
    let mut out = Vec::new();
    for (s, e) in steps {
        let inside: Vec<(i64, i64)> = calls
            .iter()
            .copied()
            .filter(|&(a, _)| s <= a && a <= e)
            .collect();
        if inside.len() < 3 {
            continue;
        }
        let n = inside.len();
        let (Some(&pred), Some(&last)) = (inside.get(n - 2), inside.get(n - 1)) else {
            continue;
        };
        let prefill = inside.first().copied().unwrap_or(pred);
        out.push((
            Gen {
                template: last,
                pred,
                prefill,
            },
            u32::try_from(n).unwrap_or(u32::MAX),
        ));
    }
    let Some(first) = out.first().map(|g| g.1) else {
        return Err(ScaleError::NoGeneration);
    };
    if let Some(other) = out.iter().find(|g| g.1 != first) {
        return Err(ScaleError::StepsDiffer(format!(
            "its generations make {first} and {} tokens",
            other.1
        )));
    }
    Ok(out)
}
