//! The work a rebuild implies, estimated before anything is built (issue
//! 33): a request the shell cannot hold is refused at once, with the largest
//! request that would fit, instead of being built until an allocation fails
//! (a native process aborts, the browser's worker dies at the wasm32 heap).
//!
//! The rule. A rebuilt job is the traced job plus copies: `--layers N` adds
//! `N - n` copies of the last traced block (each of its calls, its backward,
//! its loop in a per-parameter optimizer step), `--new-tokens N` adds
//! `N - n` copies of the last decode step of each generation, and a deeper
//! generation's decode step holds one more call of the block per added
//! block. So with `ΔL` added blocks and `ΔT` added decode steps the rebuilt
//! trace holds
//!
//! ```text
//! events = traced + ΔL · per_layer + ΔT · (per_token + ΔL · per_token_layer)
//! ```
//!
//! events, counted on the trace ([`Counts::of`]: every `[memory]` event, op,
//! Python frame, annotation and flow the copied segments hold; within 0.3 %
//! of the rebuilt trace's count on the real fixtures), and the estimate's
//! memory grows with them: [`BYTES_PER_EVENT`] for every event of the
//! rebuilt trace (the trace, the analysis, the schedule, the simulations'
//! state), [`WHAT_IF_BYTES_PER_EVENT`] more when the job is orchestrated a
//! second time for the mixed-precision what-if (the page, the what-ifs),
//! [`BYTES_PER_LAYER_EVENT`] more for each event a block copy adds
//! (the depth rebuild's plan, the copies' renamed module frames and
//! parameters), and [`BASE_BYTES`]. `--seq-len` rescales sizes and adds no
//! event.
//!
//! Invariants: [`estimate`], [`most_tokens`], [`most_layers`] and [`check`]
//! are arithmetic on the counts (saturating, never wrapping), monotone in
//! the layers and the new tokens asked for, so the largest request that fits
//! is found by solving a line; the pipeline calls [`check`] (through
//! `scale::check_work`) once, before the rebuild. The constants were measured
//! on the materialized path (the rebuilt trace held whole, as today): peak
//! RSS of the release CLI over depth, token and combined requests on the
//! `traces-llm` and `traces-depth` fixtures (`benches/scale/calibrate.sh`),
//! each constant at or above the largest rate seen, so the estimate errs
//! high (by up to about 1.9× for training traces with many ops per block).
//! A streaming rebuild that holds less per event lowers them; the check
//! stays where it is, and then mainly bounds the time.

use super::copy::Seg;
use super::depth;
use super::frames::{find_stacks, module_frames};
use super::parts::Kind;
use super::{ScaleError, Target};
use crate::present::thousands;
use crate::trace::Trace;
use crate::units::Bytes;

/// Peak memory per event of the rebuilt trace, from the trace read to the
/// report. Measured: 200–228 bytes per event over token and combined
/// requests (e.g. 2,956,363 events of `llama_gen16_dynamic --new-tokens
/// 1024`: 629 MB; 29,678,555 of `--layers 64 --new-tokens 512`: 6.8 GB).
pub const BYTES_PER_EVENT: u64 = 240;

/// Memory per event beyond [`BYTES_PER_EVENT`] when the job is also
/// orchestrated under CUDA autocast for the mixed-precision what-if (the
/// page and the what-ifs prepare it so: a second schedule). Measured: up
/// to 260 bytes per event in all (`whatif context --layers 80` at 505 new
/// tokens: 9.5 GB for 36.5 M events; `whatif precision --layers 32
/// --new-tokens 1024`: 7.7 GB for 30.2 M).
pub const WHAT_IF_BYTES_PER_EVENT: u64 = 40;

/// Memory each event a block copy adds takes beyond [`BYTES_PER_EVENT`].
/// Measured: 193–359 bytes per added block's event in all (the most on a
/// generation: `llama_gen16_dynamic --layers 128` to `256`, 5.1 MB a block
/// of 14,242 events).
pub const BYTES_PER_LAYER_EVENT: u64 = 150;

