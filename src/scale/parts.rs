//! The parts of a repeated block that `--layers` copies — each call's
//! forward, its backward, its loop in a per-parameter optimizer step —
//! each aligned with the same part of the block before it (the
//! *predecessor*), by which the tensors crossing blocks are linked.

use super::align::align;
use super::copy::Seg;
use super::frames::Stack;
use super::ScaleError;
use crate::trace::Trace;

/// Forward or backward part of one call of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Kind {
    Forward,
    Backward,
    /// The optimizer step's loop over the block's parameters
    /// ([`super::step`]), copied after itself like a forward call.
    Step,
}

/// One copied segment of the template, with the predecessor's matching part.
#[derive(Debug, Clone)]
pub(super) struct Part {
    pub stack: usize,
    pub kind: Kind,
    pub seg: Seg,
    /// The template's `[memory]` events in it (indices into `Trace::memory`).
    pub events: Vec<usize>,
    /// The predecessor's events of the same part.
    pub pred: Vec<usize>,
    /// Alignment: template position → predecessor position, and back.
    pub t2p: Vec<Option<usize>>,
    pub p2t: Vec<Option<usize>>,
}

/// The `[memory]` events (sorted times `ts`) inside `seg`.
pub(super) fn events_in(ts: &[i64], seg: Seg) -> Vec<usize> {
    let lo = ts.partition_point(|&x| x < seg.start);
    let hi = ts.partition_point(|&x| x <= seg.end);
    (lo..hi).collect()
}

/// Aligns a template part with the predecessor's (the same allocation and
/// free sizes in the same order; the predecessor may have more).
pub(super) fn part(
    trace: &Trace,
    stack: &Stack,
    index: usize,
    kind: Kind,
    seg: Seg,
    events: Vec<usize>,
    pred: Vec<usize>,
) -> Result<Part, ScaleError> {
    let token = |e: &usize| trace.memory.get(*e).map(|m| m.bytes);
    let a: Vec<Option<i64>> = events.iter().map(token).collect();
    let b: Vec<Option<i64>> = pred.iter().map(token).collect();
    let (t2p, p2t) = align(&a, &b).ok_or_else(|| ScaleError::BlocksDiffer {
        block: stack.class.clone(),
        reason: format!(
            "its calls are too large to compare ({} and {} allocations)",
            a.len(),
            b.len()
        ),
    })?;
    let matched = t2p.iter().filter(|x| x.is_some()).count();
    if kind == Kind::Forward && matched * 10 < a.len() * 9 {
        return Err(ScaleError::BlocksDiffer {
            block: stack.class.clone(),
            reason: format!(
                "only {matched} of the last block's {} allocations match the block before it (alternating layer kinds repeat with a period, which memcast does not rebuild yet)",
                a.len()
            ),
        });
    }
    Ok(Part {
        stack: index,
        kind,
        seg,
        events,
        pred,
        t2p,
        p2t,
    })
}
