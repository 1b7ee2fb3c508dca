//! The allocator state at the start of a recording: rebuilt backwards from
//! the final segments (replay-notes §1), repaired by teacher forcing (§3),
//! loaded into a simulator.

use std::collections::{BTreeMap, HashMap};

use super::read::{Action, DeviceRecording};
use crate::replay::{ReplayError, StartStateRepair};
use crate::simulator::{
    AllocatorConfig, BlockHandle, CachingAllocator, GpuMemory, PoolKind, SegmentLayout,
    LARGE_BUFFER, SMALL_BUFFER, SMALL_SIZE,
};
use crate::units::Bytes;

/// A pre-trace block whose size had to be inferred.
#[derive(Debug, Clone, Copy)]
pub(super) struct Inferred {
    pub(super) size: u64,
}

/// The allocator state at the start of the recording.
pub(super) struct StartState {
    pub(super) layouts: Vec<SegmentLayout>,
    /// Addresses of occupied blocks, in layout order, per layout.
    pub(super) occupied_addrs: Vec<Vec<u64>>,
    pub(super) inferred: BTreeMap<u64, Inferred>,
    pub(super) reserved: u64,
    pub(super) complete: bool,
    pub(super) inconsistencies: u64,
}

/// Rebuilds the allocator state at the start of a device's recording by
/// walking the trace backwards from the final `segments` (replay-notes §1):
/// an `alloc` seen backwards frees its block, a `free_completed` makes it
/// occupied again, segment events remove or add whole segments. Blocks
/// occupied before the recording whose size the trace never shows are
/// inferred from the gaps they leave; `repairs` (address → bytes) grows those
/// whose unsplit remainder [`repair_pass`] found (§3). Returns the segments as
/// layouts to load into the simulator, the addresses of their occupied
/// blocks, and how complete and consistent the rebuilt state is. One
/// function because the backward walk and the inference share the same
/// occupied/segment maps.
pub(super) fn rebuild_start(
    dev: &DeviceRecording,
    config: &AllocatorConfig,
    repairs: &BTreeMap<u64, u64>,
) -> StartState {
    #[derive(Clone, Copy)]
    struct Occ {
        size: Option<u64>,
        requested: u64,
    }
    #[derive(Clone, Copy)]
    struct Seg {
        size: u64,
        stream: u32,
        pool: PoolKind,
        expandable: bool,
    }
    let mut occupied: BTreeMap<u64, Occ> = BTreeMap::new();
    let mut segs: BTreeMap<u64, Seg> = BTreeMap::new();
    for s in &dev.segments {
        segs.insert(
            s.addr,
            Seg {
                size: s.size,
                stream: s.stream,
                pool: s.pool,
                expandable: s.expandable,
            },
        );
        for b in s.blocks.iter().filter(|b| b.occupied) {
            occupied.insert(
                b.addr,
                Occ {
                    size: Some(b.size),
                    requested: b.requested,
                },
            );
        }
    }
    let mut inconsistencies = 0u64;
    for e in dev.entries.iter().rev() {
        match e.action {
            Action::Alloc => {
                if occupied.remove(&e.addr).is_none() {
                    inconsistencies += 1;
                }
            }
            Action::FreeCompleted => {
                let occ = Occ {
                    size: None,
                    requested: e.size,
                };
                if occupied.insert(e.addr, occ).is_some() {
                    inconsistencies += 1;
                }
            }
            Action::SegmentAlloc => {
                if segs.remove(&e.addr).is_none() {
                    inconsistencies += 1;
                }
            }
            Action::SegmentFree => {
                let pool = if e.size <= SMALL_BUFFER {
                    PoolKind::Small
                } else {
                    PoolKind::Large
                };
                let seg = Seg {
                    size: e.size,
                    stream: e.stream,
                    pool,
                    expandable: false,
                };
                if segs.insert(e.addr, seg).is_some() {
                    inconsistencies += 1;
                }
            }
            Action::SegmentMap => {
                // Before the mapping, [addr, addr + size) was unmapped.
                let found = segs
                    .range(..=e.addr)
                    .next_back()
                    .map(|(&a, &g)| (a, g))
                    .filter(|&(a, g)| g.expandable && e.addr + e.size <= a + g.size);
                let Some((start, seg)) = found else {
                    inconsistencies += 1;
                    continue;
                };
                segs.remove(&start);
                if e.addr > start {
                    segs.insert(
                        start,
                        Seg {
                            size: e.addr - start,
                            ..seg
                        },
                    );
                }
                let end = start + seg.size;
                if end > e.addr + e.size {
                    segs.insert(
                        e.addr + e.size,
                        Seg {
                            size: end - e.addr - e.size,
                            ..seg
                        },
                    );
                }
            }
            Action::SegmentUnmap => {
                // Before the unmapping, the range was mapped: merge it with
                // mapped neighbours of the same expandable segment.
                let mut start = e.addr;
                let mut size = e.size;
                let mut like: Option<Seg> = None;
                if let Some((&a, &g)) = segs.range(..e.addr).next_back() {
                    if g.expandable && g.stream == e.stream && a + g.size == e.addr {
                        segs.remove(&a);
                        start = a;
                        size += g.size;
                        like = Some(g);
                    }
                }
                if let Some(&g) = segs.get(&(e.addr + e.size)) {
                    if g.expandable && g.stream == e.stream {
                        segs.remove(&(e.addr + e.size));
                        size += g.size;
                        like = like.or(Some(g));
                    }
                }
                let pool = like.map_or(
                    if e.size % LARGE_BUFFER == 0 {
                        PoolKind::Large
                    } else {
                        PoolKind::Small
                    },
                    |g| g.pool,
                );
                segs.insert(
                    start,
                    Seg {
                        size,
                        stream: e.stream,
                        pool,
                        expandable: true,
                    },
                );
            }
            Action::FreeRequested | Action::Oom | Action::Other => {}
        }
    }
    let mut layouts = Vec::new();
    let mut occupied_addrs = Vec::new();
    let mut inferred = BTreeMap::new();
    let mut reserved = 0u64;
    let mut placed = 0usize;
    for (&addr, seg) in &segs {
        reserved = reserved.saturating_add(seg.size);
        let end = addr + seg.size;
        let inside: Vec<(u64, Occ)> = occupied.range(addr..end).map(|(&a, &o)| (a, o)).collect();
        placed += inside.len();
        let mut blocks = Vec::new();
        let mut addrs = Vec::new();
        let mut at = addr;
        for (i, &(a, occ)) in inside.iter().enumerate() {
            let next_start = inside.get(i + 1).map_or(end, |&(n, _)| n);
            if a < at {
                inconsistencies += 1;
                continue;
            }
            if a > at {
                blocks.push((a - at, false, 0));
            }
            let size = match occ.size {
                Some(s) => s,
                None => {
                    let mut s = config.round_size(occ.requested);
                    let gap = next_start.saturating_sub(a + s);
                    // An unsplit remainder: large-pool free blocks are > 1 MiB.
                    if seg.pool == PoolKind::Large
                        && !seg.expandable
                        && gap > 0
                        && gap <= SMALL_SIZE
                    {
                        s += gap;
                    }
                    // An oversize block (≥ max_split_size) is never split: it
                    // is its whole segment, up to the oversize tolerance.
                    let oversize = config.max_split_size.is_some_and(|m| s >= m.get());
                    if oversize
                        && !seg.expandable
                        && gap > SMALL_SIZE
                        && gap < config.max_non_split_rounding.get()
                    {
                        s += gap;
                    }
                    s += repairs.get(&a).copied().unwrap_or(0);
                    inferred.insert(a, Inferred { size: s });
                    s
                }
            };
            let size = size.min(next_start - a);
            blocks.push((size, true, occ.requested));
            addrs.push(a);
            at = a + size;
        }
        if at < end {
            blocks.push((end - at, false, 0));
        }
        layouts.push(SegmentLayout {
            addr,
            size: seg.size,
            stream: seg.stream,
            pool: seg.pool,
            expandable: seg.expandable,
            blocks,
        });
        occupied_addrs.push(addrs);
    }
    inconsistencies += (occupied.len() - placed) as u64;
    let complete = segs.is_empty() && occupied.is_empty();
    StartState {
        layouts,
        occupied_addrs,
        inferred,
        reserved,
        complete,
        inconsistencies,
    }
}

