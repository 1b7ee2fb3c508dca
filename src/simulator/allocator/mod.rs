//! The stateful caching allocator: pools, best fit, splitting, coalescing,
//! the release-and-retry path, expandable segments (allocator.md §1–§9).
//!
//! Blocks live in an arena (`Vec<Block>`) linked per segment in address order.
//! Each pool keeps its free mapped blocks ordered by `(stream, size,
//! address)` ([`free_set::FreeSet`]: size classes for the small blocks of
//! the default stream, an ordered map for the rest), so best fit is one
//! lookup; expandable
//! segments keep their unmapped blocks in a second map keyed by
//! `(stream, address)`.
//!
//! By concern:
//! - this file: the public types, the allocator's state, `malloc` and `free`
//!   on the two default pools (best fit, splitting, coalescing);
//! - [`arena`]: the checked accessors every block and pool access goes through;
//! - [`release`]: giving cached memory back (`empty_cache`, the release-and-retry
//!   path, oversize release, garbage collection);
//! - [`expandable`]: expandable segments (mapping and unmapping pages);
//! - [`load`]: the segment views of a snapshot and loading a known start
//!   state, which only the replay uses;
//! - [`forced`]: teacher forcing (an allocation placed at the real
//!   allocator's address), which only the replay uses.

mod arena;
mod expandable;
mod forced;
mod free_set;
mod load;
mod release;
mod small;

use std::collections::BTreeMap;

pub use forced::ForcedAllocation;
pub use small::Placed;

use serde::{Deserialize, Serialize};

use super::config::{round_up, AllocatorConfig, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
use super::device::GpuMemory;
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

impl BlockHandle {
    /// The arena slot it names.
    pub(crate) fn slot(self) -> usize {
        self.0 as usize
    }
}

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
    #[error("the allocator lost track of a block while loading a segment, which is a bug in memcast; please report it with the file, got segment at {0:#x}")]
    Lost(u64),
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
    /// A free, unmapped block of expandable segment `seg`, not linked yet.
    fn unmapped(addr: u64, size: u64, stream: u32, pool: PoolKind, seg: u32) -> Block {
        Block {
            addr,
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
        }
    }

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
    free: free_set::FreeSet,
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
    device: GpuMemory,
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
    /// The small pool's blocks, where a caller reads them
    /// ([`CachingAllocator::index_small_pool`]).
    small_index: Option<arena::SmallIndex>,
}

