//! Stage 3 — **simulator**: a two-level model of PyTorch's CUDA caching
//! allocator (xMem §3.4; rules in `shared/docs/allocator.md`).
//!
//! Input: a schedule of [`SimOp`]s (allocations with caller-chosen ids and
//! requested sizes, frees, `empty_cache`), an [`AllocatorConfig`] (parsed from
//! a `PYTORCH_CUDA_ALLOC_CONF`-style string with [`AllocatorConfig::parse`],
//! for a [`RuleVersion`]) and a [`GpuMemory`] (capacity, non-allocator overhead,
//! optional memory-fraction limit). Output: a [`Simulation`] with allocated and
//! reserved bytes after every event, the peak and final [`Stats`] (allocated,
//! reserved, active, segments, largest free block, fragmentation, counters),
//! and an [`OomRecord`] if the device ran out after releasing cached segments
//! and retrying — the simulation stops at the first one.
//!
//! [`simulate_detailed`] also returns the full [`Stats`] after every event.
//!
//! For incremental use (the replay, what-if tools) drive a
//! [`CachingAllocator`] directly: `malloc`/`free`/`empty_cache`/`stats`, block
//! addresses, segment views, loading a known start state
//! ([`CachingAllocator::load_segment`], [`CachingAllocator::load_expandable`]),
//! teacher forcing an allocation to a recorded address
//! ([`CachingAllocator::malloc_at`]) and the device-level [`SegmentChange`] log.
//!
//! Rule revisions: [`RuleVersion::Old`]/`Mid`/`New` select the version
//! differences of allocator.md §15 (division lists, divisions == 1, value
//! validation, which keys exist, GC and oversize release skipping expandable
//! segments in all versions — the older behaviour hit internal asserts).
//!
//! Invariants:
//! - Deterministic and clock-free: time is the schedule's order; addresses of
//!   new segments are synthetic unless the caller provides the real ones.
//! - allocated ≤ reserved ≤ capacity − outside_allocator; live blocks never
//!   overlap; with the default configuration every segment is a multiple of
//!   2 MiB.
//! - Best-fit lookup is logarithmic (ordered maps per pool keyed by stream,
//!   size, address).

// A bug here must not kill the browser's worker: every index is checked.
#![deny(clippy::indexing_slicing)]

mod allocator;
mod config;
mod device;
mod steps;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};

pub use allocator::{
    Allocation, BlockHandle, BlockView, CachingAllocator, ForcedAllocation, LayoutError,
    NotAllocated, OutOfMemory, Placed, PoolKind, SegmentChange, SegmentLayout, SegmentView,
    MAX_REQUEST,
};
pub use config::{
    AllocatorConfig, ConfigError, RuleVersion, DIVISION_INTERVALS, LARGE_BUFFER, MIN_BLOCK_SIZE,
    MIN_LARGE_ALLOC, SMALL_BUFFER, SMALL_SIZE,
};
pub use device::GpuMemory;
pub use steps::{Owner, SmallBlock};

use crate::diag::Warning;
use crate::units::Bytes;

/// One input event of a simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SimOp {
    /// Allocate `size` requested bytes (the simulator rounds) on `stream`;
    /// `block` is a caller-chosen id that the matching `Free` names. A size of
    /// 0 never reaches the allocator (PyTorch returns a null pointer).
    Alloc {
        block: u64,
        size: Bytes,
        stream: u32,
    },
    /// Free the block allocated under this id.
    Free { block: u64 },
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
}

/// Allocated and reserved bytes after one event (compact, for timelines).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    pub allocated: Bytes,
    pub reserved: Bytes,
}

/// Allocator statistics at one moment (or the peak of each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// `memory_allocated()`: block sizes of live allocations.
    pub allocated: Bytes,
    /// `memory_reserved()`: segment sizes (and mapped expandable pages).
    pub reserved: Bytes,
    /// Bytes of blocks not yet reusable (equals allocated without streams).
    pub active: Bytes,
    /// Sum of the un-rounded requests of live allocations.
    pub requested: Bytes,
    /// Segments as `memory_snapshot()` lists them (expandable: mapped ranges).
    pub segments: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Largest cached free block (peak: the largest ever cached).
    pub largest_free_block: Bytes,
    /// reserved − allocated.
    pub fragmentation: Bytes,
    /// Last-resort retries after flushing the cache.
    pub num_alloc_retries: u64,
    /// Out-of-memory errors raised.
    pub num_ooms: u64,
    /// `cudaMalloc` calls and page mappings.
    pub num_device_alloc: u64,
    /// `cudaFree` calls and page unmappings.
    pub num_device_free: u64,
}