/// Memory an estimate takes whatever its size (the program, the trace
/// reader's buffers, the simulator's tables).
pub const BASE_BYTES: u64 = 32 << 20;

/// What a shell lets a rebuilt job take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The memory the estimate may use.
    pub bytes: Bytes,
    /// Whether the job is also orchestrated for the mixed-precision
    /// what-if (`AutocastConfig::what_if`), which takes more per event.
    pub what_if: bool,
}

impl Budget {
    /// No limit (the rebuild as a library call, tests).
    pub const UNLIMITED: Budget = Budget {
        bytes: Bytes(u64::MAX),
        what_if: false,
    };

    /// Memory per event of the rebuilt trace.
    fn per_event(self) -> u64 {
        BYTES_PER_EVENT
            + if self.what_if {
                WHAT_IF_BYTES_PER_EVENT
            } else {
                0
            }
    }
}

/// The events a trace holds and what a copy of its block or of its decode
/// step adds, counted once on the traced job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Every event of the traced job: `[memory]` events, ops, Python
    /// frames, annotations, flows.
    pub traced: u64,
    /// Blocks per stack in the trace (0: no stack was found).
    pub layers: u32,
    /// Events one more block per stack adds (every stack: each of the
    /// block's calls, its backward and its optimizer loop).
    pub per_layer: u64,
    /// Calls of the model per generation in the trace (0: no generation).
    pub tokens: u32,
    /// Events one more decode step adds (every generation), at the traced
    /// depth.
    pub per_token: u64,
    /// Events each added block adds to a decode step (its call there).
    pub per_token_layer: u64,
    /// The largest time of the trace, as a magnitude (ns).
    pub latest: u64,
    /// The time a block copy inserts (its copied segments, ns).
    pub layer_time: u64,
    /// The time a decode step copy inserts (every generation, ns).
    pub token_time: u64,
    /// The largest id of the trace (external, Python, flow, sequence
    /// number), as a magnitude: copies number theirs past it.
    pub largest_id: u64,
}

impl Counts {
    /// Counts `trace`. What cannot be found counts nothing: a request the
    /// rebuild then refuses is refused there, with its reason.
    pub fn of(trace: &Trace) -> Counts {
        let mut counts = Counts {
            traced: Counts::traced_of(trace),
            ..Counts::default()
        };
        let ts: Vec<i64> = trace.memory.iter().map(|m| m.ts.get()).collect();
        let index = Index::new(trace);
        let frames = module_frames(trace);
        let stacks = find_stacks(trace, &frames);
        let mut parts = Vec::new();
        for (s, stack) in stacks.iter().enumerate() {
            if let Ok(found) = depth::stack_parts(trace, &frames, stack, s) {
                parts.extend(found);
            }
        }
        if let Some(first) = stacks.first() {
            counts.layers = u32::try_from(first.instances.len()).unwrap_or(u32::MAX);
            super::step::step_parts(
                trace,
                first,
                stacks.len(),
                counts.layers,
                &mut parts,
                &mut Vec::new(),
            );
        }
        let segs: Vec<Seg> = parts.iter().map(|p| p.seg).collect();
        counts.per_layer = segs
            .iter()
            .map(|&s| index.in_seg(s))
            .fold(0, u64::saturating_add);
        counts.layer_time = segs.iter().map(|&s| length(s)).fold(0, u64::saturating_add);
        counts.latest = latest(trace);
        counts.largest_id = largest_id(trace);
        if let Ok(gens) = super::tokens::generations(trace) {
            counts.tokens = gens.first().map_or(0, |g| g.1);
            for (g, _) in &gens {
                let (start, end) = g.template;
                let step = Seg { start, end };
                counts.token_time = counts.token_time.saturating_add(length(step));
                counts.per_token = counts.per_token.saturating_add(index.in_step(step, &ts));
                counts.per_token_layer = counts.per_token_layer.saturating_add(
                    parts
                        .iter()
                        .filter(|p| p.kind == Kind::Forward)
                        .filter(|p| step.holds(p.seg.start) && step.holds(p.seg.end))
                        .map(|p| index.in_seg(p.seg))
                        .fold(0, u64::saturating_add),
                );
            }
        }
        counts
    }
}

