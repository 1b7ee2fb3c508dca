//! The optimizer step's loop over the repeated block's parameters, found so
//! that `--layers N` copies it for the copies' parameters.
//!
//! An optimizer that updates one parameter at a time (`torch.optim`'s
//! single-tensor path, which a CPU run takes by default, and the loop most
//! hand-written optimizers run) does the same ops on tensors of the same
//! shapes for every block's parameters, in parameter order: inside the step,
//! the `n` traced blocks' work is `n` identical runs of ops back to back (a
//! *tandem repeat* of the step's top-level ops, each op named with its
//! argument shapes). The last run is the template, copied `N - n` times like
//! a block's forward call; the run before it is its predecessor (what a
//! tensor crossing steps, such as a moment a hand-written AdamW re-makes
//! every step, is linked by).
//!
//! A step can hold several such repeats (`torch.optim` builds its state in a
//! loop before the update loop on the first step; the Hugging Face Trainer
//! puts weights and biases in two parameter groups), so the longest repeat
//! is taken first, then the longest in what is left on each side. A short
//! repeat next to a long one is left alone unless it is at least a quarter
//! of the longest: two neighbouring parameters of equal shape outside the
//! block (a final norm's weight and bias) also repeat, and are not the
//! block's (this threshold is a judgement, not a PyTorch fact). What a step
//! keeps must then be the block's loop: a loop that does the same for every
//! parameter allocates, over the step's runs, the same number of tensors of
//! each of the block's parameter sizes (from its `AccumulateGrad` nodes) per
//! parameter; a step whose runs do not (the block before the last has more
//! parameters, as T5's first block with its position bias, so no two runs
//! are equal and a shorter repeat inside the block was found) has none
//! copied, and its temporaries stay those of the traced blocks. A step on
//! the foreach or fused path runs one op over all parameters and has no
//! per-parameter loop; its lists are remodelled over every parameter by the
//! orchestrator instead.

use rustc_hash::FxHashMap;
use std::collections::BTreeSet;

use super::copy::Seg;
use super::frames::Stack;
use super::parts::{events_in, part, Kind, Part};
use crate::diag::Warning;
use crate::trace::{NameId, Trace};

/// One run of the step's loop over the last traced block's parameters, and
/// the run before it: inclusive time intervals. `group` numbers the runs of
/// a step in time order, so the same loop has the same number in every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StepRun {
    pub template: (i64, i64),
    pub pred: (i64, i64),
    pub group: usize,
    /// Which recorded step (0: the first).
    pub step: usize,
    /// The template's top-level ops.
    pub ops: usize,
}

/// What the optimizer steps' loops gave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct StepLoops {
    pub runs: Vec<StepRun>,
    /// Recorded steps.
    pub steps: usize,
    /// Whether the first step had a loop over the block's parameters (then
    /// the state it made is in the copies too).
    pub first_found: bool,
    /// Steps whose top-level ops were too many to compare.
    pub too_long: usize,
    /// Steps on the foreach or fused path (no per-parameter loop).
    pub foreach: usize,
    /// Steps whose runs were found but were not the block's loop.
    pub unmatched: usize,
}