/// The first out-of-memory error of a simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomRecord {
    /// Index of the failing event in the input.
    pub event_index: usize,
    /// The caller's id of the failing allocation.
    pub block: u64,
    pub requested: Bytes,
    pub rounded: Bytes,
    /// The segment the allocator tried to obtain.
    pub segment_size: Bytes,
    /// How many more bytes the device would have needed.
    pub missing: Bytes,
    /// Reserved and allocated bytes after the failure (cache releases kept).
    pub reserved: Bytes,
    pub allocated: Bytes,
}

/// The result of [`simulate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Simulation {
    /// One sample per processed input event (up to and including an OOM).
    pub after_event: Vec<Sample>,
    /// The peak of each statistic.
    pub peak: Stats,
    /// The statistics after the last processed event.
    pub final_stats: Stats,
    /// The first OOM, where the simulation stopped.
    pub oom: Option<OomRecord>,
    /// Inconsistencies in the schedule (frees of unknown ids, reused ids).
    pub warnings: Vec<Warning>,
}

/// A fast hasher for caller-chosen `u64` block ids (lookup only; the map is
/// never iterated, so its order cannot leak into results).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        let x = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 29);
    }
}

/// Caller ids to live block handles: a vector for small ids (the common,
/// dense case; its size is bounded by the schedule length), a hash map for
/// the rest.
struct IdMap {
    dense: Vec<Option<BlockHandle>>,
    limit: u64,
    sparse: HashMap<u64, BlockHandle, BuildHasherDefault<IdHasher>>,
}

impl IdMap {
    fn new(n_events: usize) -> IdMap {
        IdMap {
            dense: Vec::new(),
            // The dense part is bounded: a streamed job's ids run to its
            // length, of which few are live at once.
            limit: (n_events as u64)
                .saturating_mul(2)
                .saturating_add(1024)
                .min(1 << 24),
            sparse: HashMap::default(),
        }
    }

    fn insert(&mut self, id: u64, h: BlockHandle) -> Option<BlockHandle> {
        if id < self.limit {
            let i = id as usize;
            if self.dense.len() <= i {
                self.dense.resize(i + 1, None);
            }
            self.dense.get_mut(i).and_then(|slot| slot.replace(h))
        } else {
            self.sparse.insert(id, h)
        }
    }

    fn get(&self, id: u64) -> Option<BlockHandle> {
        if id < self.limit {
            self.dense.get(id as usize).copied().flatten()
        } else {
            self.sparse.get(&id).copied()
        }
    }

    fn remove(&mut self, id: &u64) -> Option<BlockHandle> {
        if *id < self.limit {
            self.dense.get_mut(*id as usize).and_then(Option::take)
        } else {
            self.sparse.remove(id)
        }
    }

    /// Its live ids and handles, by id.
    fn entries(&self) -> Vec<(u64, BlockHandle)> {
        let mut out: Vec<(u64, BlockHandle)> = self
            .dense
            .iter()
            .enumerate()
            .filter_map(|(id, h)| h.map(|h| (id as u64, h)))
            .collect();
        let mut sparse: Vec<(u64, BlockHandle)> =
            self.sparse.iter().map(|(&id, &h)| (id, h)).collect();
        sparse.sort_unstable_by_key(|&(id, _)| id);
        out.extend(sparse);
        out
    }

    /// The map of `entries` with the dense part bounded by `limit`.
    fn of_entries(limit: u64, entries: &[(u64, BlockHandle)]) -> IdMap {
        let mut map = IdMap {
            dense: Vec::new(),
            limit,
            sparse: HashMap::default(),
        };
        for &(id, h) in entries {
            map.insert(id, h);
        }
        map
    }
}

/// A [`Runner`] set aside to go on later ([`Runner::resume`]): its
/// allocator, and its live ids as a list rather than a table as long as
/// the largest id.
#[derive(Debug, Clone)]
pub struct Suspended {
    alloc: CachingAllocator,
    live: Vec<(u64, BlockHandle)>,
    owners: Option<Vec<u64>>,
    limit: u64,
    unknown_frees: u64,
    first_unknown: Option<u64>,
    reused_ids: u64,
}

