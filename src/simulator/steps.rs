//! What a [`Runner`] tells of its small pool, so that a caller can let a
//! decode step that takes the decisions a step before it took go by
//! without the allocator (`crate::pipeline`'s cycles): the pool's blocks
//! with the ids that hold them, and the ids moved on by whole steps.

use super::allocator::{BlockHandle, Placed};
use super::{Runner, Sample};
use crate::units::Bytes;

/// Who holds a block of the small pool, as a step sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Owner {
    /// Nobody: the block is cached.
    Free,
    /// The block allocated by event `id`, before the repeated steps.
    Before(u64),
    /// The block allocated this many events after the step's first (or
    /// before it, negative).
    Step(i64),
}

/// One block of the small pool and its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SmallBlock {
    pub placed: Placed,
    pub owner: Owner,
}

/// Notes that allocation `id` holds the block in `handle`'s slot.
pub(super) fn own(owners: &mut Vec<u64>, handle: BlockHandle, id: u64) {
    let slot = handle.slot();
    if owners.len() <= slot {
        owners.resize(slot + 1, 0);
    }
    if let Some(o) = owners.get_mut(slot) {
        *o = id;
    }
}

impl Runner {
    /// Follows the small pool's blocks and who holds them from now on,
    /// where its decisions depend on nothing but its blocks and requests
    /// ([`super::CachingAllocator::small_pool_alone`]) and nothing was
    /// allocated yet. Whether it is followed.
    pub fn follow_small_pool(&mut self) -> bool {
        if self.owners.is_none()
            && self.alloc.small_pool_alone()
            && self.alloc.allocated().get() == 0
        {
            self.alloc.index_small_pool();
            self.owners = Some(Vec::new());
        }
        self.owners.is_some()
    }

    /// Whether the small pool is followed, and its decisions still depend
    /// on nothing but its blocks and requests.
    pub fn follows_small_pool(&self) -> bool {
        self.owners.is_some() && self.alloc.small_pool_alone()
    }

    /// The small pool's blocks in address order, each live one with its
    /// owner: an id from `repeated` on as its distance from `step`, an
    /// earlier one as itself. `None` where the pool is not followed.
    pub fn small_state(&self, repeated: u64, step: u64) -> Option<Vec<SmallBlock>> {
        let owners = self.owners.as_ref()?;
        let mut blocks = Vec::new();
        for (handle, placed, allocated) in self.alloc.small_blocks()? {
            let owner = if !allocated {
                Owner::Free
            } else {
                let id = owners.get(handle.slot()).copied()?;
                if id >= repeated {
                    Owner::Step(i64::try_from(i128::from(id) - i128::from(step)).ok()?)
                } else {
                    Owner::Before(id)
                }
            };
            blocks.push(SmallBlock { placed, owner });
        }
        blocks.sort_unstable();
        Some(blocks)
    }

    /// The bytes a request is served at, where it goes to the small pool.
    pub fn small_rounded(&self, request: Bytes) -> Option<u64> {
        self.alloc.small_rounded(request)
    }

    /// The bytes a request is served at where it goes to the small pool,
    /// and the segment it would make.
    pub fn request(&self, request: Bytes) -> (Option<u64>, u64) {
        self.alloc.request(request)
    }

    /// The size of live block `id` where it is in the small pool.
    pub fn small_size(&self, id: u64) -> Option<u64> {
        Some(self.alloc.small_block(self.live.get(id)?)?.size)
    }

    /// Whether `id` is a live block of the small pool.
    pub fn is_small(&self, id: u64) -> bool {
        self.small_size(id).is_some()
    }

    /// Whether a request that no cached block serves gets a new segment
    /// without releasing anything ([`super::CachingAllocator::can_grow`]).
    pub fn can_grow(&self, request: Bytes) -> bool {
        self.alloc.can_grow(request)
    }

    /// Whether a request would take a cached block now, without a new
    /// segment ([`super::CachingAllocator::serves_from_cache`]).
    pub fn serves_from_cache(&self, request: Bytes, stream: u32) -> bool {
        self.alloc.serves_from_cache(request, stream)
    }

    /// Segments given back and retries so far (a release shows in them).
    pub fn releases(&self) -> (u64, u64) {
        self.alloc.releases()
    }

    /// Allocated and reserved bytes now, with `allocated` more allocated
    /// (what events let go by without the allocator allocated).
    pub fn sample_with(&self, allocated: i64) -> Sample {
        let now = i128::from(self.alloc.allocated().get()) + i128::from(allocated);
        Sample {
            allocated: Bytes(u64::try_from(now.max(0)).unwrap_or(u64::MAX)),
            reserved: self.alloc.reserved(),
        }
    }

    /// Moves every live small-pool id from `repeated` on `by` ids later:
    /// after steps let go by, the blocks their copies hold are the ones
    /// the same places held before, `by` events earlier. False (nothing
    /// moved) where the pool is not followed or an id would overflow.
    pub fn shift_small(&mut self, repeated: u64, by: u64) -> bool {
        let (Some(owners), Some(blocks)) = (self.owners.as_mut(), self.alloc.small_blocks()) else {
            return false;
        };
        let mut moved: Vec<(u64, BlockHandle)> = blocks
            .filter(|&(_, _, allocated)| allocated)
            .filter_map(|(h, _, _)| Some((owners.get(h.slot()).copied()?, h)))
            .filter(|&(id, _)| id >= repeated)
            .collect();
        if moved.iter().any(|(id, _)| id.checked_add(by).is_none()) {
            return false;
        }
        // Latest first, so a moved id never lands on one not moved yet.
        moved.sort_unstable_by_key(|&(id, _)| std::cmp::Reverse(id));
        for (id, handle) in moved {
            self.live.remove(&id);
            self.live.insert(id + by, handle);
            own(owners, handle, id + by);
        }
        true
    }
}