impl CachingAllocator {
    /// An empty allocator.
    pub fn new(config: AllocatorConfig, device: GpuMemory) -> CachingAllocator {
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
            small_index: None,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The same allocator on `device`, where every decision it took so far
    /// is the one it would have taken there: no memory limit or fraction
    /// (garbage collection runs against it), no expandable segments (their
    /// size follows the capacity), no request refused or retried so far,
    /// and what it reserved fits the device.
    /// `None` otherwise.
    pub fn on_device(&self, device: GpuMemory) -> Option<CachingAllocator> {
        let plain = self.memory_limit.is_none()
            && device.memory_limit.is_none()
            && self.config.per_process_memory_fraction.is_none()
            && !self.config.expandable_segments
            && self.num_alloc_retries == 0
            && self.num_ooms == 0;
        let fits = device
            .available_to_allocator()
            .is_none_or(|room| self.now.reserved <= room);
        (plain && fits).then(|| CachingAllocator {
            device,
            ..self.clone()
        })
    }

    /// About the bytes it holds (its blocks, free lists and segments): what
    /// a copy of it costs.
    pub fn footprint(&self) -> Bytes {
        let blocks = self.blocks.len() * std::mem::size_of::<Block>();
        let spare = self.spare.len() * std::mem::size_of::<u32>();
        // A free block's entry: its address, size and id, with the set's
        // own overhead.
        let free: usize = self
            .pools
            .iter()
            .map(|p| (p.free.len() + p.unmapped.len()) * 32)
            .sum();
        let segments = self.expandable.len() * std::mem::size_of::<ExpandableSegment>();
        Bytes((blocks + spare + free + segments) as u64)
    }

    /// The segment a request of `request` bytes makes where no cached
    /// block serves it (what it adds to the reserved bytes at most).
    pub fn segment_for(&self, request: Bytes) -> Bytes {
        Bytes(
            self.config
                .segment_size(self.config.round_size(request.get())),
        )
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
                    pool.free.last()
                } else {
                    pool.free.last_before(below_next)
                };
                if let Some(b) = top.and_then(|(_, id)| self.block(id)) {
                    if b.stream == stream {
                        largest = largest.max(b.size);
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

    /// The dense internal index of an external stream id seen before.
    fn known_stream(&self, stream: u32) -> Option<u32> {
        self.streams
            .iter()
            .position(|&s| s == stream)
            .map(|i| i as u32)
    }

    /// The dense internal index of an external stream id.
    fn stream_index(&mut self, stream: u32) -> u32 {
        if let Some(i) = self.known_stream(stream) {
            return i;
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
        // `hand_out` only fails on a block missing from the arena (a bug in
        // the allocator), which is reported like a failed request.
        let Some(out) = found.and_then(|id| self.hand_out(id, s, request)) else {
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
        self.note_fragmentation();
        Ok(out)
    }

    fn note_fragmentation(&mut self) {
        let frag = self.now.reserved.saturating_sub(self.now.allocated);
        self.peak_fragmentation = self.peak_fragmentation.max(frag);
    }

    fn get_free_block(&mut self, pool: PoolKind, stream: u32, s: u64) -> Option<u32> {
        if self.gc_enabled() {
            self.pool_mut(pool).gc_clock += 1;
        }
        let mut iter = self.pool(pool).free.from(free_key(stream, s, 0));
        let (_, first) = iter.next()?;
        let mut cur = self.block(first).filter(|b| b.stream == stream)?;
        let mut cur_id = first;
        if self.config.expandable_segments {
            // §9.4: prefer an interior block over a tail bordering unmapped space.
            while cur.seg != NIL {
                let Some((_, next_id)) = iter.next() else {
                    break;
                };
                let Some(next) = self.block(next_id) else {
                    break;
                };
                if next.stream != stream || self.potential(next) >= self.potential(cur) {
                    break;
                }
                (cur, cur_id) = (next, next_id);
            }
        }
        if !self.may_take(s, cur.size) {
            return None;
        }
        self.remove_free(cur_id);
        Some(cur_id)
    }

    /// Whether a request rounded to `s` may take a cached block of `size`
    /// bytes: with `max_split_size`, an oversize block serves only an
    /// oversize request, and one not much larger than it.
    fn may_take(&self, s: u64, size: u64) -> bool {
        let Some(max_split) = self.config.max_split_size.map(Bytes::get) else {
            return true;
        };
        let rounding = self.config.max_non_split_rounding.get();
        !(s < max_split && size >= max_split
            || s >= max_split && size >= s.saturating_add(rounding))
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

    /// Hands out `s` bytes of free block `id` (already out of its free set),
    /// splitting off the rest when the pool's rules allow.
    fn hand_out(&mut self, id: u32, s: u64, request: u64) -> Option<Allocation> {
        let b = *self.block(id)?;
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
            let rest = self.block_mut(id)?;
            rest.prev = a;
            rest.addr += s;
            rest.size -= s;
            self.insert_free(id, true);
            a
        } else {
            let blk = self.block_mut(id)?;
            blk.allocated = true;
            blk.requested = request;
            id
        };
        let &Block { size, addr, .. } = self.block(out)?;
        self.now.allocated += size;
        self.now.active += size;
        self.now.requested += request;
        self.now.allocations += 1;
        self.bump_peaks();
        Some(Allocation {
            handle: BlockHandle(out),
            addr,
            size: Bytes(size),
        })
    }

    // ----- free -----------------------------------------------------------

    /// Frees an allocated block: it merges with free neighbours of its
    /// segment and is cached; no memory goes back to the device (§6).
    pub fn free(&mut self, handle: BlockHandle) -> Result<(), NotAllocated> {
        let id = handle.0;
        let Some(b) = self.block_mut(id).filter(|b| b.allocated) else {
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
        let (Some(&s), Some(&d)) = (self.block(src), self.block(dst)) else {
            return;
        };
        if s.allocated || s.mapped != d.mapped {
            return;
        }
        if s.mapped {
            self.remove_free(src);
        } else {
            self.pool_mut(s.pool).unmapped.remove(&(s.stream, s.addr));
        }
        let Some(merged) = self.block_mut(dst) else {
            return;
        };
        merged.size += s.size;
        if d.prev == src {
            merged.addr = s.addr;
            merged.prev = s.prev;
            self.link_after(s.prev, dst);
        } else {
            merged.next = s.next;
            self.link_before(s.next, dst);
        }
        self.drop_block(src);
    }
}