impl StartState {
    /// Whether a teacher-forced pass can repair anything: some inferred
    /// block lies in a large-pool, non-expandable segment, the only place an
    /// unsplit remainder can hide (small-pool and expandable blocks are split
    /// down to 512 B).
    pub(super) fn repairable(&self) -> bool {
        self.layouts
            .iter()
            .zip(&self.occupied_addrs)
            .filter(|(l, _)| l.pool == PoolKind::Large && !l.expandable)
            .any(|(_, addrs)| addrs.iter().any(|a| self.inferred.contains_key(a)))
    }

    /// A simulator holding this state, and the handle of every occupied block
    /// by address.
    pub(super) fn load(
        &self,
        config: &AllocatorConfig,
    ) -> Result<(CachingAllocator, HashMap<u64, BlockHandle>), ReplayError> {
        let mut sim = CachingAllocator::new(config.clone(), GpuMemory::unlimited());
        let mut live: HashMap<u64, BlockHandle> = HashMap::new();
        // Expandable mapped ranges of one pool and stream share a virtual range
        // (one expandable segment per pool and stream, allocator.md §9.1).
        let mut groups: BTreeMap<(u32, u8), (Vec<SegmentLayout>, Vec<u64>)> = BTreeMap::new();
        for (layout, addrs) in self.layouts.iter().zip(&self.occupied_addrs) {
            if layout.expandable {
                let pool = u8::from(layout.pool == PoolKind::Large);
                let g = groups.entry((layout.stream, pool)).or_default();
                g.0.push(layout.clone());
                g.1.extend(addrs);
                continue;
            }
            let handles = sim
                .load_segment(layout)
                .map_err(|e| ReplayError::StartState(e.to_string()))?;
            for (a, &addr) in handles.iter().zip(addrs) {
                live.insert(addr, a.handle);
            }
        }
        for ((stream, _), (ranges, addrs)) in &groups {
            let Some(first) = ranges.first() else {
                continue;
            };
            let handles = sim
                .load_expandable(first.addr, first.pool, *stream, ranges)
                .map_err(|e| ReplayError::StartState(e.to_string()))?;
            for (a, &addr) in handles.iter().zip(addrs) {
                live.insert(addr, a.handle);
            }
        }
        Ok((sim, live))
    }
}