/// Adds the optimizer steps' loops over the last block's parameters as
/// parts (each loop its own stack number after the blocks'), and says
/// whether the first step's state must be left out of the rebuilt trace
/// (no loop found there: the state is then sized from the parameters).
pub(super) fn step_parts(
    trace: &Trace,
    stack: &Stack,
    n_stacks: usize,
    traced: u32,
    parts: &mut Vec<Part>,
    warnings: &mut Vec<Warning>,
) -> bool {
    // The last block's parameters, from its AccumulateGrad nodes in its
    // first backward, per stack.
    // (Not a reentrant checkpoint's detached inputs: they are activations.)
    let detached = crate::trace::reentrant_checkpoint_inputs(trace);
    let mut params = Vec::new();
    let mut seen = BTreeSet::new();
    for p in parts.iter().filter(|p| p.kind == Kind::Backward) {
        if !seen.insert(p.stack) {
            continue;
        }
        for (_, o) in trace.ops.iter().enumerate().filter(|(i, o)| {
            p.seg.holds(o.start.get())
                && trace.name(o.name) == crate::trace::ACCUMULATE_GRAD
                && !detached.contains(i)
        }) {
            if let Some(t) = trace.tensor_args_of(o).first() {
                let size = t.dtype.and_then(|d| d.size()).unwrap_or(4);
                params.push(i64::try_from(t.numel.saturating_mul(size)).unwrap_or(i64::MAX));
            }
        }
    }
    let loops = step_loops(trace, traced as usize, &params);
    let ts: Vec<i64> = trace.memory.iter().map(|m| m.ts.get()).collect();
    let seg = |(start, end): (i64, i64)| Seg { start, end };
    let (mut copied, mut ops) = (0usize, 0usize);
    let mut first_complete = loops.first_found;
    for run in &loops.runs {
        let (t, p) = (seg(run.template), seg(run.pred));
        let index = n_stacks + run.group;
        match part(
            trace,
            stack,
            index,
            Kind::Step,
            t,
            events_in(&ts, t),
            events_in(&ts, p),
        ) {
            Ok(found)
                if found.t2p.iter().filter(|x| x.is_some()).count() * 10 >= found.t2p.len() * 9 =>
            {
                copied += 1;
                ops += run.ops;
                parts.push(found);
            }
            _ => first_complete &= run.step != 0,
        }
    }
    let looped = loops
        .runs
        .iter()
        .map(|r| r.step)
        .collect::<BTreeSet<_>>()
        .len();
    if copied > 0 {
        warnings.push(Warning::new(
            "layers_optimizer_loop",
            format!("the optimizer step updates one parameter at a time: its loop over the last block's parameters ({ops} ops in {copied} run(s) over {looped} step(s)) was copied for every added block"),
        ));
    }
    let missing = loops.unmatched + loops.too_long + usize::from(copied < loops.runs.len());
    if missing > 0 {
        warnings.push(Warning::new(
            "layers_optimizer_unmatched",
            format!("in {missing} of {} optimizer steps the loop over the last block's parameters was not found (the block before it differs, or the step is too long to compare): the added blocks' share of those steps is sized from the parameters where the optimizer is torch.optim's, and is missing otherwise; a trace of one more block can show it", loops.steps),
        ));
    }
    !first_complete
}

/// Tokens beyond which a step is not searched (the search is quadratic).
const MAX_TOKENS: usize = 20_000;

/// The per-parameter loops of every `Optimizer.step` span, for a trace with
/// `n` traced blocks per stack whose last blocks have parameters of `params`
/// bytes (one entry per parameter).
pub(super) fn step_loops(trace: &Trace, n: usize, params: &[i64]) -> StepLoops {
    let steps = super::shape::optimizer_steps(trace);
    let mut out = StepLoops {
        steps: steps.len(),
        ..StepLoops::default()
    };
    if n < 2 {
        return out;
    }
    let mut ids: FxHashMap<(NameId, Vec<i64>), u32> = FxHashMap::default();
    for (s, &(start, end)) in steps.iter().enumerate() {
        let Some(ops) = top_level_ops(trace, start, end) else {
            out.foreach += 1;
            continue;
        };
        if ops.len() > MAX_TOKENS {
            out.too_long += 1;
            continue;
        }
        let tokens: Vec<u32> = ops
            .iter()
            .map(|&(_, name, ref dims)| {
                let next = u32::try_from(ids.len()).unwrap_or(u32::MAX);
                *ids.entry((name, dims.clone())).or_insert(next)
            })
            .collect();
        let mut found = Vec::new();
        repeats(&tokens, 0, tokens.len(), n, &mut found);
        let longest = found.iter().map(|r| r.1).max().unwrap_or(0);
        found.retain(|r| r.1.saturating_mul(4) >= longest);
        found.sort_unstable();
        let at = |i: usize| ops.get(i).map_or(end, |o| o.0);
        let runs: Vec<StepRun> = found
            .iter()
            .enumerate()
            .map(|(group, &(i, len))| {
                let t0 = i + (n - 1) * len;
                let p0 = t0 - len;
                StepRun {
                    template: (at(t0), at(t0 + len).saturating_sub(1).max(at(t0))),
                    pred: (at(p0), at(t0).saturating_sub(1).max(at(p0))),
                    group,
                    step: s,
                    ops: len,
                }
            })
            .collect();
        if runs.is_empty() {
            continue;
        }
        match per_parameter(trace, &runs, params) {
            None => continue,
            Some(false) => {
                out.unmatched += 1;
                continue;
            }
            Some(true) => {}
        }
        out.first_found |= s == 0;
        out.runs.extend(runs);
    }
    out
}

