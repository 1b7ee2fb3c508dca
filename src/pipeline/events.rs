//! The simulated allocation sequence, event by event: what `memcast
//! events` prints, to set memcast's plan beside a real run's allocations
//! (`benches/gpu/align.py` against a CUDA profiler trace) and find the first
//! place where the two part.

use serde::{Deserialize, Serialize};

use crate::analyzer::Phase;
use crate::orchestrator::{Category, EventKind};
use crate::simulator::{GpuMemory, Runner};
use crate::units::{Bytes, Nanos};

use super::simulate::schedule_ops;
use super::{Config, Error, Prepared};

/// One event of the schedule and the allocator's state after it, on the
/// reference GPU without a memory limit (the run the report's timeline
/// shows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRow {
    /// The event's place in the schedule.
    pub index: u64,
    pub time: Nanos,
    pub kind: EventKind,
    /// The schedule's block the event allocates or frees.
    pub block: u64,
    /// The bytes requested on this GPU; 0 where its run makes no such block
    /// (another architecture's kernel, a workspace past the GPU's count),
    /// and for a free.
    pub bytes: Bytes,
    pub category: Category,
    /// The simulated iteration that allocates the block; `None` for setup.
    pub iteration: Option<u32>,
    pub phase: Phase,
    /// The innermost op that allocated the block, when known.
    pub op: Option<String>,
    /// The module that allocated it, when known.
    pub layer: Option<String>,
    /// Where the allocator put the block (a simulated device address:
    /// segments get ever higher ones): `None` for a free and for a block
    /// this GPU's run does not make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<u64>,
    /// Bytes in live blocks after the event.
    pub allocated: Bytes,
    /// Bytes in the allocator's segments after the event.
    pub reserved: Bytes,
}

/// The schedule of `prepared` on the reference GPU, event by event, with
/// the allocator's state after each; a streamed rebuilt job is expanded
/// first, or refused where it cannot be ([`Error::EventsStreamed`]).
pub fn event_rows(prepared: &Prepared, config: &Config) -> Result<Vec<EventRow>, Error> {
    let whole;
    let prepared = if prepared.program.is_some() {
        whole = prepared.held_whole().ok_or(Error::EventsStreamed)?;
        &whole
    } else {
        prepared
    };
    let allocator = config.allocator()?;
    let target = &config.reference;
    let schedule = &prepared.orchestrated.schedule;
    let (ops, through) = schedule_ops(schedule, target);
    let mut runner = Runner::new(&allocator, &GpuMemory::unlimited(), ops.len());
    let mut rows = Vec::with_capacity(schedule.events.len());
    let mut issued = 0usize;
    for (index, (event, &upto)) in schedule.events.iter().zip(&through).enumerate() {
        let mut bytes = Bytes::ZERO;
        let mut address = None;
        while issued < upto {
            let Some(op) = ops.get(issued) else { break };
            // An unlimited device refuses nothing; a request too large to
            // be a size at all ends the table there.
            if runner.step(issued, op).is_err() {
                return Ok(rows);
            }
            if let crate::simulator::SimOp::Alloc { block, size, .. } = op {
                bytes = *size;
                address = runner.address_of(*block);
            }
            issued += 1;
        }
        let Some(block) = schedule.block(event.block) else {
            continue;
        };
        let sample = runner.sample();
        rows.push(EventRow {
            index: index as u64,
            time: event.time,
            kind: event.kind,
            block: event.block.index() as u64,
            bytes,
            category: block.category,
            iteration: block.iteration,
            phase: block.phase,
            op: block.op.clone(),
            layer: block.layer.clone(),
            address,
            allocated: sample.allocated,
            reserved: sample.reserved,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small training trace's rows: one per schedule event, the highest
    /// reserved bytes the report's peak, the sizes the simulator was given,
    /// and an address for every block issued that no live block shares.
    #[test]
    fn rows_follow_the_schedule_and_the_allocator() {
        let bytes = include_bytes!("../../tests/fixtures/tiny_step.json");
        let config = Config::standard();
        let prepared = super::super::prepare(bytes, &config, &mut |_| {}).unwrap();
        let rows = event_rows(&prepared, &config).unwrap();
        let schedule = &prepared.orchestrated.schedule;
        assert_eq!(rows.len(), schedule.events.len());
        assert!(rows.iter().all(|row| row.reserved >= row.allocated));
        let peak = rows.iter().map(|row| row.reserved).max().unwrap();
        let report = super::super::estimate(&prepared, &config, &mut |_| {})
            .unwrap()
            .value;
        assert_eq!(peak, report.peak.reserved_bytes);
        let allocs = rows.iter().filter(|row| row.kind == EventKind::Alloc);
        assert!(allocs
            .clone()
            .all(|row| row.bytes > Bytes::ZERO || row.category == Category::Workspace));
        assert!(rows
            .iter()
            .filter(|row| row.kind == EventKind::Free)
            .all(|row| row.bytes == Bytes::ZERO && row.address.is_none()));
        let mut live = std::collections::BTreeMap::new();
        for row in &rows {
            match (row.kind, row.address) {
                (EventKind::Alloc, Some(address)) => {
                    assert!(row.bytes > Bytes::ZERO, "{row:?}");
                    assert!(live.values().all(|&a| a != address), "{row:?}");
                    live.insert(row.block, address);
                }
                (EventKind::Alloc, None) => assert_eq!(row.bytes, Bytes::ZERO, "{row:?}"),
                (EventKind::Free, _) => {
                    live.remove(&row.block);
                }
            }
        }
        assert!(!live.is_empty());
    }
}
