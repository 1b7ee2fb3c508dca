//! The stateful caching allocator: pools, best fit, splitting, coalescing,
//! the release-and-retry path, expandable segments (allocator.md §1–§9).
//!
//! Blocks live in an arena (`Vec<Block>`) linked per segment in address order.
//! Each pool keeps its free mapped blocks in a `BTreeMap` keyed by
//! `(stream, size, address)`, so best fit is one `range` lookup; expandable
//! segments keep their unmapped blocks in a second map keyed by
//! `(stream, address)`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::{round_up, AllocatorConfig, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
use super::device::Device;
use super::Stats;
use crate::units::Bytes;

const NIL: u32 = u32::MAX;
const GIB: u64 = Bytes::GIB;
/// First synthetic segment address (an arbitrary, recognisable base).
const SYNTHETIC_BASE: u64 = 0x7f00_0000_0000;
/// Virtual range reserved per expandable segment when the device is unlimited.
const UNLIMITED_VA: u64 = 1 << 40;
/// Largest request the simulator serves (1 PiB); larger ones are out of
/// memory on any device, and the bound keeps all byte and address arithmetic
/// far from overflow.
pub const MAX_REQUEST: u64 = 1 << 50;
/// Synthetic addresses stay below this; past it `cudaMalloc` fails.
const ADDRESS_LIMIT: u64 = 1 << 62;

/// Which of the two default pools a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PoolKind {
    /// Rounded sizes ≤ 1 MiB, 2 MiB segments.
    Small,
    /// Rounded sizes > 1 MiB.
    Large,
}

impl PoolKind {
    fn index(self) -> usize {
        match self {
            PoolKind::Small => 0,
            PoolKind::Large => 1,
        }
    }

    /// The pool a rounded size is served from.
    pub fn for_rounded(rounded: u64) -> PoolKind {
        if rounded <= SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }
}

/// An opaque reference to an allocated block, valid until it is freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockHandle(u32);

/// A block handed out by [`CachingAllocator::malloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub handle: BlockHandle,
    /// Device address of the block.
    pub addr: u64,
    /// Block size (rounded, possibly with an unsplit remainder).
    pub size: Bytes,
}

/// A device-level change made by the allocator, in the order it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SegmentChange {
    /// `cudaMalloc` of a new segment.
    Alloc { addr: u64, size: u64 },
    /// `cudaFree` of a segment.
    Free { addr: u64, size: u64 },
    /// Pages mapped into an expandable segment.
    Map { addr: u64, size: u64 },
    /// Pages unmapped from an expandable segment.
    Unmap { addr: u64, size: u64 },
}

/// Why a `malloc` failed: the allocator raised `OutOfMemoryError` after
/// releasing what it could (those releases are not undone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutOfMemory {
    /// The request as the caller made it.
    pub requested: Bytes,
    /// The request after `round_size`.
    pub rounded: Bytes,
    /// The segment size the allocator tried to obtain (`Tried to allocate`).
    pub segment_size: Bytes,
    /// How many more bytes the last attempt needed.
    pub missing: Bytes,
    /// Reserved bytes after the failed call.
    pub reserved: Bytes,
    /// Allocated bytes after the failed call.
    pub allocated: Bytes,
}

/// A free of a handle that is not an allocated block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "free of a block that is not allocated; free each allocation exactly once, got handle {0:?}"
)]
pub struct NotAllocated(pub BlockHandle);

/// One block of a segment as seen in a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockView {
    pub addr: u64,
    pub size: u64,
    pub allocated: bool,
}

/// One segment (or, for expandable segments, one contiguous mapped range) as
/// `torch.cuda.memory_snapshot()` would list it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentView {
    pub addr: u64,
    pub size: u64,
    pub stream: u32,
    pub pool: PoolKind,
    pub expandable: bool,
    pub blocks: Vec<BlockView>,
}

/// A segment to load into the allocator (e.g. the state at the start of a
/// recording): its blocks must tile `[addr, addr + size)` in address order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentLayout {
    pub addr: u64,
    pub size: u64,
    pub stream: u32,
    pub pool: PoolKind,
    pub expandable: bool,
    /// `(size, occupied, requested)` per block, in address order.
    pub blocks: Vec<(u64, bool, u64)>,
}

/// A layout that cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("segment blocks do not add up to the segment size; pass blocks that tile the segment, got segment at {0:#x}")]
    BlocksDoNotTile(u64),
    #[error("segment overlaps one already loaded; load each segment once, got segment at {0:#x}")]
    Overlap(u64),
}

#[derive(Debug, Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
    requested: u64,
    stream: u32,
    pool: PoolKind,
    allocated: bool,
    mapped: bool,
    /// Index into `expandable` for blocks of expandable segments, else NIL.
    seg: u32,
    prev: u32,
    next: u32,
    gc_base: u64,
}

impl Block {
    fn whole(&self) -> bool {
        self.prev == NIL && self.next == NIL
    }
}

/// The free-set key: `(stream, size, address)` packed into one `u128` so the
/// ordered map compares and moves 16-byte keys. Streams are dense internal
/// indices (clamped to 16 bits) and sizes are clamped to 48 bits (256 TiB);
/// lookups verify the block's own stream, so clamping can only make a lookup
/// miss, never hand out another stream's block.
fn free_key(stream: u32, size: u64, addr: u64) -> u128 {
    let st = u128::from(stream.min(0xffff));
    let sz = u128::from(size.min((1 << 48) - 1));
    (st << 112) | (sz << 64) | u128::from(addr)
}