impl Suspended {
    /// About the bytes it holds.
    pub fn footprint(&self) -> Bytes {
        let live = self.live.len() * std::mem::size_of::<(u64, BlockHandle)>()
            + self.owners.as_ref().map_or(0, Vec::len) * std::mem::size_of::<u64>();
        Bytes(self.alloc.footprint().get().saturating_add(live as u64))
    }

    /// The same run on `device` from here on, where every decision so far
    /// is the one it would have taken there
    /// ([`CachingAllocator::on_device`]); `None` otherwise.
    pub fn on_device(&self, device: GpuMemory) -> Option<Suspended> {
        Some(Suspended {
            alloc: self.alloc.on_device(device)?,
            live: self.live.clone(),
            owners: self.owners.clone(),
            ..*self
        })
    }
}

/// Runs a schedule through a fresh [`CachingAllocator`].
pub fn simulate(events: &[SimOp], config: &AllocatorConfig, device: &GpuMemory) -> Simulation {
    run(events, config, device, |_| {})
}

/// A simulation fed one event at a time ([`Runner::step`]), for a caller
/// that streams its events rather than holding them (a rebuilt job of
/// hundreds of millions): allocations under caller ids (a reused live id
/// frees the older block first), frees of unknown ids counted,
/// `empty_cache`. [`simulate`] runs a slice through one.
pub struct Runner {
    alloc: CachingAllocator,
    live: IdMap,
    /// Where the small pool is followed ([`Runner::follow_small_pool`]):
    /// by arena slot, the id of the allocation that took it last.
    owners: Option<Vec<u64>>,
    unknown_frees: u64,
    first_unknown: Option<u64>,
    reused_ids: u64,
}

impl Runner {
    /// A fresh allocator; `n_events` sizes the id table (a hint: ids of any
    /// size are served).
    pub fn new(config: &AllocatorConfig, device: &GpuMemory, n_events: usize) -> Runner {
        Runner {
            alloc: CachingAllocator::new(config.clone(), *device),
            live: IdMap::new(n_events),
            owners: None,
            unknown_frees: 0,
            first_unknown: None,
            reused_ids: 0,
        }
    }

    /// Applies one event; an allocation the device cannot serve (after
    /// releasing the cache and retrying) is the out-of-memory error, whose
    /// `event_index` is `event_index`.
    pub fn step(&mut self, event_index: usize, op: &SimOp) -> Result<(), OomRecord> {
        match *op {
            SimOp::Alloc {
                block,
                size,
                stream,
            } => {
                if size.get() > 0 {
                    match self.alloc.malloc(size, stream) {
                        Ok(a) => {
                            if let Some(owners) = self.owners.as_mut() {
                                steps::own(owners, a.handle, block);
                            }
                            if let Some(old) = self.live.insert(block, a.handle) {
                                // The caller reused a live id: free the old block
                                // so the schedule stays balanced.
                                self.reused_ids += 1;
                                let _ = self.alloc.free(old);
                            }
                        }
                        Err(e) => {
                            return Err(OomRecord {
                                event_index,
                                block,
                                requested: e.requested,
                                rounded: e.rounded,
                                segment_size: e.segment_size,
                                missing: e.missing,
                                reserved: e.reserved,
                                allocated: e.allocated,
                            });
                        }
                    }
                }
            }
            SimOp::Free { block } => match self.live.remove(&block) {
                Some(h) => {
                    let _ = self.alloc.free(h);
                }
                None => {
                    self.unknown_frees += 1;
                    self.first_unknown.get_or_insert(block);
                }
            },
            SimOp::EmptyCache => self.alloc.empty_cache(),
        }
        Ok(())
    }

    /// The run set aside as it is now.
    pub fn suspend(&self) -> Suspended {
        Suspended {
            alloc: self.alloc.clone(),
            live: self.live.entries(),
            owners: self.owners.clone(),
            limit: self.live.limit,
            unknown_frees: self.unknown_frees,
            first_unknown: self.first_unknown,
            reused_ids: self.reused_ids,
        }
    }

    /// A run set aside, going on.
    pub fn resume(s: Suspended) -> Runner {
        Runner {
            live: IdMap::of_entries(s.limit, &s.live),
            owners: s.owners,
            alloc: s.alloc,
            unknown_frees: s.unknown_frees,
            first_unknown: s.first_unknown,
            reused_ids: s.reused_ids,
        }
    }

    /// What a request of `request` bytes adds to the reserved bytes at most.
    pub fn segment_for(&self, request: Bytes) -> Bytes {
        self.alloc.segment_for(request)
    }

