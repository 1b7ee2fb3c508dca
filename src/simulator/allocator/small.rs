//! What a simulation reads of the allocator to know that a decode step
//! will take the decisions a step before it took (`crate::pipeline`'s
//! cycles): the small pool's blocks, and whether an allocation can get a
//! new segment without releasing the cache. And whether an allocation
//! takes a cached block at all (`crate::pipeline`'s runs at capacity copy
//! the run they share only before one that takes a new segment).

use super::arena::SmallIndex;
use super::{round_up, Block, CachingAllocator, PoolKind, ADDRESS_LIMIT, NIL, SMALL_BUFFER};
use super::{BlockHandle, SMALL_SIZE};
use crate::units::Bytes;

/// Where a block of the small pool lies in its segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placed {
    pub addr: u64,
    pub size: u64,
    /// It starts its segment (no block before it).
    pub head: bool,
    /// It ends its segment (no block after it).
    pub tail: bool,
}

impl Placed {
    fn of(b: &Block) -> Placed {
        Placed {
            addr: b.addr,
            size: b.size,
            head: b.prev == NIL,
            tail: b.next == NIL,
        }
    }
}

impl CachingAllocator {
    /// Whether `malloc(request, stream)` would take a cached block now,
    /// without a new segment: `get_free_block`'s search, without taking
    /// the block (the first block found decides: with expandable segments
    /// malloc may prefer a later one).
    pub fn serves_from_cache(&self, request: Bytes, stream: u32) -> bool {
        let Some(stream) = self.known_stream(stream) else {
            return false;
        };
        let s = self.config.round_size(request.get());
        let first = self
            .pool(PoolKind::for_rounded(s))
            .free
            .first_from(super::free_key(stream, s, 0));
        first
            .and_then(|(_, id)| self.block(id))
            .is_some_and(|b| b.stream == stream && self.may_take(s, b.size))
    }

    /// Whether the small pool's decisions depend on nothing but its own
    /// blocks and the requests it serves from its cache: no garbage
    /// collection (which frees cached blocks of both pools by age) and no
    /// expandable segments.
    pub fn small_pool_alone(&self) -> bool {
        !self.gc_enabled() && !self.config.expandable_segments
    }

    /// The bytes a request is served at, where it goes to the small pool.
    pub fn small_rounded(&self, request: Bytes) -> Option<u64> {
        self.request(request).0
    }

    /// The bytes a request is served at where it goes to the small pool,
    /// and the segment it makes where no cached block serves it
    /// ([`CachingAllocator::segment_for`]), rounded once.
    pub fn request(&self, request: Bytes) -> (Option<u64>, u64) {
        let s = self.config.round_size(request.get());
        ((s <= SMALL_SIZE).then_some(s), self.config.segment_size(s))
    }

    /// An allocated block of the small pool, placed.
    pub fn small_block(&self, handle: BlockHandle) -> Option<Placed> {
        self.block(handle.0)
            .filter(|b| b.allocated && b.pool == PoolKind::Small)
            .map(Placed::of)
    }

    /// Keeps, from now on, the small pool's blocks where
    /// [`CachingAllocator::small_blocks`] reads them.
    pub fn index_small_pool(&mut self) {
        if self.small_index.is_some() {
            return;
        }
        let mut index = SmallIndex::default();
        for (id, b) in self.blocks.iter().enumerate() {
            if b.pool == PoolKind::Small && b.size > 0 {
                index.add(id as u32);
            }
        }
        self.small_index = Some(index);
    }

    /// The small pool's blocks, placed, each with whether it is allocated
    /// (in no particular order; `None` where they are not kept).
    pub fn small_blocks(&self) -> Option<impl Iterator<Item = (BlockHandle, Placed, bool)> + '_> {
        let index = self.small_index.as_ref()?;
        Some(index.slots.iter().filter_map(|&id| {
            let b = self.block(id)?;
            Some((BlockHandle(id), Placed::of(b), b.allocated))
        }))
    }

    /// Whether a request of `request` bytes that no cached block serves
    /// gets a new segment at once, as `alloc_block` decides: within the
    /// memory limit, the device and the address space. Where it does, the
    /// request releases nothing, and the small pool is left as it was.
    pub fn can_grow(&self, request: Bytes) -> bool {
        let asize = self.segment_for(request).get();
        let want = self.now.reserved.saturating_add(asize);
        if self.config.expandable_segments || self.memory_limit.is_some_and(|limit| want > limit) {
            return false;
        }
        if self
            .device
            .available_to_allocator()
            .is_some_and(|avail| want > avail)
        {
            return false;
        }
        self.next_segment_address.is_some()
            || round_up(self.next_addr, SMALL_BUFFER).saturating_add(asize) <= ADDRESS_LIMIT
    }

    /// Segments given back to the device and last-resort retries so far:
    /// a release of cached blocks shows in them.
    pub fn releases(&self) -> (u64, u64) {
        (self.num_device_free, self.num_alloc_retries)
    }
}
