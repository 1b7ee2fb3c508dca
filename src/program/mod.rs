//! The orchestrated job as the simulator and the report read it: a stream
//! of allocation and free events ([`JobRef::for_each`]), never required to
//! be held whole.
//!
//! A job is either a [`Schedule`] (the orchestrator's flat allocation
//! sequence) or a [`Program`]: a schedule described once with its repeated
//! parts (a block's copies, the decode steps), expanded as it streams, so
//! a rebuilt job of hundreds of millions of events is simulated in memory
//! bounded by its trace.
//!
//! Invariants: the events come in schedule order; a block is named by a
//! `u64` unique in the job, allocated once and freed at most once after.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::ControlFlow;

use crate::orchestrator::{
    Category, EventKind, IterationSpan, Phase, PhaseWindow, Schedule, ScheduledBlock,
};
use crate::units::{Bytes, Nanos};

/// One event of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobEvent {
    /// Nanoseconds since the start of the schedule.
    pub time: Nanos,
    pub kind: EventKind,
    /// The block it allocates or frees.
    pub block: u64,
    /// The block's requested size (for [`Category::Workspace`] a
    /// placeholder the simulation replaces).
    pub size: Bytes,
    pub category: Category,
    /// Where the block's other facts are ([`JobRef::block_facts`]).
    pub facts: FactsRef,
}

/// A handle on a block's facts (its op, layer, phase, iteration), read
/// only for the few blocks a report names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FactsRef {
    pub(crate) item: u32,
    pub(crate) x: i64,
    pub(crate) y: i64,
}

/// What a block is, besides its size and category.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockFacts {
    pub phase: Phase,
    pub iteration: Option<u32>,
    pub op: Option<String>,
    pub layer: Option<String>,
}

/// The job an estimate simulates.
#[derive(Debug, Clone, Copy)]
pub enum JobRef<'a> {
    Schedule(&'a Schedule),
}

impl<'a> JobRef<'a> {
    /// Events in the job.
    pub fn n_events(&self) -> u64 {
        match self {
            JobRef::Schedule(s) => s.events.len() as u64,
        }
    }

    /// Blocks in the job.
    pub fn n_blocks(&self) -> u64 {
        match self {
            JobRef::Schedule(s) => s.blocks.len() as u64,
        }
    }

    /// The times of the first and the last event.
    pub fn time_range(&self) -> Option<(Nanos, Nanos)> {
        match self {
            JobRef::Schedule(s) => Some((s.events.first()?.time, s.events.last()?.time)),
        }
    }

    /// The simulated iterations' spans.
    pub fn iterations(&self) -> Cow<'a, [IterationSpan]> {
        match self {
            JobRef::Schedule(s) => Cow::Borrowed(&s.iterations),
        }
    }

    /// The phases of every simulated iteration, in time order.
    pub fn phases(&self) -> Cow<'a, [PhaseWindow]> {
        match self {
            JobRef::Schedule(s) => Cow::Borrowed(&s.phases),
        }
    }

    /// Calls `f` with each event in order until it breaks.
    pub fn for_each(&self, f: &mut dyn FnMut(&JobEvent) -> ControlFlow<()>) {
        match self {
            JobRef::Schedule(s) => {
                for e in &s.events {
                    let Some(block) = s.block(e.block) else {
                        continue;
                    };
                    let event = JobEvent {
                        time: e.time,
                        kind: e.kind,
                        block: u64::from(e.block.0),
                        size: block.size,
                        category: block.category,
                        facts: FactsRef {
                            item: e.block.0,
                            x: 0,
                            y: 0,
                        },
                    };
                    if f(&event).is_break() {
                        return;
                    }
                }
            }
        }
    }

    /// The blocks live right after event `index`, as the events that
    /// allocated them, in allocation order; and that event itself.
    pub fn live_after(&self, index: u64) -> (Vec<JobEvent>, Option<JobEvent>) {
        let mut live: BTreeMap<u64, (u64, JobEvent)> = BTreeMap::new();
        let mut at = None;
        let mut position = 0u64;
        self.for_each(&mut |e| {
            match e.kind {
                EventKind::Alloc => {
                    live.insert(e.block, (position, *e));
                }
                EventKind::Free => {
                    live.remove(&e.block);
                }
            }
            if position == index {
                at = Some(*e);
                return ControlFlow::Break(());
            }
            position += 1;
            ControlFlow::Continue(())
        });
        let mut ordered: Vec<(u64, JobEvent)> = live.into_values().collect();
        ordered.sort_unstable_by_key(|&(position, e)| (position, e.block));
        (ordered.into_iter().map(|(_, e)| e).collect(), at)
    }

    /// The facts of the block `facts` names.
    pub fn block_facts(&self, facts: FactsRef) -> Option<BlockFacts> {
        match self {
            JobRef::Schedule(s) => s.blocks.get(facts.item as usize).map(ScheduledBlock::facts),
        }
    }
}

impl ScheduledBlock {
    fn facts(&self) -> BlockFacts {
        BlockFacts {
            phase: self.phase,
            iteration: self.iteration,
            op: self.op.clone(),
            layer: self.layer.clone(),
        }
    }
}
