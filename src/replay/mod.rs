//! Validation mode: replay real GPU-side allocator data through the
//! [`crate::simulator`] and measure how faithfully it reproduces the real
//! allocator.
//!
//! Two inputs are understood (auto-detected, gzip or plain):
//! - `torch.cuda.memory._dump_snapshot` pickles — read by a restricted pickle
//!   reader that never executes anything ([`read_snapshot`], into a typed
//!   [`Snapshot`]); the start state is rebuilt by walking the trace backwards
//!   from the final `segments`, the sizes of blocks allocated before the
//!   recording are repaired by a teacher-forced pass (every allocation placed
//!   at its real address, replay-notes §3), then the trace is replayed
//!   forwards, comparing every segment decision, every reserved value and
//!   every block address ([`replay_snapshot`], [`replay_recording`]);
//! - `torch.profiler` Chrome traces with `profile_memory=True` — read by
//!   [`crate::trace`] like any trace; their GPU `[memory]` events carry the
//!   real `Total Allocated`/`Total Reserved` after every event
//!   ([`replay_profiler`]).
//!
//! Each device is replayed on its own (one allocator per device, as in
//! PyTorch): [`ReplayReport::devices`] has every device's figures, and the
//! top level those of the device with the largest real peak.
//!
//! Gzip is decoded by [`crate::trace::gunzip`], the trace reader's decoder.
//!
//! Pure: bytes in, [`ReplayReport`] out; no I/O.

// A bug here must not kill the browser's worker: every index is checked.
#![deny(clippy::indexing_slicing)]

mod pickle;
mod profiler;
mod snapshot;

use serde::{Deserialize, Serialize};

use crate::diag::Warning;
use crate::trace::{self, TraceError};
use crate::units::Bytes;

pub use profiler::replay_profiler;
pub use snapshot::{
    read_snapshot, replay_recording, replay_snapshot, Action, DeviceRecording, Snapshot,
    SnapshotBlock, SnapshotSegment, TraceEntry,
};

/// Version tag of the JSON report.
pub const SCHEMA: &str = "memcast.replay/1";

/// Why a file could not be replayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The file is gzip that does not decode, or a profiler trace that does
    /// not read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("file is neither a pickled memory snapshot nor a profiler trace; pass a torch.cuda.memory._dump_snapshot pickle or a torch.profiler .json trace, got first byte {0:?}")]
    UnknownFormat(u8),
    #[error("the pickle ends early; pass the complete snapshot file, got truncation at byte {0}")]
    PickleTruncated(usize),
    #[error("the pickle is malformed ({1}); pass a file written by torch.cuda.memory._dump_snapshot, got the problem at byte {0}")]
    PickleMalformed(usize, &'static str),
    #[error("the pickle refers to a python object, which memcast never loads; pass a plain-data snapshot from _dump_snapshot, got opcode {1:#04x} at byte {0}")]
    PickleObject(usize, u8),
    #[error("the snapshot lacks a field the replay needs; pass a snapshot from torch.cuda.memory._dump_snapshot, got no usable {0:?}")]
    SnapshotField(&'static str),
    #[error("the rebuilt start state cannot be loaded into the simulator; the snapshot is inconsistent, got {0:?}")]
    StartState(String),
    #[error("the profiler trace has no GPU [memory] events with totals; record with profile_memory=True on a CUDA device, got {0:?}")]
    NoMemoryEvents(String),
}

/// Which kind of real data was replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplayKind {
    Snapshot,
    Profiler,
}

/// The first place where the simulator and the real allocator disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// Index of the trace entry (snapshot) or GPU memory event (profiler).
    pub event_index: u64,
    /// `reserved`, `allocated`, `address`, `segment_alloc`, `segment_free`, `oom`.
    pub what: String,
    pub expected: u64,
    pub got: u64,
    /// The blocks involved, in words.
    pub detail: String,
}

/// A pre-trace block that the teacher-forced pass grew (replay-notes §3),
/// and the allocation that showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartStateRepair {
    /// Address of the block, allocated before the recording and freed in it.
    pub block_addr: u64,
    /// Its size as the rebuild inferred it (rounded request, plus any gap of
    /// 1 MiB or less to the next occupied block, plus earlier repairs).
    pub inferred_bytes: Bytes,
    /// By how much it grew: its unsplit remainder.
    pub grown_by_bytes: Bytes,
    /// The trace entry of the evidence: a real allocation placed this far
    /// after where the block was believed to end, while it was live.
    pub event_index: u64,
    pub alloc_addr: u64,
    pub alloc_request_bytes: Bytes,
}