#[derive(Debug, Clone, Default)]
struct Pool {
    free: BTreeMap<u128, u32>,
    unmapped: BTreeMap<(u32, u64), u32>,
    gc_clock: u64,
}

#[derive(Debug, Clone)]
struct ExpandableSegment {
    base: u64,
    page: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    allocated: u64,
    reserved: u64,
    active: u64,
    requested: u64,
    segments: u64,
    mapped_ranges: u64,
    allocations: u64,
}

/// PyTorch's `DeviceCachingAllocator` for one device, default pools only.
///
/// Addresses of new segments are synthetic unless the caller supplies the
/// real one with [`CachingAllocator::set_next_segment_address`] (used by the
/// replay, where `cudaMalloc` addresses are an input, not a decision).
#[derive(Debug, Clone)]
pub struct CachingAllocator {
    config: AllocatorConfig,
    device: Device,
    memory_limit: Option<u64>,
    blocks: Vec<Block>,
    spare: Vec<u32>,
    pools: [Pool; 2],
    expandable: Vec<ExpandableSegment>,
    now: Counters,
    peak: Counters,
    peak_largest_free: u64,
    peak_fragmentation: u64,
    num_alloc_retries: u64,
    num_ooms: u64,
    num_device_alloc: u64,
    num_device_free: u64,
    next_addr: u64,
    next_segment_address: Option<u64>,
    record_changes: bool,
    changes: Vec<SegmentChange>,
    shortfall: u64,
    /// External stream ids by internal index (blocks store the index).
    streams: Vec<u32>,
}

