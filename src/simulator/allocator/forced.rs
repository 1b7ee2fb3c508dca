//! Teacher forcing, which only the replay uses: an allocation placed where
//! the real allocator placed it instead of where best fit would, so that the
//! simulated state follows a recording exactly (replay-notes §1, §3).

use super::{Block, CachingAllocator, PoolKind, MAX_REQUEST};
use crate::units::Bytes;

/// An allocation placed by [`CachingAllocator::malloc_at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForcedAllocation {
    pub allocation: super::Allocation,
    /// Start of the cached block it was carved from: below the allocation's
    /// address when the real allocator did not start at the block's start.
    pub cached_from: u64,
}

impl CachingAllocator {
    /// Hands out the block for `request` at `addr`, the real allocator's
    /// address, carving it from the cached block of the request's pool and
    /// stream that holds `[addr, addr + rounded)`: the part before `addr` stays
    /// cached and the rest is split by the usual rules (§5.3), so an unsplit
    /// remainder is kept as the real allocator keeps it. With
    /// `new_segment = Some((address, size))` the real allocator's new segment
    /// is created first. `None`, with nothing changed but a new segment, when
    /// no cached block holds the range (the simulated state disagrees with
    /// the recording) or the allocator uses expandable segments, whose pages
    /// are mapped by [`CachingAllocator::malloc`] only.
    pub fn malloc_at(
        &mut self,
        request: Bytes,
        stream: u32,
        addr: u64,
        new_segment: Option<(u64, u64)>,
    ) -> Option<ForcedAllocation> {
        let request = request.get();
        if request > MAX_REQUEST || self.config.expandable_segments {
            return None;
        }
        let stream = self.stream_index(stream);
        let s = self.config.round_size(request);
        let pool = PoolKind::for_rounded(s);
        let end = addr.checked_add(s)?;
        if let Some((base, size)) = new_segment {
            if addr < base || end > base.saturating_add(size) {
                return None;
            }
            self.next_segment_address = Some(base);
            let id = self.alloc_block(pool, stream, s, size);
            self.next_segment_address = None;
            self.insert_free(id?, true);
        }
        let id = self.pool(pool).free.ids().find(|&id| {
            self.block(id).is_some_and(|b| {
                b.stream == stream && b.addr <= addr && end <= b.addr.saturating_add(b.size)
            })
        })?;
        let b = *self.block(id)?;
        self.remove_free(id);
        if addr > b.addr {
            // The cached part before `addr` stays a block of its own.
            let front = self.new_block(Block {
                size: addr - b.addr,
                next: id,
                ..b
            });
            self.link_after(b.prev, front);
            let rest = self.block_mut(id)?;
            rest.prev = front;
            rest.addr = addr;
            rest.size -= addr - b.addr;
            self.insert_free(front, true);
        }
        let allocation = self.hand_out(id, s, request)?;
        self.note_fragmentation();
        Some(ForcedAllocation {
            allocation,
            cached_from: b.addr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::SegmentLayout;
    use super::*;
    use crate::simulator::{AllocatorConfig, GpuMemory};

    const MIB: u64 = Bytes::MIB;

    fn loaded() -> (CachingAllocator, super::super::BlockHandle) {
        let mut sim =
            CachingAllocator::new(AllocatorConfig::pytorch_defaults(), GpuMemory::unlimited());
        let base = 0x7f00_0000_0000;
        let handles = sim
            .load_segment(&SegmentLayout {
                addr: base,
                size: 20 * MIB,
                stream: 0,
                pool: PoolKind::Large,
                expandable: false,
                blocks: vec![(4 * MIB, true, 4 * MIB), (16 * MIB, false, 0)],
            })
            .unwrap();
        (sim, handles[0].handle)
    }

    #[test]
    fn places_at_the_real_address_and_keeps_the_gap_cached() {
        let (mut sim, first) = loaded();
        let base = 0x7f00_0000_0000;
        let at = base + 4 * MIB + 512 * 1024;
        let f = sim.malloc_at(Bytes(8 * MIB), 0, at, None).unwrap();
        assert_eq!(f.allocation.addr, at);
        assert_eq!(f.cached_from, base + 4 * MIB);
        // Best fit would have taken the start of the cached block.
        let views = sim.segments();
        let sizes: Vec<(u64, bool)> = views[0]
            .blocks
            .iter()
            .map(|b| (b.size, b.allocated))
            .collect();
        assert_eq!(
            sizes,
            [
                (4 * MIB, true),
                (512 * 1024, false),
                (8 * MIB, true),
                (7 * MIB + 512 * 1024, false)
            ]
        );
        // Freeing both merges everything back into one cached segment.
        sim.free(first).unwrap();
        sim.free(f.allocation.handle).unwrap();
        assert_eq!(sim.releasable_segments(), [(base, 20 * MIB)]);
        sim.check_invariants().unwrap();
    }

    #[test]
    fn an_unsplit_remainder_stays_with_the_block() {
        let (mut sim, _) = loaded();
        let base = 0x7f00_0000_0000;
        // 15.5 MiB out of the 16 MiB cached block: the 0.5 MiB rest is not split.
        let f = sim
            .malloc_at(Bytes(15 * MIB + 512 * 1024), 0, base + 4 * MIB, None)
            .unwrap();
        assert_eq!(f.allocation.size, Bytes(16 * MIB));
    }

    #[test]
    fn a_new_segment_is_created_where_the_real_one_was() {
        let (mut sim, _) = loaded();
        let seg = 0x7f10_0000_0000;
        let f = sim
            .malloc_at(Bytes(30 * MIB), 0, seg, Some((seg, 30 * MIB)))
            .unwrap();
        assert_eq!(
            (f.allocation.addr, f.allocation.size),
            (seg, Bytes(30 * MIB))
        );
        assert_eq!(sim.reserved(), Bytes(50 * MIB));
    }

    #[test]
    fn an_address_inside_a_live_block_is_refused() {
        let (mut sim, _) = loaded();
        let base = 0x7f00_0000_0000;
        let before = sim.segments();
        assert!(sim.malloc_at(Bytes(2 * MIB), 0, base + MIB, None).is_none());
        assert!(sim
            .malloc_at(Bytes(17 * MIB), 0, base + 4 * MIB, None)
            .is_none());
        assert_eq!(sim.segments(), before);
    }
}
