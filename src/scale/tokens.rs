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

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::events::{base_total, pair, retotal};
use super::frames::module_frames;
use super::ScaleError;
use crate::trace::{MemoryEvent, OpEvent, Span, Trace};
use crate::units::Nanos;

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
pub(super) struct Gen {
    pub(super) template: (i64, i64),
    pred: (i64, i64),
    /// The first call (the prompt's).
    prefill: (i64, i64),
}

/// The rebuilt trace and what was done.
pub(super) fn extend(trace: &Trace, new_tokens: u32) -> Result<(Trace, TokenFacts), ScaleError> {
    let gens = generations(trace)?;
    let traced = gens.first().map_or(0, |g| g.1);
    if new_tokens < traced {
        return Err(ScaleError::FewerTokens {
            traced,
            asked: new_tokens,
        });
    }
    let k = i64::from(new_tokens - traced);
    let mut facts = TokenFacts {
        traced,
        estimated: new_tokens,
        generations: u32::try_from(gens.len()).unwrap_or(u32::MAX),
        growing: 0,
        static_cache: 0,
    };
    if k == 0 {
        return Ok((trace.clone(), facts));
    }
    let ts: Vec<i64> = trace.memory.iter().map(|m| m.ts.get()).collect();
    let within = |(s, e): (i64, i64)| -> Vec<usize> {
        (ts.partition_point(|&x| x < s)..ts.partition_point(|&x| x <= e)).collect()
    };
    let partner = pair(&trace.memory);
    // Each free's allocation (the reverse of `partner`).
    let made_of: HashMap<usize, usize> = partner
        .iter()
        .enumerate()
        .filter_map(|(a, f)| f.map(|f| (f, a)))
        .collect();
    let size = |i: usize| trace.memory.get(i).map_or(0, |m| m.bytes);
    let mut next_addr = trace.memory.iter().map(|m| m.addr).max().unwrap_or(0) | 0xFFFF;
    let mut fresh = || {
        next_addr = next_addr.saturating_add(64);
        next_addr
    };
    // Per generation: (template start, length), the events emitted in place
    // of the template's, and the copies' events (copy c at offset (c-1)·len).
    let mut insertions: Vec<(i64, i64)> = Vec::new();
    let mut replaced: HashMap<usize, MemoryEvent> = HashMap::new();
    let mut copies: Vec<(i64, i64, MemoryEvent)> = Vec::new(); // (template start, time, event)
    let mut copied_spans: Vec<((i64, i64), i64)> = Vec::new();
    // Generations whose StaticCache grew: (from, to, traced positions).
    let mut reshaped: Vec<(i64, i64, i64)> = Vec::new();
    for (g, _) in &gens {
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
        let len = g.template.1 - g.template.0 + 1;
        let pos_t: HashMap<usize, usize> = t_ev.iter().enumerate().map(|(i, &e)| (e, i)).collect();
        let pos_p: HashMap<usize, usize> = p_ev.iter().enumerate().map(|(i, &e)| (e, i)).collect();
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
                delta[i] = d;
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
        // Addresses per (position, copy); the template keeps its own.
        let mut addr: BTreeMap<(usize, i64), u64> = BTreeMap::new();
        let mut extra_free: Vec<(i64, usize, i64)> = Vec::new(); // (time, position, copy)
        for (i, &a) in t_ev.iter().enumerate() {
            if size(a) <= 0 {
                continue;
            }
            let f = partner.get(a).copied().flatten();
            match f.and_then(|f| pos_t.get(&f)) {
                Some(&j) => {
                    // made and freed inside the call: each copy its own
                    for c in 1..=k {
                        let x = fresh();
                        addr.insert((i, c), x);
                        addr.insert((j, c), x);
                    }
                }
                None => {
                    for c in 1..=k {
                        addr.insert((i, c), fresh());
                    }
                    // outlives the call: freed when the next copy ends,
                    // unless the next call frees it (the chain below)
                    let chained = p_ev
                        .get(i)
                        .and_then(|&b| partner.get(b).copied().flatten())
                        .is_some_and(|pf| pos_t.contains_key(&pf));
                    if f.is_some() && !chained {
                        for c in 1..=k {
                            extra_free.push((g.template.0 + (c + 1) * len - 1, i, c));
                        }
                    }
                }
            }
        }
        // Chains: what the call before frees in the next call.
        let mut chain_frees: Vec<(usize, i64)> = Vec::new();
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
            for c in 1..=k {
                let prev = if c == 1 {
                    original
                } else {
                    addr.get(&(i, c - 1)).copied().unwrap_or(original)
                };
                addr.insert((j, c), prev);
            }
            if let Some(&last) = addr.get(&(i, k)) {
                addr.insert((j, 0), last);
                chain_frees.push((j, grown(i, k)));
            }
        }
        // The template, grown to the last step.
        for (i, &e) in t_ev.iter().enumerate() {
            let Some(m) = trace.memory.get(e) else {
                continue;
            };
            let mut m = m.clone();
            if m.bytes > 0 {
                m.bytes = grown(i, 0);
            } else if let Some(x) = addr.get(&(i, 0)) {
                m.addr = *x;
            }
            replaced.insert(e, m);
        }
        // Frees in the template of what it made: the grown size.
        for (i, &a) in t_ev.iter().enumerate() {
            if size(a) <= 0 {
                continue;
            }
            if let Some(f) = partner.get(a).copied().flatten() {
                let bytes = grown(i, 0);
                let entry = replaced
                    .entry(f)
                    .or_insert_with(|| trace.memory.get(f).cloned().unwrap_or_else(empty_event));
                entry.bytes = -bytes;
            }
        }
        // The template frees the last copy's block of a chain.
        for (j, bytes) in chain_frees {
            if let Some(m) = t_ev.get(j).and_then(|e| replaced.get_mut(e)) {
                m.bytes = -bytes;
            }
        }
        // The copies.
        for c in 1..=k {
            for (i, &e) in t_ev.iter().enumerate() {
                let Some(m) = trace.memory.get(e) else {
                    continue;
                };
                let Some(&x) = addr.get(&(i, c)) else {
                    continue;
                };
                let t = m.ts.get() + (c - 1) * len;
                let bytes = if m.bytes > 0 {
                    grown(i, c)
                } else {
                    // the size of the block it frees
                    let made =
                        made_of
                            .get(&e)
                            .and_then(|&a| {
                                pos_t.get(&a).map(|&ai| grown(ai, c)).or_else(|| {
                                    pos_p.get(&a).map(|&bi| {
                                        if c == 1 {
                                            size(a)
                                        } else {
                                            grown(bi, c - 1)
                                        }
                                    })
                                })
                            })
                            .unwrap_or(-m.bytes);
                    -made
                };
                copies.push((
                    g.template.0,
                    t,
                    MemoryEvent {
                        ts: Nanos(t),
                        addr: x,
                        bytes,
                        ..m.clone()
                    },
                ));
            }
        }
        for (at, i, c) in extra_free {
            let (Some(&x), Some(&e)) = (addr.get(&(i, c)), t_ev.get(i)) else {
                continue;
            };
            let Some(m) = trace.memory.get(e) else {
                continue;
            };
            // `at`: the end of the next copy (or of the template, grown last)
            copies.push((
                g.template.0,
                at,
                MemoryEvent {
                    ts: Nanos(at),
                    addr: x,
                    bytes: -grown(i, c),
                    ..m.clone()
                },
            ));
        }
        // A StaticCache is made once, in the prompt's call, for every
        // position of the generation: it grows by k positions.
        let (blocks, positions) = static_cache(trace, g, traced, k, &partner);
        if let (false, Some(p)) = (blocks.is_empty(), positions) {
            reshaped.push((g.prefill.0, g.template.1, p));
        }
        for (a, bytes) in blocks {
            for e in std::iter::once(a).chain(partner.get(a).copied().flatten()) {
                let entry = replaced
                    .entry(e)
                    .or_insert_with(|| trace.memory.get(e).cloned().unwrap_or_else(empty_event));
                entry.bytes = if entry.bytes > 0 { bytes } else { -bytes };
            }
            facts.static_cache += 1;
        }
        insertions.push((g.template.0, k * len));
        copied_spans.push((g.template, len));
    }
    // Shift: everything at or after a template's start moves by its copies.
    let shift = |t: i64| -> i64 {
        insertions
            .iter()
            .filter(|&&(at, _)| t >= at)
            .map(|&(_, d)| d)
            .sum()
    };
    // Copies are placed relative to their template's original start, plus
    // the shifts of earlier generations.
    let earlier = |t0: i64| -> i64 {
        insertions
            .iter()
            .filter(|&&(at, _)| at < t0)
            .map(|&(_, d)| d)
            .sum()
    };
    let mut memory: Vec<(i64, u32, MemoryEvent)> = Vec::new();
    for (e, m) in trace.memory.iter().enumerate() {
        let mut m = replaced.get(&e).cloned().unwrap_or_else(|| m.clone());
        let t = m.ts.get() + shift(m.ts.get());
        m.ts = Nanos(t);
        memory.push((t, 1, m));
    }
    for (t0, t, mut m) in copies {
        let t2 = t + earlier(t0);
        m.ts = Nanos(t2);
        memory.push((t2, 0, m));
    }
    memory.sort_by_key(|(t, o, _)| (*t, *o));
    let mut out = trace.clone();
    out.memory = memory.into_iter().map(|(_, _, m)| m).collect();
    retotal(&mut out.memory, base_total(&trace.memory));

    // Ops, Python frames and annotations: moved, and the template's copied.
    let in_template = |s: i64| copied_spans.iter().find(|((a, b), _)| *a <= s && s <= *b);
    let mut ops: Vec<OpEvent> = Vec::new();
    for o in &trace.ops {
        let s = o.start.get();
        let mut moved = OpEvent {
            start: Nanos(s + shift(s)),
            ..o.clone()
        };
        // An op reading a grown StaticCache or a view of it: an argument of
        // 4 or more dims [batch, heads, (1,) positions or prompt, head dim]
        // (the attention's 4-d one; the 5-d `[:, :, None]` view that
        // `repeat_kv` expands; weights are never 4-d here). Its recorded
        // length is the traced generation's, so it would read as a tensor
        // no block of the rebuilt trace holds (state made before it).
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
        if in_template(s).is_some() || reads_cache {
            // grown to the last step: its recorded shapes no longer fit
            moved.tensors = Span::default();
            moved.concrete = Span::default();
            moved.tensor_list_len = None;
            moved.tensor_args = 0..0;
        }
        if let Some(&((a, _), len)) = in_template(s) {
            // copies of the (shape-less) template op
            for c in 1..=k {
                ops.push(OpEvent {
                    start: Nanos(s + (c - 1) * len + earlier(a)),
                    external_id: None,
                    sequence_number: None,
                    ..moved.clone()
                });
            }
        }
        ops.push(moved);
    }
    ops.sort_by_key(|o| (o.start, std::cmp::Reverse(o.dur)));
    out.ops = ops;
    let py_span = super::names::python_id_stride(trace);
    // The ids of the Python frames the templates hold (copied with them).
    let copied_ids: std::collections::HashSet<i64> = trace
        .python
        .iter()
        .filter(|p| in_template(p.start.get()).is_some())
        .filter_map(|p| p.id)
        .collect();
    let mut python = Vec::new();
    for p in &trace.python {
        let s = p.start.get();
        python.push(crate::trace::PythonEvent {
            start: Nanos(s + shift(s)),
            ..p.clone()
        });
        if let Some(&((a, _), len)) = in_template(s) {
            // a parent copied with it is the copy's parent
            let inside = p.parent_id.is_some_and(|x| copied_ids.contains(&x));
            for c in 1..=k {
                let mut q = p.clone();
                q.start = Nanos(s + (c - 1) * len + earlier(a));
                q.id = p.id.map(|x| x + py_span * c);
                q.parent_id = p
                    .parent_id
                    .map(|x| if inside { x + py_span * c } else { x });
                python.push(q);
            }
        }
    }
    python.sort_by_key(|p| (p.start, std::cmp::Reverse(p.dur)));
    out.python = python;
    let mut annotations = Vec::new();
    for an in &trace.annotations {
        let s = an.start.get();
        let e = s + an.dur.get();
        let (s2, e2) = (s + shift(s), e + shift(e));
        annotations.push(crate::trace::AnnotationEvent {
            start: Nanos(s2),
            dur: Nanos(e2 - s2),
            ..an.clone()
        });
        if let Some(&((a, _), len)) = in_template(s) {
            if in_template(e).is_some() {
                for c in 1..=k {
                    annotations.push(crate::trace::AnnotationEvent {
                        start: Nanos(s + (c - 1) * len + earlier(a)),
                        ..an.clone()
                    });
                }
            }
        }
    }
    annotations.sort_by_key(|a| (a.start, std::cmp::Reverse(a.dur)));
    out.annotations = annotations;
    for f in &mut out.flows {
        let t = f.ts.get();
        f.ts = Nanos(t + shift(t));
    }
    Ok((out, facts))
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
    let prompt = super::length::embedding_ids_dims(trace, s, e).and_then(|d| d.last().copied());
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

fn empty_event() -> MemoryEvent {
    MemoryEvent {
        ts: Nanos(0),
        tid: 0,
        addr: 0,
        bytes: 0,
        total_allocated: None,
        total_reserved: None,
        device: crate::trace::Device::Cpu,
        device_id: None,
    }
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
