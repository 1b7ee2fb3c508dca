//! The device level (allocator.md §5.5, §12): how much memory `cudaMalloc` may
//! hand the allocator before it fails.

use serde::{Deserialize, Serialize};

use crate::units::Bytes;

/// A GPU as the allocator sees it.
///
/// `cudaMalloc(n)` (or mapping `n` bytes of expandable pages) succeeds iff
/// `reserved + n ≤ capacity − outside_allocator`. Separately, a memory-fraction
/// limit (`torch.cuda.set_per_process_memory_fraction`) makes the allocator
/// refuse a new segment when `reserved + segment > memory_limit`, without
/// calling CUDA.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuMemory {
    /// Total device memory usable by this process; `None` = unlimited.
    pub capacity: Option<Bytes>,
    /// Memory held outside the caching allocator: CUDA context, library
    /// handles, NCCL buffers (allocator.md §12).
    pub outside_allocator: Bytes,
    /// `allowed_memory_maximum` (= fraction × device total) when a
    /// per-process memory fraction is set; `None` = no limit. Garbage
    /// collection only runs when this is set.
    #[serde(default)]
    pub memory_limit: Option<Bytes>,
}

impl GpuMemory {
    /// A device on which `cudaMalloc` never fails.
    pub fn unlimited() -> GpuMemory {
        GpuMemory::default()
    }

    /// A device with `capacity` bytes of which `outside_allocator` are taken
    /// by the context and libraries.
    pub fn new(capacity: Bytes, outside_allocator: Bytes) -> GpuMemory {
        GpuMemory {
            capacity: Some(capacity),
            outside_allocator,
            memory_limit: None,
        }
    }

    /// The bytes segments may occupy in total, if limited.
    pub fn available_to_allocator(&self) -> Option<u64> {
        self.capacity
            .map(|c| c.get().saturating_sub(self.outside_allocator.get()))
    }
}
