//! Block lifecycles: pairs each allocation with the next free of the same
//! address on the same device, in time order.

use std::collections::HashMap;

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

pub(crate) fn pair_blocks(trace: &Trace, origin: Nanos, warnings: &mut Vec<Warning>) -> Life {
    let mut events = Vec::with_capacity(trace.memory.len());
    let mut blocks: Vec<Block> = Vec::new();
    let mut unmatched_frees = Vec::new();
    // Lookups only; never iterated, so the hash order cannot leak into results.
    let mut live: HashMap<(Device, u64), usize> = HashMap::new();
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
