//! Giving cached memory back to the device: `empty_cache`, the last-resort
//! release before an out-of-memory error, the oversize-block release of
//! `max_split_size_mb` and the garbage collector (allocator.md §5.4–§5.7).

use super::{free_key, Block, CachingAllocator, PoolKind, SegmentChange, NIL};
use crate::units::Bytes;

impl CachingAllocator {
    /// `cudaFree` of a whole, free, non-expandable segment already removed
    /// from its pool.
    pub(super) fn release_block(&mut self, id: u32) {
        let Some(&Block { addr, size, .. }) = self.block(id) else {
            return;
        };
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
            let ids: Vec<u32> = self.pool(pool).free.ids().collect();
            let mut to_unmap = Vec::new();
            for id in ids {
                let Some(b) = self.block(id) else {
                    continue;
                };
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
            .flat_map(|p| p.free.ids())
            .filter_map(|id| self.block(id))
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
        let found = self.pools.iter().flat_map(|p| p.free.ids()).find(|&id| {
            self.block(id)
                .is_some_and(|b| b.addr == addr && b.seg == NIL && b.whole())
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
    pub(super) fn release_available_cached_blocks(
        &mut self,
        pool: PoolKind,
        stream: u32,
        s: u64,
    ) -> bool {
        let Some(max_split) = self.config.max_split_size.map(Bytes::get) else {
            return false;
        };
        let key = s.max(max_split);
        let p = self.pool(pool);
        let single = p
            .free
            .first_from(free_key(stream, key, 0))
            .filter(|&(_, id)| {
                self.block(id)
                    .is_some_and(|b| b.stream == stream && b.seg == NIL)
            })
            .map(|(_, id)| id);
        if let Some(id) = single {
            if !self.block(id).is_some_and(Block::whole) {
                return false;
            }
            self.remove_free(id);
            self.release_block(id);
            return true;
        }
        let candidates: Vec<u32> = p
            .free
            .before(free_key(stream, key, 0))
            .take_while(|&(_, id)| {
                self.block(id)
                    .is_some_and(|b| b.stream == stream && b.size >= max_split)
            })
            .map(|(_, id)| id)
            .collect();
        let mut released = 0u64;
        for id in candidates {
            if released >= key {
                break;
            }
            let Some(b) = self.block(id) else {
                continue;
            };
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
    pub(super) fn garbage_collect(&mut self) {
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
        let large = PoolKind::Large;
        let clock = self.pool(large).gc_clock;
        let eligible = |b: &Block| b.whole() && b.seg == NIL;
        let mut total_age: u128 = 0;
        let mut count: u128 = 0;
        for b in self.pool(large).free.ids().filter_map(|id| self.block(id)) {
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
            let ids: Vec<u32> = self.pool(large).free.ids().collect();
            for id in ids {
                let Some(b) = self.block(id) else {
                    continue;
                };
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
}
