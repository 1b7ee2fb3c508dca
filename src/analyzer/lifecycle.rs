//! Block lifecycles: pairs each allocation with the next free of the same
//! address on the same device, in time order.

use rustc_hash::FxHashMap;

use super::{Block, BlockRole, MemoryRecord, Phase};
use crate::diag::Warning;
use crate::trace::{Device, Trace};
use crate::units::{Bytes, Nanos};

/// Blocks and events before attribution.
#[derive(Debug)]
pub(crate) struct Life {
    pub events: Vec<MemoryRecord>,
    pub blocks: Vec<Block>,
    pub unmatched_frees: Vec<usize>,
}

/// Pairs every `[memory]` allocation with its free by address, in time
/// order, into block lifetimes: an address allocated twice without a free
/// closes the first block, a free without an allocation is a free of
/// pre-profiling memory (`unmatched_frees`), and each block records the op,
/// time and event index of both ends. Warnings say how many of each oddity
/// were seen.
pub(crate) fn pair_blocks(trace: &Trace, origin: Nanos, warnings: &mut Vec<Warning>) -> Life {
    let mut events = Vec::with_capacity(trace.memory.len());
    let mut blocks: Vec<Block> = Vec::new();
    let mut unmatched_frees = Vec::new();
    // Lookups only; never iterated, so the hash order cannot leak into results.
    let mut live: FxHashMap<(Device, u64), usize> = FxHashMap::default();
    let mut n_realloc = 0_usize;
    let mut n_size_mismatch = 0_usize;
    let mut unmatched_bytes = 0_u64;

    for (event_idx, m) in trace.memory.iter().enumerate() {
        let ts = m.ts.saturating_sub(origin);
        let key = (m.device, m.addr);
        let block = if m.bytes > 0 {
            let id = blocks.len();
            if live.insert(key, id).is_some() {
                // The earlier block at this address is left without a free.
                n_realloc += 1;
            }
            blocks.push(Block {
                id,
                addr: m.addr,
                size: Bytes(m.bytes.unsigned_abs()),
                device: m.device,
                alloc_ts: ts,
                free_ts: None,
                alloc_event: event_idx,
                free_event: None,
                alloc_op: None,
                alloc_op_name: None,
                free_op: None,
                free_op_name: None,
                layer: None,
                alloc_iteration: None,
                alloc_phase: Phase::Other,
                free_iteration: None,
                free_phase: None,
                op_internal: false,
                internal_to: None,
                cpu_scratch: false,
                role: BlockRole::Other,
            });
            Some(id)
        } else {
            match live.remove(&key) {
                Some(id) => {
                    if let Some(block) = blocks.get_mut(id) {
                        block.free_ts = Some(ts);
                        block.free_event = Some(event_idx);
                        if block.size.get() != m.bytes.unsigned_abs() {
                            n_size_mismatch += 1;
                        }
                    }
                    Some(id)
                }
                None => {
                    unmatched_frees.push(event_idx);
                    unmatched_bytes = unmatched_bytes.saturating_add(m.bytes.unsigned_abs());
                    None
                }
            }
        };
        events.push(MemoryRecord {
            ts,
            tid: m.tid,
            addr: m.addr,
            delta: m.bytes,
            total_allocated: m.total_allocated,
            device: m.device,
            block,
            iteration: None,
            phase: Phase::Other,
        });
    }

    if !unmatched_frees.is_empty() {
        warnings.push(Warning::new(
            "free_of_unknown_block",
            format!(
                "{} frees ({unmatched_bytes} bytes) release memory allocated before profiling started; that memory is not in the trace's totals",
                unmatched_frees.len()
            ),
        ));
    }
    if n_realloc > 0 {
        warnings.push(Warning::new(
            "allocation_at_live_address",
            format!("{n_realloc} allocations reuse an address whose block was never freed; the earlier blocks are kept as never freed"),
        ));
    }
    if n_size_mismatch > 0 {
        warnings.push(Warning::new(
            "free_size_mismatch",
            format!("{n_size_mismatch} frees release a different number of bytes than their allocation; the allocation size is kept"),
        ));
    }
    Life {
        events,
        blocks,
        unmatched_frees,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::MemoryEvent;

    fn event(ts: i64, addr: u64, bytes: i64, device: Device) -> MemoryEvent {
        MemoryEvent {
            ts: Nanos(ts),
            tid: 1,
            addr,
            bytes,
            total_allocated: None,
            total_reserved: None,
            device,
            device_id: None,
        }
    }

    fn pair(events: Vec<MemoryEvent>) -> (Life, Vec<String>) {
        let trace = Trace {
            memory: events,
            ..Trace::default()
        };
        let mut warnings = Vec::new();
        let life = pair_blocks(&trace, Nanos(0), &mut warnings);
        (life, warnings.into_iter().map(|w| w.code).collect())
    }

    #[test]
    fn a_reused_address_starts_a_new_block() {
        let (life, warnings) = pair(vec![
            event(1, 7, 64, Device::Cpu),
            event(2, 7, -64, Device::Cpu),
            event(3, 7, 16, Device::Cpu),
        ]);
        assert!(warnings.is_empty());
        let sizes: Vec<(u64, Option<Nanos>)> = life
            .blocks
            .iter()
            .map(|b| (b.size.get(), b.free_ts))
            .collect();
        assert_eq!(sizes, [(64, Some(Nanos(2))), (16, None)]);
        assert_eq!(life.events[1].block, Some(0));
        assert_eq!(life.blocks[0].free_event, Some(1));
    }

    #[test]
    fn devices_have_separate_address_spaces() {
        let (life, _) = pair(vec![
            event(1, 7, 64, Device::Cpu),
            event(2, 7, 32, Device::Cuda),
            event(3, 7, -32, Device::Cuda),
        ]);
        assert_eq!(life.blocks[0].free_ts, None);
        assert_eq!(life.blocks[1].free_ts, Some(Nanos(3)));
    }

    #[test]
    fn odd_pairs_become_warnings() {
        let (life, warnings) = pair(vec![
            event(1, 9, -8, Device::Cpu),
            event(2, 7, 64, Device::Cpu),
            event(3, 7, 16, Device::Cpu),
            event(4, 7, -8, Device::Cpu),
        ]);
        assert_eq!(life.unmatched_frees, [0]);
        assert_eq!(life.events[0].block, None);
        assert_eq!(life.blocks.len(), 2);
        assert_eq!(life.blocks[0].free_ts, None);
        assert_eq!(life.blocks[1].size.get(), 16);
        assert_eq!(
            warnings,
            [
                "free_of_unknown_block",
                "allocation_at_live_address",
                "free_size_mismatch"
            ]
        );
    }
}