impl Counts {
    /// Every event of `trace`.
    pub fn traced_of(trace: &Trace) -> u64 {
        [
            trace.memory.len(),
            trace.ops.len(),
            trace.python.len(),
            trace.annotations.len(),
            trace.flows.len(),
        ]
        .iter()
        .fold(0_u64, |acc, &n| acc.saturating_add(n as u64))
    }
}

/// The length of an inclusive interval (ns).
fn length(seg: Seg) -> u64 {
    seg.end.abs_diff(seg.start).saturating_add(1)
}

/// The largest magnitude of a time in `trace` (a span's end included).
fn latest(trace: &Trace) -> u64 {
    let spans = trace
        .ops
        .iter()
        .map(|o| (o.start, o.dur))
        .chain(trace.python.iter().map(|p| (p.start, p.dur)))
        .chain(trace.annotations.iter().map(|a| (a.start, a.dur)));
    spans
        .flat_map(|(s, d)| [s.get(), s.get().saturating_add(d.get())])
        .chain(trace.memory.iter().map(|m| m.ts.get()))
        .chain(trace.flows.iter().map(|f| f.ts.get()))
        .map(i64::unsigned_abs)
        .max()
        .unwrap_or(0)
}

/// The largest magnitude of an id in `trace`.
fn largest_id(trace: &Trace) -> u64 {
    trace
        .ops
        .iter()
        .flat_map(|o| [o.external_id, o.sequence_number])
        .chain(trace.python.iter().flat_map(|p| [p.id, p.parent_id]))
        .chain(trace.flows.iter().map(|f| Some(f.id)))
        .flatten()
        .map(i64::unsigned_abs)
        .max()
        .unwrap_or(0)
}

/// The trace's events by time, to count those a segment holds in time
/// proportional to them: `[memory]` and flow times, and spans (ops and
/// Python frames; annotations apart) as (start, end), each sorted.
struct Index {
    instants: Vec<i64>,
    calls: Vec<(i64, i64)>,
    annotations: Vec<(i64, i64)>,
}

impl Index {
    fn new(trace: &Trace) -> Index {
        let span = |s: crate::units::Nanos, d: crate::units::Nanos| {
            (s.get(), s.get().saturating_add(d.get()))
        };
        let mut instants: Vec<i64> = trace
            .memory
            .iter()
            .map(|m| m.ts.get())
            .chain(trace.flows.iter().map(|f| f.ts.get()))
            .collect();
        let mut calls: Vec<(i64, i64)> = trace
            .ops
            .iter()
            .map(|o| span(o.start, o.dur))
            .chain(trace.python.iter().map(|p| span(p.start, p.dur)))
            .collect();
        let mut annotations: Vec<(i64, i64)> = trace
            .annotations
            .iter()
            .map(|a| span(a.start, a.dur))
            .collect();
        instants.sort_unstable();
        calls.sort_unstable();
        annotations.sort_unstable();
        Index {
            instants,
            calls,
            annotations,
        }
    }

    /// The events `--layers` copies with a segment: `[memory]` events and
    /// flows at a time inside it, spans wholly inside it.
    fn in_seg(&self, seg: Seg) -> u64 {
        let n = instants_in(&self.instants, seg)
            + starting_in(&self.calls, seg)
                .iter()
                .filter(|&&(_, end)| end <= seg.end)
                .count()
            + starting_in(&self.annotations, seg)
                .iter()
                .filter(|&&(_, end)| end <= seg.end)
                .count();
        n as u64
    }

    /// The events `--new-tokens` copies with a decode step: `[memory]`
    /// events at a time inside it, ops and frames that start in it,
    /// annotations wholly inside it (flows are not copied).
    fn in_step(&self, seg: Seg, memory: &[i64]) -> u64 {
        let n = instants_in(memory, seg)
            + starting_in(&self.calls, seg).len()
            + starting_in(&self.annotations, seg)
                .iter()
                .filter(|&&(_, end)| end <= seg.end)
                .count();
        n as u64
    }
}

