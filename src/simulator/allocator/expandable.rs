//! Expandable segments (allocator.md §9): one virtual range per pool and
//! stream whose pages are mapped on demand and unmapped when `empty_cache`
//! finds them fully free.

use super::{
    round_up, Block, CachingAllocator, ExpandableSegment, PoolKind, SegmentChange, GIB,
    MAX_REQUEST, NIL, SMALL_BUFFER, UNLIMITED_VA,
};

impl CachingAllocator {
    /// The virtual range reserved for one expandable segment with `page`-sized pages.
    pub(super) fn va_size(&self, page: u64) -> u64 {
        let total = self
            .device
            .capacity
            .map(|c| c.get().saturating_add(c.get() / 8))
            .unwrap_or(UNLIMITED_VA);
        round_up(total.max(page).min(MAX_REQUEST), page)
    }

    /// The page size of an expandable segment of a pool.
    pub(super) fn page_size(&self, pool: PoolKind) -> u64 {
        match pool {
            PoolKind::Small => SMALL_BUFFER,
            PoolKind::Large => self.config.large_segment_size.get(),
        }
    }

    /// Finds or maps `s` contiguous bytes in an expandable segment; the
    /// block comes out of its free set.
    pub(super) fn try_allocate_expandable(
        &mut self,
        pool: PoolKind,
        stream: u32,
        s: u64,
    ) -> Option<u32> {
        let Some(mut cand) = self.find_candidate(pool, stream, s) else {
            self.shortfall = s;
            return None;
        };
        let first = *self.block(cand)?;
        if !first.mapped {
            cand = self.map_block(cand, first.size.min(s))?;
        }
        loop {
            let b = *self.block(cand)?;
            if b.size >= s {
                break;
            }
            let next = self.block(b.next).filter(|n| !n.mapped)?;
            let len = (s - b.size).min(next.size);
            cand = self.map_block(b.next, len)?;
        }
        self.remove_free(cand);
        Some(cand)
    }

    /// The first block of a free run of at least `s` bytes (mapped or not)
    /// of the stream's expandable segments, or a fresh segment's.
    fn find_candidate(&mut self, pool: PoolKind, stream: u32, s: u64) -> Option<u32> {
        let free = |id: u32| self.block(id).filter(|b| !b.allocated);
        for (&(st, _), &u) in self.pool(pool).unmapped.range((stream, 0)..) {
            if st != stream {
                break;
            }
            let prev = self.block(u)?.prev;
            let start = if free(prev).is_some() { prev } else { u };
            let mut total = 0u64;
            let mut b = start;
            while total < s {
                let Some(block) = free(b) else {
                    break;
                };
                total = total.saturating_add(block.size);
                b = block.next;
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

    /// Reserves a virtual range at `base` as one unmapped block.
    pub(super) fn new_expandable(
        &mut self,
        pool: PoolKind,
        stream: u32,
        base: u64,
        page: u64,
        size: u64,
    ) -> u32 {
        let seg = self.expandable.len() as u32;
        self.expandable.push(ExpandableSegment { base, page });
        let id = self.new_block(Block::unmapped(base, size, stream, pool, seg));
        self.pool_mut(pool).unmapped.insert((stream, base), id);
        id
    }

    /// Maps the pages covering the first `len` bytes of unmapped block `id`.
    fn map_block(&mut self, id: u32, len: u64) -> Option<u32> {
        let b = *self.block(id)?;
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
        self.pool_mut(b.pool).unmapped.remove(&(b.stream, b.addr));
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
            self.link_after(id, rest);
            self.pool_mut(b.pool)
                .unmapped
                .insert((b.stream, b.addr + size), rest);
        }
        let m = self.block_mut(id)?;
        m.size = size;
        m.mapped = true;
        self.now.reserved += size;
        self.now.mapped_ranges =
            (self.now.mapped_ranges + 1).saturating_sub(u64::from(left) + u64::from(right));
        self.num_device_alloc += 1;
        self.bump_peaks();
        self.log(SegmentChange::Map { addr: b.addr, size });
        let &Block { prev, next, .. } = self.block(id)?;
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.insert_free(id, false);
        Some(id)
    }

    /// Unmaps the pages fully inside free mapped block `id` (§9.5).
    pub(super) fn unmap_block(&mut self, id: u32) {
        let Some(&b) = self.block(id) else {
            return;
        };
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
        let left = before > 0 || self.is_mapped(b.prev);
        let right = after > 0 || self.is_mapped(b.next);
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
            self.link_before(id, bf);
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
            self.link_after(id, af);
            self.insert_free(af, true);
        }
        let Some(m) = self.block_mut(id) else {
            return;
        };
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
        let Some(&Block { prev, next, .. }) = self.block(id) else {
            return;
        };
        self.try_merge(id, prev);
        self.try_merge(id, next);
        let Some(&b) = self.block(id) else {
            return;
        };
        if b.whole() {
            // The segment is entirely unmapped: release its address range.
            self.drop_block(id);
        } else {
            self.pool_mut(b.pool)
                .unmapped
                .insert((b.stream, b.addr), id);
        }
    }

    /// `b.size` plus the unmapped block right after it (§9.4).
    pub(super) fn potential(&self, b: &Block) -> u64 {
        let extra = self
            .block(b.next)
            .filter(|next| !next.mapped)
            .map_or(0, |next| next.size);
        b.size + extra
    }
}