/// One device's replay figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReplay {
    /// The device index (snapshot) or `Device Id` (profiler).
    pub device: i64,
    /// Trace entries (snapshot) or GPU `[memory]` events (profiler) replayed.
    pub events: u64,
    /// Events exact, out of `events`, segment events included: after a
    /// non-segment entry (every profiler event) reserved equals the real
    /// value; a real segment event is exact when the simulator made the same
    /// one (`segment_events_matched`). The one ratio to quote.
    pub exact_events: u64,
    /// Events after which reserved was compared (snapshot: all but segment events).
    pub compared_events: u64,
    pub reserved_exact_events: u64,
    /// Profiler only: events where simulated allocated equals `Total Allocated`.
    pub allocated_exact_events: Option<u64>,
    pub real_peak_reserved_bytes: Bytes,
    pub simulated_peak_reserved_bytes: Bytes,
    /// Real segment_alloc + segment_free (profiler: changes of `Total Reserved`).
    pub segment_events_real: u64,
    /// Segment allocations/frees/maps/unmaps the simulator made.
    pub segment_events_simulated: u64,
    /// Real segment events reproduced (same size, same event).
    pub segment_events_matched: u64,
    /// Real segment frees applied as recorded because they were not a cache
    /// flush the simulator agreed with (GC, max_split release, OOM retries
    /// against an unknown capacity); not counted as matched.
    pub segment_frees_forced: u64,
    pub allocs: u64,
    /// Allocations placed at the same address as the real allocator.
    pub address_exact_allocs: u64,
    /// Reserved bytes at the start of the recording (rebuilt or given).
    pub start_reserved_bytes: Bytes,
    /// The allocator was empty when the recording started.
    pub start_complete: bool,
    /// Profiler only: how many times the window was replayed to warm the
    /// cache before the compared pass (0: from a cold allocator).
    #[serde(default)]
    pub warmup_passes: u64,
    /// Pre-trace blocks whose size had to be inferred (snapshot).
    pub start_state_inferred_blocks: u64,
    /// Inferred blocks grown by the teacher-forced pass (replay-notes §3).
    pub start_state_repairs: u64,
    /// The evidence for each repair, in trace order.
    pub start_state_repair_evidence: Vec<StartStateRepair>,
    /// Simulated final segments equal the snapshot's (address and size).
    pub final_segments_match: Option<bool>,
    pub first_divergence: Option<Divergence>,
}

impl DeviceReplay {
    fn new(device: i64) -> DeviceReplay {
        DeviceReplay {
            device,
            events: 0,
            exact_events: 0,
            compared_events: 0,
            reserved_exact_events: 0,
            allocated_exact_events: None,
            real_peak_reserved_bytes: Bytes::ZERO,
            simulated_peak_reserved_bytes: Bytes::ZERO,
            segment_events_real: 0,
            segment_events_simulated: 0,
            segment_events_matched: 0,
            segment_frees_forced: 0,
            allocs: 0,
            address_exact_allocs: 0,
            start_reserved_bytes: Bytes::ZERO,
            start_complete: false,
            warmup_passes: 0,
            start_state_inferred_blocks: 0,
            start_state_repairs: 0,
            start_state_repair_evidence: Vec::new(),
            final_segments_match: None,
            first_divergence: None,
        }
    }

    fn note_divergence(&mut self, d: Divergence) {
        if self.first_divergence.is_none() {
            self.first_divergence = Some(d);
        }
    }

    /// Every event, segment decision and address matched, and the peaks agree.
    pub fn is_exact(&self) -> bool {
        self.exact_events == self.events
            && self.reserved_exact_events == self.compared_events
            && self.segment_events_matched == self.segment_events_real
            && self.segment_events_simulated == self.segment_events_real
            && self.address_exact_allocs == self.allocs
            && self.real_peak_reserved_bytes == self.simulated_peak_reserved_bytes
    }
}

/// Per-file replay figures (JSON schema `memcast.replay/1`): every device
/// replayed on its own (`devices`, by device), and at the top level the
/// figures of the device with the largest real peak (the lowest device on
/// ties), so single-device readers keep working.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayReport {
    pub schema: String,
    pub kind: ReplayKind,
    /// The device with the largest real peak, flattened into the top level.
    #[serde(flatten)]
    pub largest: DeviceReplay,
    /// Every device with trace events or segments, by device.
    pub devices: Vec<DeviceReplay>,
    /// The allocator configuration used.
    pub allocator_conf: String,
    pub warnings: Vec<Warning>,
}

impl ReplayReport {
    /// The report of `devices` (at least one, sorted by device).
    fn from_devices(kind: ReplayKind, devices: Vec<DeviceReplay>) -> ReplayReport {
        let largest = devices
            .iter()
            .max_by_key(|d| (d.real_peak_reserved_bytes, std::cmp::Reverse(d.device)))
            .cloned()
            .unwrap_or_else(|| DeviceReplay::new(0));
        ReplayReport {
            schema: SCHEMA.to_owned(),
            kind,
            largest,
            devices,
            allocator_conf: String::new(),
            warnings: Vec::new(),
        }
    }

    /// Every device replayed exactly ([`DeviceReplay::is_exact`]).
    pub fn is_exact(&self) -> bool {
        self.largest.is_exact() && self.devices.iter().all(DeviceReplay::is_exact)
    }
}

/// Replays a snapshot pickle or a profiler trace, gzip or plain.
pub fn replay(data: &[u8]) -> Result<ReplayReport, ReplayError> {
    let data = trace::gunzip(data)?;
    let first = data
        .iter()
        .copied()
        .find(|c| !c.is_ascii_whitespace())
        .unwrap_or(0);
    match first {
        0x80 => replay_snapshot(&data),
        b'{' | b'[' => {
            let trace = trace::parse(&data).map_err(|err| match err {
                TraceError::NoMemoryEvents => ReplayError::NoMemoryEvents(without_totals(0)),
                TraceError::MemoryEventsWithoutAddress(n) => {
                    ReplayError::NoMemoryEvents(without_totals(n))
                }
                other => ReplayError::Trace(other),
            })?;
            replay_profiler(&trace.value)
        }
        other => Err(ReplayError::UnknownFormat(other)),
    }
}

/// What a profiler trace without usable GPU `[memory]` events had instead.
fn without_totals(n: usize) -> String {
    format!("{n} GPU [memory] events without Addr/Total Allocated/Total Reserved")
}