/// Whether the runs' templates allocate `c >= 1` tensors of each size of
/// `params` per parameter of that size (sizes no parameter has are left out:
/// scalars, reductions); `None` when they allocate none (an in-place step:
/// nothing to copy).
fn per_parameter(trace: &Trace, runs: &[StepRun], params: &[i64]) -> Option<bool> {
    let mut want: FxHashMap<i64, usize> = FxHashMap::default();
    for &p in params {
        *want.entry(p).or_default() += 1;
    }
    let mut got: FxHashMap<i64, usize> = FxHashMap::default();
    for m in &trace.memory {
        let t = m.ts.get();
        if m.bytes > 0
            && want.contains_key(&m.bytes)
            && runs.iter().any(|r| r.template.0 <= t && t <= r.template.1)
        {
            *got.entry(m.bytes).or_default() += 1;
        }
    }
    if got.is_empty() {
        return None;
    }
    let (&size, &count) = want.iter().next()?;
    let c = got.get(&size).copied().unwrap_or(0) / count;
    Some(
        c >= 1
            && want
                .iter()
                .all(|(s, &k)| got.get(s).copied().unwrap_or(0) == c * k),
    )
}

/// The step's top-level ops (start, name, argument dims) in time order, or
/// `None` when it runs a foreach or fused op (no per-parameter loop).
#[allow(clippy::type_complexity)]
fn top_level_ops(trace: &Trace, start: i64, end: i64) -> Option<Vec<(i64, NameId, Vec<i64>)>> {
    let mut inside: Vec<_> = trace
        .ops
        .iter()
        .filter(|o| start <= o.start.get() && o.start.get() <= end)
        .filter(|o| o.fwd_thread_id.is_none_or(|t| t <= 0))
        .collect();
    if inside.iter().any(|o| {
        let name = trace.name(o.name);
        name.starts_with("aten::_foreach_") || name.starts_with("aten::_fused_")
    }) {
        return None;
    }
    inside.sort_by_key(|o| (o.start, std::cmp::Reverse(o.dur)));
    let mut out = Vec::new();
    let mut open_until = i64::MIN;
    for o in inside {
        let s = o.start.get();
        if s < open_until {
            continue;
        }
        open_until = s.saturating_add(o.dur.get());
        let mut dims = Vec::new();
        for a in trace.tensor_args(o) {
            dims.push(-1 - i64::from(a.position));
            dims.extend_from_slice(trace.numbers(a.dims));
        }
        out.push((s, o.name, dims));
    }
    Some(out)
}

/// Adds to `found` the longest run of `n` equal pieces back to back in
/// `tokens[lo..hi]` (the latest of equally long ones) as (start, piece
/// length), then does the same on each side of it.
fn repeats(tokens: &[u32], lo: usize, hi: usize, n: usize, found: &mut Vec<(usize, usize)>) {
    let Some((i, len)) = longest_repeat(tokens, lo, hi, n) else {
        return;
    };
    found.push((i, len));
    repeats(tokens, lo, i, n, found);
    repeats(tokens, i + n * len, hi, n, found);
}

fn longest_repeat(tokens: &[u32], lo: usize, hi: usize, n: usize) -> Option<(usize, usize)> {
    let span = hi.checked_sub(lo)?;
    for len in (1..=span / n).rev() {
        let need = (n - 1) * len;
        let mut best = None;
        let mut run = 0usize;
        for x in lo..hi - len {
            if tokens.get(x) == tokens.get(x + len) {
                run += 1;
                if run >= need {
                    best = Some(x + 1 - need);
                }
            } else {
                run = 0;
            }
        }
        if let Some(i) = best {
            return Some((i, len));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(tokens: &[u32], n: usize) -> Vec<(usize, usize)> {
        let mut f = Vec::new();
        repeats(tokens, 0, tokens.len(), n, &mut f);
        f.sort_unstable();
        f
    }

    #[test]
    fn the_block_loop_is_the_longest_repeat() {
        // embedding (9), two blocks of [1 2 3 2 3], final norm (7 7), head (8)
        let t = [9, 1, 2, 3, 2, 3, 1, 2, 3, 2, 3, 7, 7, 8];
        let f = found(&t, 2);
        assert_eq!(f.first(), Some(&(1, 5)));
        // the norm's weight and bias repeat too, and are much shorter
        assert!(f.contains(&(11, 1)));
    }

    #[test]
    fn three_blocks_need_three_pieces() {
        let t = [5, 1, 2, 1, 2, 1, 2, 6];
        assert_eq!(found(&t, 3), vec![(1, 2)]);
        assert_eq!(found(&[5, 1, 2, 1, 2, 6], 3), vec![]);
    }

    #[test]
    fn of_equal_repeats_the_latest_is_taken() {
        // [4 4 4]: 2 pieces of 1 at 0 or at 1; the latest is the template's
        assert_eq!(found(&[4, 4, 4], 2), vec![(1, 1)]);
    }
}