/// How many of the sorted `times` lie inside `seg`.
fn instants_in(times: &[i64], seg: Seg) -> usize {
    let lo = times.partition_point(|&x| x < seg.start);
    let hi = times.partition_point(|&x| x <= seg.end);
    hi.saturating_sub(lo)
}

/// The spans of sorted `spans` that start inside `seg`.
fn starting_in(spans: &[(i64, i64)], seg: Seg) -> &[(i64, i64)] {
    let lo = spans.partition_point(|&(s, _)| s < seg.start);
    let hi = spans.partition_point(|&(s, _)| s <= seg.end);
    spans.get(lo..hi.max(lo)).unwrap_or_default()
}

/// What a request implies: the rebuilt trace's events and the memory the
/// estimate takes for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    pub events: u64,
    pub bytes: Bytes,
}

/// The work of the job with `layers` blocks per stack and `tokens` calls
/// per generation (as traced where below the trace's: the rebuild refuses
/// fewer), prepared as `budget` says.
pub fn estimate(counts: &Counts, layers: u32, tokens: u32, budget: Budget) -> Work {
    let dl = u128::from(layers.saturating_sub(counts.layers));
    let dt = u128::from(tokens.saturating_sub(counts.tokens));
    let added_by_layers = dl.saturating_mul(counts.per_layer.into());
    let events = u128::from(counts.traced)
        .saturating_add(added_by_layers)
        .saturating_add(dt.saturating_mul(per_step(counts, dl)));
    let bytes = u128::from(BASE_BYTES)
        .saturating_add(events.saturating_mul(budget.per_event().into()))
        .saturating_add(added_by_layers.saturating_mul(BYTES_PER_LAYER_EVENT.into()));
    Work {
        events: u64::try_from(events).unwrap_or(u64::MAX),
        bytes: Bytes(u64::try_from(bytes).unwrap_or(u64::MAX)),
    }
}

/// The events of one decode step with `dl` added blocks.
fn per_step(counts: &Counts, dl: u128) -> u128 {
    u128::from(counts.per_token).saturating_add(dl.saturating_mul(counts.per_token_layer.into()))
}

/// Whether the times and ids of the job with `layers` blocks and `tokens`
/// calls stay within an `i64`: each block copy moves what follows by the
/// time it inserts and lands at most that far again (twice its time), each
/// decode step copy likewise with a step made longer by the blocks added
/// in it, and copy `c` numbers its ids `id + c × (largest + 1)` (then
/// renumbered sequence numbers count on by one an op). A generous bound:
/// a real trace is far inside it (hours of microseconds, ids in millions).
fn in_range(counts: &Counts, layers: u32, tokens: u32) -> bool {
    let dl = u128::from(layers.saturating_sub(counts.layers));
    let dt = u128::from(tokens.saturating_sub(counts.tokens));
    if dl == 0 && dt == 0 {
        return true;
    }
    let copies = (dl + 1) * (dt + 1);
    let time = u128::from(counts.layer_time) + u128::from(counts.token_time);
    let reach =
        u128::from(counts.latest).saturating_add(copies.saturating_mul(8).saturating_mul(time));
    let ids = (u128::from(counts.largest_id) + 2)
        .saturating_mul(copies)
        .saturating_add(
            estimate(counts, layers, tokens, Budget::UNLIMITED)
                .events
                .into(),
        );
    let limit = i64::MAX.unsigned_abs().into();
    reach <= limit && ids <= limit
}

/// The largest `x` with `fixed + x · slope <= budget`, `None` when not even
/// `x = 0` fits (all in bytes).
fn most(fixed: u128, slope: u128, budget: Budget) -> Option<u64> {
    let room = u128::from(budget.bytes.get()).checked_sub(fixed)?;
    let x = room.checked_div(slope).unwrap_or(u128::MAX);
    Some(u64::try_from(x).unwrap_or(u64::MAX))
}

