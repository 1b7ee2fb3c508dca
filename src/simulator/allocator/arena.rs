//! The block arena: blocks live in one `Vec<Block>`, linked per segment in
//! address order, and each pool indexes its free blocks.
//!
//! Every access to the arena goes through the checked accessors here
//! ([`CachingAllocator::block`], [`CachingAllocator::block_mut`],
//! [`CachingAllocator::pool`]): ids only come from the arena's own links and
//! maps, so a missing block is a bug in the allocator, and the callers stop
//! the operation at hand instead of panicking (a panic would kill the
//! browser's worker).

use super::{free_key, Block, CachingAllocator, Pool, PoolKind, NIL};

impl CachingAllocator {
    /// Puts `b` into a spare slot (or a new one) and returns its id.
    pub(super) fn new_block(&mut self, b: Block) -> u32 {
        let id = match self.spare.pop() {
            Some(id) if (id as usize) < self.blocks.len() => {
                if let Some(slot) = self.blocks.get_mut(id as usize) {
                    *slot = b;
                }
                id
            }
            _ => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        };
        if b.pool == PoolKind::Small {
            if let Some(index) = self.small_index.as_mut() {
                index.add(id);
            }
        }
        id
    }

    /// Returns block `id`'s slot to the spares (it is no longer linked).
    pub(super) fn drop_block(&mut self, id: u32) {
        if let Some(b) = self.blocks.get_mut(id as usize) {
            if b.pool == PoolKind::Small {
                if let Some(index) = self.small_index.as_mut() {
                    index.remove(id);
                }
            }
            b.allocated = false;
            b.size = 0;
            b.prev = NIL;
            b.next = NIL;
            self.spare.push(id);
        }
    }

    /// Block `id`, or `None` for an id the arena never handed out.
    #[inline]
    pub(super) fn block(&self, id: u32) -> Option<&Block> {
        self.blocks.get(id as usize)
    }

    /// Block `id` to change, or `None` for an id the arena never handed out.
    #[inline]
    pub(super) fn block_mut(&mut self, id: u32) -> Option<&mut Block> {
        self.blocks.get_mut(id as usize)
    }

    /// The pool of a kind.
    #[inline]
    pub(super) fn pool(&self, kind: PoolKind) -> &Pool {
        let [small, large] = &self.pools;
        match kind {
            PoolKind::Small => small,
            PoolKind::Large => large,
        }
    }

    /// The pool of a kind, to change.
    #[inline]
    pub(super) fn pool_mut(&mut self, kind: PoolKind) -> &mut Pool {
        let [small, large] = &mut self.pools;
        match kind {
            PoolKind::Small => small,
            PoolKind::Large => large,
        }
    }

    /// Caches free mapped block `id` in its pool's free set; `count_peak`:
    /// it counts towards the peak largest free block.
    pub(super) fn insert_free(&mut self, id: u32, count_peak: bool) {
        let Some(&b) = self.block(id) else {
            return;
        };
        let key = free_key(b.stream, b.size, b.addr);
        let pool = self.pool_mut(b.pool);
        let clock = pool.gc_clock;
        pool.free.insert(key, id);
        if count_peak {
            self.peak_largest_free = self.peak_largest_free.max(b.size);
        }
        if let Some(block) = self.block_mut(id) {
            block.gc_base = clock;
        }
    }

    /// Takes block `id` out of its pool's free set.
    pub(super) fn remove_free(&mut self, id: u32) {
        let Some(&b) = self.block(id) else {
            return;
        };
        let key = free_key(b.stream, b.size, b.addr);
        self.pool_mut(b.pool).free.remove(key);
    }

    /// Makes `id` the next block of `prev` (nothing when `prev` is `NIL`).
    pub(super) fn link_after(&mut self, prev: u32, id: u32) {
        if let Some(block) = self.block_mut(prev) {
            block.next = id;
        }
    }

    /// Makes `id` the previous block of `next` (nothing when `next` is `NIL`).
    pub(super) fn link_before(&mut self, next: u32, id: u32) {
        if let Some(block) = self.block_mut(next) {
            block.prev = id;
        }
    }

    /// Whether block `id` exists and is mapped.
    pub(super) fn is_mapped(&self, id: u32) -> bool {
        self.block(id).is_some_and(|b| b.mapped)
    }
}

/// The arena slots of the small pool's blocks, for a caller that reads the
/// pool block by block ([`CachingAllocator::index_small_pool`]), and each
/// slot's place among them.
#[derive(Debug, Clone, Default)]
pub(super) struct SmallIndex {
    pub(super) slots: Vec<u32>,
    place: Vec<u32>,
}

impl SmallIndex {
    pub(super) fn add(&mut self, id: u32) {
        let i = id as usize;
        if self.place.len() <= i {
            self.place.resize(i + 1, NIL);
        }
        if let Some(p) = self.place.get_mut(i) {
            if *p == NIL {
                *p = self.slots.len() as u32;
                self.slots.push(id);
            }
        }
    }

    fn remove(&mut self, id: u32) {
        let Some(&p) = self.place.get(id as usize).filter(|&&p| p != NIL) else {
            return;
        };
        self.slots.swap_remove(p as usize);
        if let Some(&moved) = self.slots.get(p as usize) {
            if let Some(m) = self.place.get_mut(moved as usize) {
                *m = p;
            }
        }
        if let Some(gone) = self.place.get_mut(id as usize) {
            *gone = NIL;
        }
    }
}