    /// The device address of live block `block` (the id its allocation
    /// was given), `None` when it is not live.
    pub fn address_of(&self, block: u64) -> Option<u64> {
        self.live.get(block).and_then(|h| self.alloc.block_addr(h))
    }

    /// Allocated and reserved bytes now.
    pub fn sample(&self) -> Sample {
        Sample {
            allocated: self.alloc.allocated(),
            reserved: self.alloc.reserved(),
        }
    }

    /// The allocator, for its statistics.
    pub fn allocator(&self) -> &CachingAllocator {
        &self.alloc
    }

    /// The warnings about the events fed (frees of unknown ids, reused ids).
    pub fn warnings(&self) -> Vec<Warning> {
        let mut warnings = Vec::new();
        if let Some(first) = self.first_unknown {
            warnings.push(Warning::new(
                "free_of_unknown_block",
                format!(
                    "{} frees name a block that is not allocated (first: id {first}); they were ignored, and 0-byte allocations are expected among them",
                    self.unknown_frees
                ),
            ));
        }
        if self.reused_ids > 0 {
            warnings.push(Warning::new(
                "alloc_of_live_block_id",
                format!(
                    "{} allocations reused the id of a live block; the older block was freed first",
                    self.reused_ids
                ),
            ));
        }
        warnings
    }
}

/// Runs a schedule through a fresh allocator, calling `observe` after each
/// event; stops at the first out-of-memory error and records it.
/// [`simulate`] and [`simulate_detailed`] differ only in what they observe.
fn run(
    events: &[SimOp],
    config: &AllocatorConfig,
    device: &GpuMemory,
    mut observe: impl FnMut(&CachingAllocator),
) -> Simulation {
    let mut runner = Runner::new(config, device, events.len());
    let mut after_event = Vec::with_capacity(events.len());
    let mut oom = None;
    for (event_index, op) in events.iter().enumerate() {
        if let Err(record) = runner.step(event_index, op) {
            oom = Some(record);
        }
        after_event.push(runner.sample());
        observe(runner.allocator());
        if oom.is_some() {
            break;
        }
    }
    Simulation {
        after_event,
        peak: runner.alloc.peak_stats(),
        final_stats: runner.alloc.stats(),
        oom,
        warnings: runner.warnings(),
    }
}