/// The most calls per generation a job with `layers` blocks per stack can
/// make within `budget` (`None`: not even the traced calls fit, or the
/// trace is no generation).
pub fn most_tokens(counts: &Counts, layers: u32, budget: Budget) -> Option<u32> {
    if counts.tokens == 0 {
        return None;
    }
    let fixed = estimate(counts, layers, counts.tokens, budget).bytes.get();
    let dl = u128::from(layers.saturating_sub(counts.layers));
    let slope = per_step(counts, dl).saturating_mul(budget.per_event().into());
    let more = most(u128::from(fixed), slope, budget)?;
    Some(u32::try_from(u64::from(counts.tokens).saturating_add(more)).unwrap_or(u32::MAX))
}

/// The most blocks per stack a job with `tokens` calls per generation can
/// have within `budget` (`None`: not even the traced blocks fit, or the
/// trace has no stack).
pub fn most_layers(counts: &Counts, tokens: u32, budget: Budget) -> Option<u32> {
    if counts.layers == 0 {
        return None;
    }
    let fixed = estimate(counts, counts.layers, tokens, budget).bytes.get();
    let dt = u128::from(tokens.saturating_sub(counts.tokens));
    let per_layer = u128::from(counts.per_layer);
    let events = per_layer.saturating_add(dt.saturating_mul(counts.per_token_layer.into()));
    let slope = events
        .saturating_mul(budget.per_event().into())
        .saturating_add(per_layer.saturating_mul(BYTES_PER_LAYER_EVENT.into()));
    let more = most(u128::from(fixed), slope, budget)?;
    Some(u32::try_from(u64::from(counts.layers).saturating_add(more)).unwrap_or(u32::MAX))
}

/// The work of `target` on a trace of `counts`, or the error that refuses
/// it: more than `budget` bytes, with the largest request that fits (the
/// most new tokens at the layers asked for; else the most layers at the
/// traced tokens).
pub fn check(counts: &Counts, target: &Target, budget: Budget) -> Result<Work, ScaleError> {
    let layers = target.layers.unwrap_or(counts.layers).max(counts.layers);
    let tokens = target
        .new_tokens
        .unwrap_or(counts.tokens)
        .max(counts.tokens);
    if !in_range(counts, layers, tokens) {
        return Err(ScaleError::OutOfRange(describe(target)));
    }
    let work = estimate(counts, layers, tokens, budget);
    if work.bytes <= budget.bytes {
        return Ok(work);
    }
    let fits = match (
        target
            .new_tokens
            .and_then(|_| most_tokens(counts, layers, budget)),
        target
            .layers
            .and_then(|_| most_layers(counts, counts.tokens, budget)),
    ) {
        (Some(tokens), _) => Fits::Tokens {
            tokens,
            layers: target.layers,
        },
        (None, Some(layers)) => Fits::Layers(layers),
        (None, None) => Fits::Traced,
    };
    Err(ScaleError::OverBudget {
        asked: describe(target),
        needed: work.bytes,
        budget: budget.bytes,
        fits: fits.to_string(),
    })
}

/// The largest request that fits, for the message.
enum Fits {
    Tokens { tokens: u32, layers: Option<u32> },
    Layers(u32),
    Traced,
}

impl std::fmt::Display for Fits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fits::Tokens {
                tokens,
                layers: Some(l),
            } => write!(
                f,
                "at most {} new tokens with {} layers fit",
                thousands(u64::from(*tokens)),
                thousands(u64::from(*l))
            ),
            Fits::Tokens {
                tokens,
                layers: None,
            } => write!(
                f,
                "at most {} new tokens fit",
                thousands(u64::from(*tokens))
            ),
            Fits::Layers(l) => write!(f, "at most {} layers fit", thousands(u64::from(*l))),
            Fits::Traced => write!(f, "only the traced job fits"),
        }
    }
}

/// The request in words: "32 layers and 8,192 new tokens".
pub fn describe(target: &Target) -> String {
    let mut parts = Vec::new();
    if let Some(l) = target.layers {
        parts.push(format!("{} layers", thousands(u64::from(l))));
    }
    if let Some(t) = target.new_tokens {
        parts.push(format!("{} new tokens", thousands(u64::from(t))));
    }
    if parts.is_empty() {
        "this job".to_owned()
    } else {
        parts.join(" and ")
    }
}