impl CachingAllocator {
    /// An empty allocator.
    pub fn new(config: AllocatorConfig, device: Device) -> CachingAllocator {
        let memory_limit = device.memory_limit.map(Bytes::get).or_else(|| {
            let fraction = config.per_process_memory_fraction?;
            let capacity = device.capacity?.get();
            // PyTorch computes `fraction * total` in double and truncates.
            Some((fraction * capacity as f64) as u64)
        });
        CachingAllocator {
            config,
            device,
            memory_limit,
            blocks: Vec::new(),
            spare: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            expandable: Vec::new(),
            now: Counters::default(),
            peak: Counters::default(),
            peak_largest_free: 0,
            peak_fragmentation: 0,
            num_alloc_retries: 0,
            num_ooms: 0,
            num_device_alloc: 0,
            num_device_free: 0,
            next_addr: SYNTHETIC_BASE,
            next_segment_address: None,
            record_changes: false,
            changes: Vec::new(),
            shortfall: 0,
            streams: Vec::new(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Current reserved bytes (cheap; no free-block scan).
    pub fn reserved(&self) -> Bytes {
        Bytes(self.now.reserved)
    }

    /// Current allocated bytes (cheap).
    pub fn allocated(&self) -> Bytes {
        Bytes(self.now.allocated)
    }

    /// Records every [`SegmentChange`] from now on, to be collected with
    /// [`CachingAllocator::take_segment_changes`].
    pub fn record_segment_changes(&mut self, on: bool) {
        self.record_changes = on;
    }

    /// The segment changes recorded since the last call.
    pub fn take_segment_changes(&mut self) -> Vec<SegmentChange> {
        std::mem::take(&mut self.changes)
    }

    /// The address the next `cudaMalloc` returns (one use; `None` = synthetic).
    pub fn set_next_segment_address(&mut self, addr: Option<u64>) {
        self.next_segment_address = addr;
    }

    /// The address of an allocated block.
    pub fn block_addr(&self, handle: BlockHandle) -> Option<u64> {
        self.blocks
            .get(handle.0 as usize)
            .filter(|b| b.allocated)
            .map(|b| b.addr)
    }

    /// The size of an allocated block.
    pub fn block_size(&self, handle: BlockHandle) -> Option<u64> {
        self.blocks
            .get(handle.0 as usize)
            .filter(|b| b.allocated)
            .map(|b| b.size)
    }

    /// The statistics now (O(streams · log blocks)).
    pub fn stats(&self) -> Stats {
        self.make_stats(&self.now, self.largest_free_block())
    }

    /// The largest cached free block: the last entry of each stream's range
    /// in each pool's size-ordered free set.
    pub fn largest_free_block(&self) -> u64 {
        let mut largest = 0;
        for pool in &self.pools {
            for stream in 0..self.streams.len().max(1) as u32 {
                let below_next = free_key(stream.saturating_add(1), 0, 0);
                let top = if stream >= 0xffff {
                    pool.free.iter().next_back()
                } else {
                    pool.free.range(..below_next).next_back()
                };
                if let Some((_, &id)) = top {
                    if self.b(id).stream == stream {
                        largest = largest.max(self.b(id).size);
                    }
                }
            }
        }
        largest
    }

    /// The peak of each statistic since the allocator was created.
    /// `largest_free_block` is the largest block ever left cached at the end
    /// of an operation (transient merges inside one `malloc` do not count).
    pub fn peak_stats(&self) -> Stats {
        let mut s = self.make_stats(&self.peak, self.peak_largest_free);
        s.fragmentation = Bytes(self.peak_fragmentation);
        s
    }

    fn make_stats(&self, c: &Counters, largest: u64) -> Stats {
        Stats {
            allocated: Bytes(c.allocated),
            reserved: Bytes(c.reserved),
            active: Bytes(c.active),
            requested: Bytes(c.requested),
            segments: c.segments + c.mapped_ranges,
            allocations: c.allocations,
            largest_free_block: Bytes(largest),
            fragmentation: Bytes(c.reserved.saturating_sub(c.allocated)),
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            num_device_alloc: self.num_device_alloc,
            num_device_free: self.num_device_free,
        }
    }

    fn bump_peaks(&mut self) {
        let (n, p) = (&self.now, &mut self.peak);
        p.allocated = p.allocated.max(n.allocated);
        p.reserved = p.reserved.max(n.reserved);
        p.active = p.active.max(n.active);
        p.requested = p.requested.max(n.requested);
        p.segments = p.segments.max(n.segments);
        p.mapped_ranges = p.mapped_ranges.max(n.mapped_ranges);
        p.allocations = p.allocations.max(n.allocations);
    }

    // ----- arena ---------------------------------------------------------

    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(id) = self.spare.pop() {
            if let Some(slot) = self.blocks.get_mut(id as usize) {
                *slot = b;
                return id;
            }
        }
        self.blocks.push(b);
        (self.blocks.len() - 1) as u32
    }

    fn drop_block(&mut self, id: u32) {
        if let Some(b) = self.blocks.get_mut(id as usize) {
            b.allocated = false;
            b.size = 0;
            b.prev = NIL;
            b.next = NIL;
            self.spare.push(id);
        }
    }

    fn b(&self, id: u32) -> &Block {
        // Ids come only from the arena's own links and maps.
        &self.blocks[id as usize]
    }

    fn bm(&mut self, id: u32) -> &mut Block {
        &mut self.blocks[id as usize]
    }

    fn insert_free(&mut self, id: u32, count_peak: bool) {
        let b = &self.blocks[id as usize];
        let (pool, key) = (b.pool.index(), free_key(b.stream, b.size, b.addr));
        let size = b.size;
        let clock = self.pools[pool].gc_clock;
        self.pools[pool].free.insert(key, id);
        if count_peak {
            self.peak_largest_free = self.peak_largest_free.max(size);
        }
        self.bm(id).gc_base = clock;
    }

    fn remove_free(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        let (pool, key) = (b.pool.index(), free_key(b.stream, b.size, b.addr));
        self.pools[pool].free.remove(&key);
    }

    fn link_after(&mut self, prev: u32, id: u32) {
        if prev != NIL {
            self.bm(prev).next = id;
        }
    }

    fn link_before(&mut self, next: u32, id: u32) {
        if next != NIL {
            self.bm(next).prev = id;
        }
    }

    /// A fresh synthetic segment address, or `None` once the synthetic
    /// address space is used up.
    fn synthetic_address(&mut self, size: u64) -> Option<u64> {
        let base = round_up(self.next_addr, SMALL_BUFFER);
        let end = base.saturating_add(size);
        if end > ADDRESS_LIMIT {
            return None;
        }
        self.next_addr = end.saturating_add(GIB);
        Some(base)
    }

    fn log(&mut self, change: SegmentChange) {
        if self.record_changes {
            self.changes.push(change);
        }
    }

    /// The dense internal index of an external stream id.
    fn stream_index(&mut self, stream: u32) -> u32 {
        if let Some(i) = self.streams.iter().position(|&s| s == stream) {
            return i as u32;
        }
        self.streams.push(stream);
        (self.streams.len() - 1) as u32
    }

    fn stream_id(&self, index: u32) -> u32 {
        self.streams.get(index as usize).copied().unwrap_or(index)
    }

    fn gc_enabled(&self) -> bool {
        self.memory_limit.is_some() && self.config.garbage_collection_threshold.is_some()
    }

    // ----- malloc ---------------------------------------------------------

    /// `malloc` (allocator.md §5): best fit, else a new segment, else release
    /// oversize cached blocks and retry, else flush the cache and retry, else
    /// out of memory. A request of 0 bytes is rounded to 512 like any other
    /// (PyTorch's callers never pass 0; [`super::simulate`] skips them).
    pub fn malloc(&mut self, request: Bytes, stream: u32) -> Result<Allocation, OutOfMemory> {
        let request = request.get();
        if request > MAX_REQUEST {
            self.num_ooms += 1;
            return Err(OutOfMemory {
                requested: Bytes(request),
                rounded: Bytes(request),
                segment_size: Bytes(request),
                missing: Bytes(request),
                reserved: Bytes(self.now.reserved),
                allocated: Bytes(self.now.allocated),
            });
        }
        let stream = self.stream_index(stream);
        let s = self.config.round_size(request);
        let pool = PoolKind::for_rounded(s);
        let asize = self.config.segment_size(s);

        let mut found = self.get_free_block(pool, stream, s);
        if found.is_none() {
            if self.gc_enabled() {
                self.garbage_collect();
            }
            found = self.alloc_block(pool, stream, s, asize);
            if found.is_none() && self.release_available_cached_blocks(pool, stream, s) {
                found = self.alloc_block(pool, stream, s, asize);
            }
            if found.is_none() {
                self.release_cached_blocks();
                self.num_alloc_retries += 1;
                found = self.alloc_block(pool, stream, s, asize);
            }
        }
        let Some(id) = found else {
            self.num_ooms += 1;
            self.note_fragmentation();
            return Err(OutOfMemory {
                requested: Bytes(request),
                rounded: Bytes(s),
                segment_size: Bytes(asize),
                missing: Bytes(self.shortfall),
                reserved: Bytes(self.now.reserved),
                allocated: Bytes(self.now.allocated),
            });
        };
        let out = self.hand_out(id, s, request);
        self.note_fragmentation();
        Ok(out)
    }

    fn note_fragmentation(&mut self) {
        let frag = self.now.reserved.saturating_sub(self.now.allocated);
        self.peak_fragmentation = self.peak_fragmentation.max(frag);
    }

    fn get_free_block(&mut self, pool: PoolKind, stream: u32, s: u64) -> Option<u32> {
        let gc = self.gc_enabled();
        let p = &mut self.pools[pool.index()];
        if gc {
            p.gc_clock += 1;
        }
        let blocks = &self.blocks;
        let mut iter = p.free.range(free_key(stream, s, 0)..);
        let (_, &first) = iter.next()?;
        if blocks[first as usize].stream != stream {
            return None;
        }
        let mut cur = first;
        if self.config.expandable_segments {
            // §9.4: prefer an interior block over a tail bordering unmapped space.
            while blocks[cur as usize].seg != NIL {
                let Some((_, &next)) = iter.next() else {
                    break;
                };
                if blocks[next as usize].stream != stream
                    || potential(blocks, next) >= potential(blocks, cur)
                {
                    break;
                }
                cur = next;
            }
        }
        let size = blocks[cur as usize].size;
        if let Some(max_split) = self.config.max_split_size.map(Bytes::get) {
            if s < max_split && size >= max_split {
                return None;
            }
            if s >= max_split && size >= s.saturating_add(self.config.max_non_split_rounding.get())
            {
                return None;
            }
        }
        self.remove_free(cur);
        Some(cur)
    }

    fn alloc_block(&mut self, pool: PoolKind, stream: u32, s: u64, asize: u64) -> Option<u32> {
        if let Some(limit) = self.memory_limit {
            let want = self.now.reserved.saturating_add(asize);
            if want > limit {
                self.shortfall = want - limit;
                return None;
            }
        }
        if self.config.expandable_segments {
            return self.try_allocate_expandable(pool, stream, s);
        }
        if let Some(avail) = self.device.available_to_allocator() {
            let want = self.now.reserved.saturating_add(asize);
            if want > avail {
                self.shortfall = want - avail;
                return None;
            }
        }
        let addr = match self.next_segment_address.take() {
            Some(a) => {
                self.next_addr = self
                    .next_addr
                    .max(a.saturating_add(asize).saturating_add(GIB));
                a
            }
            None => {
                let Some(a) = self.synthetic_address(asize) else {
                    self.shortfall = asize;
                    return None;
                };
                a
            }
        };
        let id = self.new_block(Block {
            addr,
            size: asize,
            requested: 0,
            stream,
            pool,
            allocated: false,
            mapped: true,
            seg: NIL,
            prev: NIL,
            next: NIL,
            gc_base: 0,
        });
        self.now.reserved += asize;
        self.now.segments += 1;
        self.num_device_alloc += 1;
        self.bump_peaks();
        self.log(SegmentChange::Alloc { addr, size: asize });
        Some(id)
    }

    fn hand_out(&mut self, id: u32, s: u64, request: u64) -> Allocation {
        let b = *self.b(id);
        let leftover = b.size.saturating_sub(s);
        let split = if b.pool == PoolKind::Small || self.config.expandable_segments {
            leftover >= MIN_BLOCK_SIZE
        } else {
            let below_max = self.config.max_split_size.is_none_or(|m| s < m.get());
            below_max && leftover > SMALL_SIZE
        };
        let out = if split {
            let a = self.new_block(Block {
                addr: b.addr,
                size: s,
                requested: request,
                stream: b.stream,
                pool: b.pool,
                allocated: true,
                mapped: true,
                seg: b.seg,
                prev: b.prev,
                next: id,
                gc_base: 0,
            });
            self.link_after(b.prev, a);
            let rest = self.bm(id);
            rest.prev = a;
            rest.addr += s;
            rest.size -= s;
            self.insert_free(id, true);
            a
        } else {
            let blk = self.bm(id);
            blk.allocated = true;
            blk.requested = request;
            id
        };
        let size = self.b(out).size;
        self.now.allocated += size;
        self.now.active += size;
        self.now.requested += request;
        self.now.allocations += 1;
        self.bump_peaks();
        Allocation {
            handle: BlockHandle(out),
            addr: self.b(out).addr,
            size: Bytes(size),
        }
    }

    // ----- free -----------------------------------------------------------

    /// Frees an allocated block: it merges with free neighbours of its
    /// segment and is cached; no memory goes back to the device (§6).
    pub fn free(&mut self, handle: BlockHandle) -> Result<(), NotAllocated> {
        let id = handle.0;
        let Some(b) = self.blocks.get_mut(id as usize).filter(|b| b.allocated) else {
            return Err(NotAllocated(handle));
        };
        b.allocated = false;
        let (size, requested, prev, next) = (b.size, b.requested, b.prev, b.next);
        b.requested = 0;
        self.now.allocated -= size;
        self.now.active -= size;
        self.now.requested -= requested;
        self.now.allocations -= 1;
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.insert_free(id, true);
        self.note_fragmentation();
        Ok(())
    }

    /// Merges `src` into its neighbour `dst` if `src` is free and has the
    /// same mapped-ness. `dst` keeps its id.
    fn try_merge(&mut self, dst: u32, src: u32) {
        if src == NIL {
            return;
        }
        let s = *self.b(src);
        if s.allocated || s.mapped != self.b(dst).mapped {
            return;
        }
        if s.mapped {
            self.remove_free(src);
        } else {
            self.pools[s.pool.index()]
                .unmapped
                .remove(&(s.stream, s.addr));
        }
        let d_prev = self.b(dst).prev;
        if d_prev == src {
            let d = self.bm(dst);
            d.addr = s.addr;
            d.prev = s.prev;
            d.size += s.size;
            self.link_after(s.prev, dst);
        } else {
            let d = self.bm(dst);
            d.next = s.next;
            d.size += s.size;
            self.link_before(s.next, dst);
        }
        self.drop_block(src);
    }

    // ----- releasing --------------------------------------------------------

    /// `cudaFree` of a whole, free, non-expandable segment already removed
    /// from its pool.
    fn release_block(&mut self, id: u32) {
        let (addr, size) = (self.b(id).addr, self.b(id).size);
        self.now.reserved -= size;
        self.now.segments -= 1;
        self.num_device_free += 1;
        self.log(SegmentChange::Free { addr, size });
        self.drop_block(id);
    }

    /// `release_cached_blocks` (§5.7): frees every whole cached segment of
    /// both pools and all streams, and unmaps the fully free pages of
    /// expandable segments. This is also `torch.cuda.empty_cache()`.
    pub fn release_cached_blocks(&mut self) {
        for pool in [PoolKind::Large, PoolKind::Small] {
            let ids: Vec<u32> = self.pools[pool.index()].free.values().copied().collect();
            let mut to_unmap = Vec::new();
            for id in ids {
                let b = self.b(id);
                if b.seg != NIL {
                    to_unmap.push(id);
                } else if b.whole() {
                    self.remove_free(id);
                    self.release_block(id);
                }
            }
            for id in to_unmap {
                self.unmap_block(id);
            }
        }
    }

    /// The cached segments `release_cached_blocks` would free now: whole,
    /// free, non-expandable segments of both pools and all streams, as
    /// `(address, size)` sorted by address.
    pub fn releasable_segments(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self
            .pools
            .iter()
            .flat_map(|p| p.free.values())
            .map(|&id| self.b(id))
            .filter(|b| b.seg == NIL && b.whole())
            .map(|b| (b.addr, b.size))
            .collect();
        out.sort_unstable();
        out
    }

    /// `cudaFree`s the cached whole segment at `addr`, as the real allocator
    /// did at a moment the caller knows (e.g. an OOM retry against a device
    /// capacity the simulator was not given). False if there is no such
    /// cached segment.
    pub fn release_segment_at(&mut self, addr: u64) -> bool {
        let found = self
            .pools
            .iter()
            .flat_map(|p| p.free.values())
            .copied()
            .find(|&id| {
                let b = self.b(id);
                b.addr == addr && b.seg == NIL && b.whole()
            });
        let Some(id) = found else {
            return false;
        };
        self.remove_free(id);
        self.release_block(id);
        self.note_fragmentation();
        true
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
        self.note_fragmentation();
    }

    /// §5.6: with `max_split_size_mb`, free one cached oversize block big
    /// enough, or oversize blocks from the largest down.
    fn release_available_cached_blocks(&mut self, pool: PoolKind, stream: u32, s: u64) -> bool {
        let Some(max_split) = self.config.max_split_size.map(Bytes::get) else {
            return false;
        };
        let key = s.max(max_split);
        let p = &self.pools[pool.index()];
        let single = p
            .free
            .range(free_key(stream, key, 0)..)
            .next()
            .filter(|(_, &id)| self.b(id).stream == stream && self.b(id).seg == NIL)
            .map(|(_, &id)| id);
        if let Some(id) = single {
            if !self.b(id).whole() {
                return false;
            }
            self.remove_free(id);
            self.release_block(id);
            return true;
        }
        let candidates: Vec<u32> = p
            .free
            .range(..free_key(stream, key, 0))
            .rev()
            .take_while(|(_, &id)| self.b(id).stream == stream && self.b(id).size >= max_split)
            .map(|(_, &id)| id)
            .collect();
        let mut released = 0u64;
        for id in candidates {
            if released >= key {
                break;
            }
            let b = self.b(id);
            if b.seg != NIL || !b.whole() {
                continue;
            }
            released += b.size;
            self.remove_free(id);
            self.release_block(id);
        }
        released >= key
    }

    /// §5.4: free old, whole, cached large segments until reserved is below
    /// `threshold × limit`, finishing each pass.
    fn garbage_collect(&mut self) {
        let (Some(limit), Some(threshold)) =
            (self.memory_limit, self.config.garbage_collection_threshold)
        else {
            return;
        };
        let gc_threshold = (threshold * limit as f64) as u64;
        if self.now.reserved <= gc_threshold {
            return;
        }
        let target = self.now.reserved - gc_threshold;
        let large = PoolKind::Large.index();
        let clock = self.pools[large].gc_clock;
        let eligible = |b: &Block| b.whole() && b.seg == NIL;
        let mut total_age: u128 = 0;
        let mut count: u128 = 0;
        for &id in self.pools[large].free.values() {
            let b = self.b(id);
            if eligible(b) {
                total_age += u128::from(clock.saturating_sub(b.gc_base));
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            freed = false;
            let (pass_total, pass_count) = (total_age, count);
            let ids: Vec<u32> = self.pools[large].free.values().copied().collect();
            for id in ids {
                let b = self.b(id);
                if !eligible(b) {
                    continue;
                }
                let age = u128::from(clock.saturating_sub(b.gc_base));
                // age ≥ total / count, in exact arithmetic.
                if age * pass_count >= pass_total {
                    freed = true;
                    reclaimed += b.size;
                    total_age -= age;
                    count -= 1;
                    self.remove_free(id);
                    self.release_block(id);
                }
            }
        }
    }

    // ----- expandable segments ------------------------------------------------

    fn va_size(&self, page: u64) -> u64 {
        let total = self
            .device
            .capacity
            .map(|c| c.get().saturating_add(c.get() / 8))
            .unwrap_or(UNLIMITED_VA);
        round_up(total.max(page).min(MAX_REQUEST), page)
    }

    fn page_size(&self, pool: PoolKind) -> u64 {
        match pool {
            PoolKind::Small => SMALL_BUFFER,
            PoolKind::Large => self.config.large_segment_size.get(),
        }
    }

    fn try_allocate_expandable(&mut self, pool: PoolKind, stream: u32, s: u64) -> Option<u32> {
        let Some(mut cand) = self.find_candidate(pool, stream, s) else {
            self.shortfall = s;
            return None;
        };
        if !self.b(cand).mapped {
            let len = self.b(cand).size.min(s);
            cand = self.map_block(cand, len)?;
        }
        while self.b(cand).size < s {
            let remaining = s - self.b(cand).size;
            let next = self.b(cand).next;
            if next == NIL || self.b(next).mapped {
                return None;
            }
            let len = remaining.min(self.b(next).size);
            cand = self.map_block(next, len)?;
        }
        self.remove_free(cand);
        Some(cand)
    }

    fn find_candidate(&mut self, pool: PoolKind, stream: u32, s: u64) -> Option<u32> {
        let blocks = &self.blocks;
        let free_at = |id: u32| id != NIL && !blocks[id as usize].allocated;
        for (&(st, _), &u) in self.pools[pool.index()].unmapped.range((stream, 0)..) {
            if st != stream {
                break;
            }
            let prev = blocks[u as usize].prev;
            let start = if free_at(prev) { prev } else { u };
            let mut total = 0u64;
            let mut b = start;
            while total < s && free_at(b) {
                total = total.saturating_add(blocks[b as usize].size);
                b = blocks[b as usize].next;
            }
            if total >= s {
                return Some(start);
            }
        }
        let page = self.page_size(pool);
        let size = self.va_size(page);
        // A fresh virtual range; the replay may know its real base.
        let base = match self.next_segment_address.take() {
            Some(a) => {
                self.next_addr = self
                    .next_addr
                    .max(a.saturating_add(size).saturating_add(GIB));
                a
            }
            None => self.synthetic_address(size)?,
        };
        Some(self.new_expandable(pool, stream, base, page, size))
    }

    fn new_expandable(
        &mut self,
        pool: PoolKind,
        stream: u32,
        base: u64,
        page: u64,
        size: u64,
    ) -> u32 {
        let seg = self.expandable.len() as u32;
        self.expandable.push(ExpandableSegment { base, page });
        let id = self.new_block(Block {
            addr: base,
            size,
            requested: 0,
            stream,
            pool,
            allocated: false,
            mapped: false,
            seg,
            prev: NIL,
            next: NIL,
            gc_base: 0,
        });
        self.pools[pool.index()].unmapped.insert((stream, base), id);
        id
    }

    /// Maps the pages covering the first `len` bytes of unmapped block `id`.
    fn map_block(&mut self, id: u32, len: u64) -> Option<u32> {
        let b = *self.b(id);
        let page = self
            .expandable
            .get(b.seg as usize)
            .map_or(SMALL_BUFFER, |e| e.page);
        let size = round_up(len, page).min(b.size);
        if let Some(avail) = self.device.available_to_allocator() {
            let want = self.now.reserved.saturating_add(size);
            if want > avail {
                self.shortfall = want - avail;
                return None;
            }
        }
        self.pools[b.pool.index()]
            .unmapped
            .remove(&(b.stream, b.addr));
        let left = b.prev != NIL;
        let right = size == b.size && b.next != NIL;
        if b.size > size {
            let rest = self.new_block(Block {
                addr: b.addr + size,
                size: b.size - size,
                requested: 0,
                stream: b.stream,
                pool: b.pool,
                allocated: false,
                mapped: false,
                seg: b.seg,
                prev: id,
                next: b.next,
                gc_base: 0,
            });
            self.link_before(b.next, rest);
            self.bm(id).next = rest;
            self.pools[b.pool.index()]
                .unmapped
                .insert((b.stream, b.addr + size), rest);
        }
        let m = self.bm(id);
        m.size = size;
        m.mapped = true;
        self.now.reserved += size;
        self.now.mapped_ranges =
            (self.now.mapped_ranges + 1).saturating_sub(u64::from(left) + u64::from(right));
        self.num_device_alloc += 1;
        self.bump_peaks();
        self.log(SegmentChange::Map { addr: b.addr, size });
        let (prev, next) = (self.b(id).prev, self.b(id).next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.insert_free(id, false);
        Some(id)
    }

    /// Unmaps the pages fully inside free mapped block `id` (§9.5).
    fn unmap_block(&mut self, id: u32) {
        let b = *self.b(id);
        let Some(seg) = self.expandable.get(b.seg as usize) else {
            return;
        };
        let (base, page) = (seg.base, seg.page);
        let rel_start = b.addr - base;
        let rel_end = rel_start + b.size;
        let first = rel_start.div_ceil(page);
        let last = rel_end / page;
        if first >= last {
            return;
        }
        let u_start = base + first * page;
        let u_end = base + last * page;
        self.remove_free(id);
        let before = u_start - b.addr;
        let after = b.addr + b.size - u_end;
        let left = before > 0 || (b.prev != NIL && self.b(b.prev).mapped);
        let right = after > 0 || (b.next != NIL && self.b(b.next).mapped);
        let template = Block {
            requested: 0,
            allocated: false,
            mapped: true,
            gc_base: 0,
            ..b
        };
        if before > 0 {
            let bf = self.new_block(Block {
                addr: b.addr,
                size: before,
                prev: b.prev,
                next: id,
                ..template
            });
            self.link_after(b.prev, bf);
            self.bm(id).prev = bf;
            self.insert_free(bf, true);
        }
        if after > 0 {
            let af = self.new_block(Block {
                addr: u_end,
                size: after,
                prev: id,
                next: b.next,
                ..template
            });
            self.link_before(b.next, af);
            self.bm(id).next = af;
            self.insert_free(af, true);
        }
        let m = self.bm(id);
        m.addr = u_start;
        m.size = u_end - u_start;
        m.mapped = false;
        self.now.reserved -= u_end - u_start;
        self.now.mapped_ranges =
            (self.now.mapped_ranges + u64::from(left) + u64::from(right)).saturating_sub(1);
        self.num_device_free += 1;
        self.log(SegmentChange::Unmap {
            addr: u_start,
            size: u_end - u_start,
        });
        let (prev, next) = (self.b(id).prev, self.b(id).next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        let b = *self.b(id);
        if b.whole() {
            // The segment is entirely unmapped: release its address range.
            self.drop_block(id);
        } else {
            self.pools[b.pool.index()]
                .unmapped
                .insert((b.stream, b.addr), id);
        }
    }

    // ----- snapshots and loading -------------------------------------------

    /// The segments as `torch.cuda.memory_snapshot()` lists them, by address.
    pub fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for (i, b) in self.blocks.iter().enumerate() {
            if b.prev != NIL || b.size == 0 || self.spare_contains(i) {
                continue;
            }
            let mut cur = Some(i as u32);
            let mut view: Option<SegmentView> = None;
            while let Some(id) = cur {
                let blk = self.b(id);
                if blk.mapped {
                    let v = view.get_or_insert_with(|| SegmentView {
                        addr: blk.addr,
                        size: 0,
                        stream: self.stream_id(blk.stream),
                        pool: blk.pool,
                        expandable: blk.seg != NIL,
                        blocks: Vec::new(),
                    });
                    v.size += blk.size;
                    v.blocks.push(BlockView {
                        addr: blk.addr,
                        size: blk.size,
                        allocated: blk.allocated,
                    });
                } else if let Some(v) = view.take() {
                    out.push(v);
                }
                cur = (blk.next != NIL).then_some(blk.next);
            }
            if let Some(v) = view {
                out.push(v);
            }
        }
        out.sort_by_key(|v| v.addr);
        out
    }

    fn spare_contains(&self, i: usize) -> bool {
        // Dropped slots have size 0 and no links, so `segments` skips them by
        // size; this covers the (impossible) zero-size live block too.
        self.blocks.get(i).is_none_or(|b| b.size == 0)
    }

    /// Loads a segment with its blocks (the state at the start of a
    /// recording). Returns the handles of its occupied blocks, in order.
    /// Expandable layouts become the mapped head of a new expandable segment.
    pub fn load_segment(&mut self, layout: &SegmentLayout) -> Result<Vec<Allocation>, LayoutError> {
        let stream = self.stream_index(layout.stream);
        let total: u64 = layout.blocks.iter().map(|&(size, _, _)| size).sum();
        if total != layout.size || layout.size == 0 {
            return Err(LayoutError::BlocksDoNotTile(layout.addr));
        }
        let end = layout.addr.saturating_add(layout.size);
        if self
            .segments()
            .iter()
            .any(|v| v.addr < end && layout.addr < v.addr + v.size)
        {
            return Err(LayoutError::Overlap(layout.addr));
        }
        let seg = if layout.expandable {
            let page = self.page_size(layout.pool);
            let va = self.va_size(page).max(round_up(layout.size, page) + page);
            let id = self.new_expandable(layout.pool, stream, layout.addr, page, va);
            self.next_addr = self
                .next_addr
                .max(layout.addr.saturating_add(va).saturating_add(GIB));
            // Carve the mapped head out of the unmapped range.
            let mapped = self.map_loaded(id, layout.size);
            Some(mapped)
        } else {
            self.next_addr = self.next_addr.max(end.saturating_add(GIB));
            None
        };
        let mut out = Vec::new();
        let mut addr = layout.addr;
        let mut prev = NIL;
        let seg_index = seg.map_or(NIL, |(s, _)| s);
        let mut ids = Vec::new();
        for &(size, occupied, requested) in &layout.blocks {
            let id = self.new_block(Block {
                addr,
                size,
                requested: if occupied { requested } else { 0 },
                stream,
                pool: layout.pool,
                allocated: occupied,
                mapped: true,
                seg: seg_index,
                prev,
                next: NIL,
                gc_base: 0,
            });
            self.link_after(prev, id);
            prev = id;
            ids.push(id);
            addr += size;
        }
        if let Some((_, tail)) = seg {
            self.link_after(prev, tail);
            if tail != NIL {
                self.bm(tail).prev = prev;
            }
        }
        for &id in &ids {
            let b = *self.b(id);
            if b.allocated {
                self.now.allocated += b.size;
                self.now.active += b.size;
                self.now.requested += b.requested;
                self.now.allocations += 1;
                out.push(Allocation {
                    handle: BlockHandle(id),
                    addr: b.addr,
                    size: Bytes(b.size),
                });
            } else {
                self.insert_free(id, true);
            }
        }
        self.now.reserved += layout.size;
        self.note_fragmentation();
        if layout.expandable {
            self.now.mapped_ranges += 1;
        } else {
            self.now.segments += 1;
        }
        self.bump_peaks();
        Ok(out)
    }

    /// Loads one expandable segment: a virtual range starting at `base` with
    /// the given mapped ranges (each a [`SegmentLayout`] whose blocks tile it;
    /// sorted by address, page-aligned relative to `base`). The rest of the
    /// range is unmapped. Returns the occupied blocks' allocations in order.
    pub fn load_expandable(
        &mut self,
        base: u64,
        pool: PoolKind,
        stream: u32,
        ranges: &[SegmentLayout],
    ) -> Result<Vec<Allocation>, LayoutError> {
        let stream_idx = self.stream_index(stream);
        let page = self.page_size(pool);
        let mut at = base;
        for r in ranges {
            let total: u64 = r.blocks.iter().map(|&(size, _, _)| size).sum();
            if total != r.size || r.size == 0 || r.addr < at {
                return Err(LayoutError::BlocksDoNotTile(r.addr));
            }
            at = r.addr + r.size;
        }
        let va = round_up(at - base, page).saturating_add(self.va_size(page));
        let seg = self.expandable.len() as u32;
        self.expandable.push(ExpandableSegment { base, page });
        self.next_addr = self
            .next_addr
            .max(base.saturating_add(va).saturating_add(GIB));
        let template = Block {
            addr: base,
            size: 0,
            requested: 0,
            stream: stream_idx,
            pool,
            allocated: false,
            mapped: false,
            seg,
            prev: NIL,
            next: NIL,
            gc_base: 0,
        };
        let mut prev = NIL;
        let mut at = base;
        let mut out = Vec::new();
        let mut push = |this: &mut Self, b: Block| -> u32 {
            let id = this.new_block(Block { prev, ..b });
            this.link_after(prev, id);
            prev = id;
            id
        };
        for r in ranges {
            if r.addr > at {
                let id = push(
                    self,
                    Block {
                        addr: at,
                        size: r.addr - at,
                        ..template
                    },
                );
                self.pools[pool.index()]
                    .unmapped
                    .insert((stream_idx, at), id);
            }
            let mut a = r.addr;
            for &(size, occupied, requested) in &r.blocks {
                let id = push(
                    self,
                    Block {
                        addr: a,
                        size,
                        requested: if occupied { requested } else { 0 },
                        allocated: occupied,
                        mapped: true,
                        ..template
                    },
                );
                if occupied {
                    self.now.allocated += size;
                    self.now.active += size;
                    self.now.requested += requested;
                    self.now.allocations += 1;
                    out.push(Allocation {
                        handle: BlockHandle(id),
                        addr: a,
                        size: Bytes(size),
                    });
                } else {
                    self.insert_free(id, true);
                }
                a += size;
            }
            self.now.reserved += r.size;
            self.now.mapped_ranges += 1;
            at = r.addr + r.size;
        }
        let end = base + va;
        if end > at {
            let id = push(
                self,
                Block {
                    addr: at,
                    size: end - at,
                    ..template
                },
            );
            self.pools[pool.index()]
                .unmapped
                .insert((stream_idx, at), id);
        }
        self.bump_peaks();
        self.note_fragmentation();
        Ok(out)
    }

    /// Turns the head of a fresh expandable segment's unmapped block into
    /// space for loaded blocks; returns `(segment index, unmapped tail id)`.
    fn map_loaded(&mut self, id: u32, size: u64) -> (u32, u32) {
        let b = *self.b(id);
        self.pools[b.pool.index()]
            .unmapped
            .remove(&(b.stream, b.addr));
        self.drop_block(id);
        let tail = self.new_block(Block {
            addr: b.addr + size,
            size: b.size - size,
            prev: NIL,
            next: NIL,
            ..b
        });
        self.pools[b.pool.index()]
            .unmapped
            .insert((b.stream, b.addr + size), tail);
        (b.seg, tail)
    }

    /// Checks the internal invariants (used by tests): blocks tile their
    /// segments without overlap, free sets match block states, counters match.
    pub fn check_invariants(&self) -> Result<(), String> {
        let segs = self.segments();
        let mut reserved = 0u64;
        let mut allocated = 0u64;
        let mut last_end = 0u64;
        for v in &segs {
            if v.addr < last_end {
                return Err(format!(
                    "segment at {:#x} overlaps the previous one",
                    v.addr
                ));
            }
            last_end = v.addr + v.size;
            reserved += v.size;
            let mut at = v.addr;
            for b in &v.blocks {
                if b.addr != at {
                    return Err(format!("block at {:#x} does not follow {:#x}", b.addr, at));
                }
                at += b.size;
                if b.allocated {
                    allocated += b.size;
                }
            }
        }
        if reserved != self.now.reserved {
            return Err(format!(
                "reserved {} but segments sum to {reserved}",
                self.now.reserved
            ));
        }
        if allocated != self.now.allocated {
            return Err(format!(
                "allocated {} but blocks sum to {allocated}",
                self.now.allocated
            ));
        }
        let n_free: usize = self.pools.iter().map(|p| p.free.len()).sum();
        let free_blocks: usize = segs
            .iter()
            .flat_map(|v| v.blocks.iter())
            .filter(|b| !b.allocated)
            .count();
        if n_free != free_blocks {
            return Err(format!(
                "{n_free} cached blocks indexed but {free_blocks} free blocks"
            ));
        }
        Ok(())
    }
}

/// `b.size` plus the unmapped block right after it (§9.4).
fn potential(blocks: &[Block], id: u32) -> u64 {
    let b = &blocks[id as usize];
    let extra = if b.next != NIL && !blocks[b.next as usize].mapped {
        blocks[b.next as usize].size
    } else {
        0
    };
    b.size + extra
}