/// [`simulate`] plus the full [`Stats`] after every event (allocated,
/// reserved, active, segments, largest free block, fragmentation, counters).
/// Costs about 100 bytes per event: meant for inspection, not sweeps.
pub fn simulate_detailed(
    events: &[SimOp],
    config: &AllocatorConfig,
    device: &GpuMemory,
) -> (Simulation, Vec<Stats>) {
    let mut stats = Vec::with_capacity(events.len());
    let sim = run(events, config, device, |a| stats.push(a.stats()));
    (sim, stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = Bytes::MIB;

    fn alloc(block: u64, size: u64) -> SimOp {
        SimOp::Alloc {
            block,
            size: Bytes(size),
            stream: 0,
        }
    }

    #[test]
    fn free_caches_and_empty_cache_releases() {
        let ops = [alloc(1, 1), SimOp::Free { block: 1 }, SimOp::EmptyCache];
        let sim = simulate(
            &ops,
            &AllocatorConfig::pytorch_defaults(),
            &GpuMemory::unlimited(),
        );
        let got: Vec<(u64, u64)> = sim
            .after_event
            .iter()
            .map(|s| (s.allocated.get(), s.reserved.get()))
            .collect();
        assert_eq!(got, [(512, 2 * MIB), (0, 2 * MIB), (0, 0)]);
        assert_eq!(sim.peak.reserved, Bytes(2 * MIB));
        assert_eq!(sim.final_stats.segments, 0);
        assert!(sim.warnings.is_empty());
    }

    #[test]
    fn oom_stops_the_simulation_and_says_what_was_missing() {
        let ops = [alloc(1, 60 * MIB), alloc(2, 50 * MIB), alloc(3, 1)];
        let device = GpuMemory::new(Bytes(100 * MIB), Bytes(0));
        let sim = simulate(&ops, &AllocatorConfig::pytorch_defaults(), &device);
        let oom = sim.oom.unwrap();
        assert_eq!(oom.event_index, 1);
        assert_eq!(oom.segment_size, Bytes(50 * MIB));
        assert_eq!(oom.missing, Bytes(10 * MIB));
        assert_eq!(sim.after_event.len(), 2);
    }

    #[test]
    fn outside_memory_reduces_what_cudamalloc_may_take() {
        let ops = [alloc(1, 60 * MIB)];
        let device = GpuMemory::new(Bytes(100 * MIB), Bytes(50 * MIB));
        let sim = simulate(&ops, &AllocatorConfig::pytorch_defaults(), &device);
        assert_eq!(sim.oom.unwrap().missing, Bytes(10 * MIB));
    }

    #[test]
    fn unknown_frees_are_reported_not_fatal() {
        let ops = [
            SimOp::Free { block: 9 },
            alloc(0, 0),
            SimOp::Free { block: 0 },
        ];
        let sim = simulate(
            &ops,
            &AllocatorConfig::pytorch_defaults(),
            &GpuMemory::unlimited(),
        );
        assert_eq!(sim.after_event.len(), 3);
        assert_eq!(sim.warnings.len(), 1);
        assert_eq!(sim.warnings[0].code, "free_of_unknown_block");
    }

    #[test]
    fn fragmentation_peak_is_reserved_minus_allocated() {
        let ops = [
            alloc(1, 5 * MIB),
            alloc(2, 5 * MIB),
            SimOp::Free { block: 1 },
        ];
        let sim = simulate(
            &ops,
            &AllocatorConfig::pytorch_defaults(),
            &GpuMemory::unlimited(),
        );
        assert_eq!(sim.peak.fragmentation, Bytes(15 * MIB));
        assert_eq!(sim.final_stats.fragmentation, Bytes(15 * MIB));
        assert_eq!(sim.final_stats.largest_free_block, Bytes(10 * MIB));
    }

    #[test]
    fn absurd_requests_are_out_of_memory_not_a_panic() {
        for config in ["", "expandable_segments:True", "roundup_power2_divisions:8"] {
            let config = AllocatorConfig::parse(config, RuleVersion::New).unwrap();
            let ops: Vec<SimOp> = (0..5000)
                .map(|i| {
                    alloc(
                        i,
                        if i % 2 == 0 {
                            u64::MAX - i
                        } else {
                            MAX_REQUEST
                        },
                    )
                })
                .collect();
            let sim = simulate(&ops, &config, &GpuMemory::unlimited());
            let oom = sim.oom.unwrap();
            assert_eq!(oom.event_index, 0);
            let ops: Vec<SimOp> = (0..5000).map(|i| alloc(i, MAX_REQUEST)).collect();
            let sim = simulate(&ops, &config, &GpuMemory::unlimited());
            // 1 PiB segments exhaust the synthetic address space: an OOM.
            assert!(sim.oom.is_some());
            assert!(sim.peak.reserved.get() < 1 << 62);
        }
    }

    #[test]
    fn detailed_stats_follow_every_event_and_peak_matches() {
        let ops = [
            alloc(1, 5 * MIB),
            alloc(2, 5 * MIB),
            SimOp::Alloc {
                block: 3,
                size: Bytes(3 * MIB),
                stream: 1,
            },
            SimOp::Free { block: 1 },
            SimOp::Free { block: 3 },
            alloc(4, 600),
            SimOp::EmptyCache,
        ];
        let config = AllocatorConfig::pytorch_defaults();
        let (sim, stats) = simulate_detailed(&ops, &config, &GpuMemory::unlimited());
        assert_eq!(sim, simulate(&ops, &config, &GpuMemory::unlimited()));
        assert_eq!(stats.len(), ops.len());
        let largest: Vec<u64> = stats.iter().map(|s| s.largest_free_block.get()).collect();
        assert_eq!(
            largest,
            [
                15 * MIB,
                10 * MIB,
                17 * MIB,
                17 * MIB,
                20 * MIB,
                20 * MIB,
                10 * MIB
            ]
        );
        assert_eq!(
            sim.peak.largest_free_block.get(),
            *largest.iter().max().unwrap()
        );
        for (s, sample) in stats.iter().zip(&sim.after_event) {
            assert_eq!(
                (s.allocated, s.reserved),
                (sample.allocated, sample.reserved)
            );
            assert_eq!(s.fragmentation.get(), s.reserved.get() - s.allocated.get());
        }
        let frag = stats.iter().map(|s| s.fragmentation).max().unwrap();
        assert_eq!(sim.peak.fragmentation, frag);
        assert_eq!(stats[2].segments, 2);
    }
}