/// Bytes in binary units with one decimal: `2.0 GiB`, `612.4 MiB`.
pub(super) fn size(bytes: Bytes) -> String {
    let b = bytes.get() as f64;
    let (value, unit) = if bytes.get() >= Bytes::GIB {
        (b / Bytes::GIB as f64, "GiB")
    } else {
        (b / Bytes::MIB as f64, "MiB")
    };
    format!("{value:.1} {unit}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A trace of 100 events, 2 blocks of 10 events, 4 calls of the model,
    /// a decode step of 5 events of which 1 is a block's call.
    const COUNTS: Counts = Counts {
        traced: 100,
        layers: 2,
        per_layer: 10,
        tokens: 4,
        per_token: 5,
        per_token_layer: 1,
        latest: 1_000_000,
        layer_time: 1_000,
        token_time: 1_000,
        largest_id: 100,
    };

    /// Budgets of the estimate path (no what-if job).
    const B: Budget = Budget::UNLIMITED;

    fn budget_of(bytes: u64) -> Budget {
        Budget {
            bytes: Bytes(bytes),
            what_if: false,
        }
    }

    fn target(layers: Option<u32>, new_tokens: Option<u32>) -> Target {
        Target {
            layers,
            seq_len: None,
            new_tokens,
        }
    }

    #[test]
    fn the_events_are_the_traced_plus_the_copies() {
        // 3 more blocks, 6 more steps each with 3 more block calls.
        let work = estimate(&COUNTS, 5, 10, B);
        assert_eq!(work.events, 100 + 3 * 10 + 6 * (5 + 3));
        assert_eq!(
            work.bytes.get(),
            BASE_BYTES + 178 * BYTES_PER_EVENT + 30 * BYTES_PER_LAYER_EVENT
        );
        // Fewer than traced counts as traced (the rebuild refuses it).
        assert_eq!(estimate(&COUNTS, 1, 1, B).events, 100);
    }

    #[test]
    fn a_request_over_the_budget_is_refused_with_the_largest_that_fits() {
        let budget = Budget {
            bytes: estimate(&COUNTS, 5, 10, B).bytes,
            what_if: false,
        };
        assert!(check(&COUNTS, &target(Some(5), Some(10)), budget).is_ok());
        let err = check(&COUNTS, &target(Some(5), Some(11)), budget).unwrap_err();
        let ScaleError::OverBudget { asked, fits, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(asked, "5 layers and 11 new tokens");
        assert_eq!(fits, "at most 10 new tokens with 5 layers fit");
        assert_eq!(err.setting(), Some(crate::diag::Setting::MemoryBudget));
        // Too many layers for even the traced tokens: the layers that fit.
        let err = check(&COUNTS, &target(Some(200), Some(11)), budget).unwrap_err();
        assert!(err.to_string().contains("at most 7 layers fit"), "{err}");
        // Not even the traced job.
        let tiny = budget_of(BASE_BYTES);
        let err = check(&COUNTS, &target(Some(3), None), tiny).unwrap_err();
        assert!(
            err.to_string().contains("only the traced job fits"),
            "{err}"
        );
    }

    #[test]
    fn the_message_names_the_sizes() {
        let counts = Counts {
            traced: 63_403,
            layers: 2,
            per_layer: 14_242,
            tokens: 16,
            per_token: 2_870,
            per_token_layer: 888,
            ..COUNTS
        };
        let err = check(
            &counts,
            &target(Some(32), Some(8192)),
            budget_of(2 * Bytes::GIB),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("32 layers and 8,192 new tokens would need about "),
            "{text}"
        );
        assert!(
            text.contains("more than this estimate may use (2.0 GiB)"),
            "{text}"
        );
        let most = most_tokens(&counts, 32, budget_of(2 * Bytes::GIB)).unwrap();
        assert!(
            text.contains(&format!(
                "at most {} new tokens with 32 layers fit",
                thousands(u64::from(most))
            )),
            "{text}"
        );
    }

    #[test]
    fn hostile_counts_saturate() {
        let huge = Counts {
            traced: u64::MAX,
            layers: 1,
            per_layer: u64::MAX,
            tokens: 1,
            per_token: u64::MAX,
            per_token_layer: u64::MAX,
            ..COUNTS
        };
        let work = estimate(&huge, u32::MAX, u32::MAX, B);
        assert_eq!(work.events, u64::MAX);
        assert_eq!(work.bytes, Bytes(u64::MAX));
        assert!(check(&huge, &target(Some(2), None), budget_of(u64::MAX - 1)).is_err());
        assert_eq!(most_tokens(&huge, 1, budget_of(u64::MAX - 1)), None);
        // Nothing copied grows: every length fits.
        let flat = Counts {
            per_token: 0,
            per_token_layer: 0,
            ..COUNTS
        };
        assert_eq!(most_tokens(&flat, 2, budget_of(u64::MAX)), Some(u32::MAX));
    }

    #[test]
    fn times_or_ids_the_copies_would_carry_past_an_i64_are_refused() {
        let late = Counts {
            latest: i64::MAX.unsigned_abs() - 10_000,
            ..COUNTS
        };
        // The traced job needs no copy.
        assert!(check(&late, &target(Some(2), None), budget_of(u64::MAX)).is_ok());
        let err = check(&late, &target(Some(3), None), budget_of(u64::MAX)).unwrap_err();
        assert_eq!(err, ScaleError::OutOfRange("3 layers".to_owned()));
        let ids = Counts {
            largest_id: i64::MAX.unsigned_abs() / 2,
            ..COUNTS
        };
        assert!(check(&ids, &target(None, Some(5)), budget_of(u64::MAX)).is_err());
        assert!(check(
            &COUNTS,
            &target(Some(1000), Some(65_536)),
            budget_of(u64::MAX)
        )
        .is_ok());
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(size(Bytes(3 * Bytes::GIB / 2)), "1.5 GiB");
        assert_eq!(size(Bytes(612 * Bytes::MIB)), "612.0 MiB");
    }

    fn counts() -> impl Strategy<Value = Counts> {
        (
            0_u64..1 << 40,
            1_u32..64,
            0_u64..1 << 30,
            0_u32..64,
            0_u64..1 << 30,
            0_u64..1 << 20,
        )
            .prop_map(
                |(traced, layers, per_layer, tokens, per_token, per_token_layer)| Counts {
                    traced,
                    layers,
                    per_layer,
                    tokens,
                    per_token,
                    per_token_layer,
                    ..COUNTS
                },
            )
    }

    proptest! {
        /// More layers or tokens never cost less, and the largest request
        /// said to fit fits while one more does not.
        #[test]
        fn the_largest_that_fits_is_the_edge(
            c in counts(),
            layers in 0_u32..2000,
            tokens in 0_u32..100_000,
            budget in 0_u64..1 << 45,
        ) {
            let budget = budget_of(budget);
            let here = estimate(&c, layers, tokens, B);
            prop_assert!(estimate(&c, layers + 1, tokens, B).bytes >= here.bytes);
            prop_assert!(estimate(&c, layers, tokens + 1, B).bytes >= here.bytes);
            let layers = layers.max(c.layers);
            if let Some(t) = most_tokens(&c, layers, budget) {
                prop_assert!(estimate(&c, layers, t, B).bytes <= budget.bytes);
                if t < u32::MAX {
                    prop_assert!(estimate(&c, layers, t + 1, B).bytes > budget.bytes);
                }
            } else if c.tokens > 0 {
                prop_assert!(estimate(&c, layers, c.tokens, B).bytes > budget.bytes);
            }
            let tokens = tokens.max(c.tokens);
            if let Some(l) = most_layers(&c, tokens, budget) {
                prop_assert!(estimate(&c, l, tokens, B).bytes <= budget.bytes);
                if l < u32::MAX {
                    prop_assert!(estimate(&c, l + 1, tokens, B).bytes > budget.bytes);
                }
            }
        }
    }
}