/// The teacher-forced pass (replay-notes §1, §3): replays the trace with
/// every allocation placed where the real allocator placed it
/// ([`CachingAllocator::malloc_at`]), every real new segment created and
/// every real segment free applied, so the simulated state is the real one
/// but for the rebuilt block sizes. A real allocation that lands within
/// 1 MiB after the end of a live pre-trace block of inferred size, inside
/// what the rebuild believed was cached space, shows that the block is
/// larger: in the large pool a cached block is never 1 MiB or less, so the
/// space between is the block's unsplit remainder. Returns those repairs
/// and how many allocations could not be placed at their real address.
pub(super) fn repair_pass(
    dev: &DeviceRecording,
    config: &AllocatorConfig,
    start: &StartState,
) -> Result<(Vec<StartStateRepair>, u64), ReplayError> {
    let (mut sim, mut live) = start.load(config)?;
    let mut inferred_live = start.inferred.clone();
    let mut found: Vec<StartStateRepair> = Vec::new();
    let mut pending_segment: Option<(u64, u64)> = None;
    let mut pending_map: Option<(u64, u64)> = None;
    let mut unplaced = 0u64;
    let mut prev_action = Action::Other;
    for (index, e) in dev.entries.iter().enumerate() {
        match e.action {
            Action::SegmentAlloc => pending_segment = Some((e.addr, e.size)),
            Action::SegmentMap => pending_map = pending_map.or(Some((e.addr, e.size))),
            Action::SegmentFree => {
                let _ = sim.release_segment_at(e.addr);
            }
            // Expandable segments unmap only in release_cached_blocks.
            Action::SegmentUnmap if prev_action != Action::SegmentUnmap => {
                sim.release_cached_blocks();
            }
            Action::Alloc => {
                let segment = pending_segment.take();
                let handle = match sim.malloc_at(Bytes(e.size), e.stream, e.addr, segment) {
                    Some(forced) => {
                        let gap = e.addr - forced.cached_from;
                        let before = inferred_live.range(..forced.cached_from).next_back();
                        if let Some((&block, inferred)) = before {
                            let ends_here =
                                block.saturating_add(inferred.size) == forced.cached_from;
                            // The first evidence per block; later allocations
                            // at the same place (the block is not grown during
                            // the pass) show the same remainder.
                            let new = !found.iter().any(|r| r.block_addr == block);
                            if ends_here && gap > 0 && gap <= SMALL_SIZE && new {
                                found.push(StartStateRepair {
                                    block_addr: block,
                                    inferred_bytes: Bytes(inferred.size),
                                    grown_by_bytes: Bytes(gap),
                                    event_index: index as u64,
                                    alloc_addr: e.addr,
                                    alloc_request_bytes: Bytes(e.size),
                                });
                            }
                        }
                        Some(forced.allocation.handle)
                    }
                    None => {
                        // Expandable pages, or a state that disagrees with
                        // the recording: let the simulator decide.
                        unplaced += 1;
                        sim.set_next_segment_address(segment.or(pending_map).map(|(a, _)| a));
                        let placed = sim.malloc(Bytes(e.size), e.stream).ok();
                        sim.set_next_segment_address(None);
                        placed.map(|a| a.handle)
                    }
                };
                pending_map = None;
                if let Some(h) = handle {
                    live.insert(e.addr, h);
                }
            }
            Action::FreeCompleted => {
                if let Some(h) = live.remove(&e.addr) {
                    inferred_live.remove(&e.addr);
                    let _ = sim.free(h);
                }
            }
            _ => {}
        }
        prev_action = e.action;
    }
    Ok((found, unplaced))
}
