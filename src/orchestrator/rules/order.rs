//! The order of the schedule's events: every allocation and free gets a
//! [`Key`], and the schedule is sorted by it.

use crate::units::Nanos;

/// Where an event goes among the events of the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Tier {
    /// Before the captured events: setup blocks, gradient frees moved to the
    /// start of a `zero_grad`, a pass's cuBLAS workspace at the pass's start.
    BeforeTrace,
    /// The captured events, in trace order.
    Trace,
    /// After the captured events: synthetic blocks and moved frees (a
    /// batch's hand-over, the foreach lists).
    AfterTrace,
}

/// Orders events that share a time: by [`Tier`], then by `rank` within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub time: Nanos,
    pub tier: Tier,
    pub rank: u64,
}

/// Ranks of the frees of the foreach lists sort after every foreach
/// allocation of the same step (whose ranks count up from 0).
pub(crate) const FOREACH_FREE_RANK: u64 = 1 << 40;

impl Key {
    /// The `position`-th setup allocation (`model.to(device)` order).
    pub(crate) fn setup(position: u64) -> Key {
        Key {
            time: Nanos::ZERO,
            tier: Tier::BeforeTrace,
            rank: position,
        }
    }

    /// A captured event: the trace's event index `event` in `copy` of the
    /// repeated iteration (0 for the captured iterations themselves), so
    /// copies of one event keep their order.
    pub(crate) fn captured(time: Nanos, copy: u64, event: usize) -> Key {
        Key {
            time,
            tier: Tier::Trace,
            rank: captured_rank(copy, event),
        }
    }

    /// An event placed before the captured events of `time`.
    pub(crate) fn before_trace(time: Nanos, rank: u64) -> Key {
        Key {
            time,
            tier: Tier::BeforeTrace,
            rank,
        }
    }

    /// An event placed after the captured events of `time`.
    pub(crate) fn after_trace(time: Nanos, rank: u64) -> Key {
        Key {
            time,
            tier: Tier::AfterTrace,
            rank,
        }
    }
}

/// The rank of event `event` in `copy` of the repeated iteration: the copy
/// in the high 32 bits, the event index in the low ones.
pub(crate) fn captured_rank(copy: u64, event: usize) -> u64 {
    (copy << 32) | event as u64
}
