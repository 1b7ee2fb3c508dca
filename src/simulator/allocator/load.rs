//! The allocator's state as data: the segment views of
//! `torch.cuda.memory_snapshot()` and loading a known state (the start of a
//! recording, rebuilt by the replay), plus the invariant check the tests use.

use super::{
    round_up, Allocation, Block, BlockHandle, BlockView, CachingAllocator, ExpandableSegment,
    LayoutError, PoolKind, SegmentLayout, SegmentView, GIB, NIL,
};
use crate::units::Bytes;

impl CachingAllocator {
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
                let Some(blk) = self.block(id) else {
                    break;
                };
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
        // Any mapped block overlapping the range overlaps a loaded segment
        // (one pass over the arena; `segments()` here made loading a start
        // state of n segments quadratic).
        if self.blocks.iter().any(|b| {
            b.mapped && b.size > 0 && b.addr < end && layout.addr < b.addr.saturating_add(b.size)
        }) {
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
            let mapped = self
                .map_loaded(id, layout.size)
                .ok_or(LayoutError::Lost(layout.addr))?;
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
            self.link_before(tail, prev);
        }
        for &id in &ids {
            let Some(&b) = self.block(id) else {
                return Err(LayoutError::Lost(layout.addr));
            };
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
        let template = Block::unmapped(base, 0, stream_idx, pool, seg);
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
                self.pool_mut(pool).unmapped.insert((stream_idx, at), id);
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
            self.pool_mut(pool).unmapped.insert((stream_idx, at), id);
        }
        self.bump_peaks();
        self.note_fragmentation();
        Ok(out)
    }

    /// Turns the head of a fresh expandable segment's unmapped block into
    /// space for loaded blocks; returns `(segment index, unmapped tail id)`.
    fn map_loaded(&mut self, id: u32, size: u64) -> Option<(u32, u32)> {
        let b = *self.block(id)?;
        self.pool_mut(b.pool).unmapped.remove(&(b.stream, b.addr));
        self.drop_block(id);
        let tail = self.new_block(Block {
            addr: b.addr + size,
            size: b.size - size,
            prev: NIL,
            next: NIL,
            ..b
        });
        self.pool_mut(b.pool)
            .unmapped
            .insert((b.stream, b.addr + size), tail);
        Some((b.seg, tail))
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
