//! Reading a `_dump_snapshot` pickle into a typed [`Snapshot`]: every
//! device's final segments and trace, and the allocator settings.

use std::collections::BTreeMap;

use crate::diag::Warning;
use crate::replay::pickle::{self, Pickle, ValueId};
use crate::replay::ReplayError;
use crate::simulator::{AllocatorConfig, PoolKind, RuleVersion, DIVISION_INTERVALS, SMALL_BUFFER};
use crate::units::Bytes;

/// What a trace entry records (`TraceEntry::Action` in PyTorch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    /// Snapshots, unknown actions.
    Other,
}

/// One entry of a device's allocator trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEntry {
    pub action: Action,
    pub addr: u64,
    /// The request (alloc, free) or the segment size (segment events).
    pub size: u64,
    /// Small stream id, in order of first appearance (0 is the default stream).
    pub stream: u32,
}

/// One block of a final segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotBlock {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    /// `active_allocated` or `active_pending_free`.
    pub occupied: bool,
}

/// One segment of the snapshot's final state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSegment {
    pub addr: u64,
    pub size: u64,
    pub stream: u32,
    pub pool: PoolKind,
    pub expandable: bool,
    pub blocks: Vec<SnapshotBlock>,
}

/// One device of a snapshot: its final segments and its trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRecording {
    /// The CUDA device index.
    pub device: i64,
    pub segments: Vec<SnapshotSegment>,
    pub entries: Vec<TraceEntry>,
}

/// The parts of a snapshot the replay reads: every device that has final
/// segments or trace entries (by device index), and the allocator settings,
/// which are per process.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub devices: Vec<DeviceRecording>,
    pub config: AllocatorConfig,
    /// The recorded `PYTORCH_CUDA_ALLOC_CONF` and the rule version used.
    pub conf_note: String,
    pub warnings: Vec<Warning>,
}

fn get_u64(p: &Pickle, dict: ValueId, key: &'static str) -> Result<u64, ReplayError> {
    let v = p
        .dict_get(dict, key)
        .and_then(|v| p.as_i64(v))
        .ok_or(ReplayError::SnapshotField(key))?;
    u64::try_from(v).map_err(|_| ReplayError::SnapshotField(key))
}

/// Maps raw `cudaStream_t` values to small ids in order of appearance.
#[derive(Default)]
struct Streams(BTreeMap<i64, u32>);

impl Streams {
    fn id(&mut self, raw: i64) -> u32 {
        let next = self.0.len() as u32;
        *self.0.entry(raw).or_insert(next)
    }
}

/// Reads what the replay needs from a `_dump_snapshot` pickle (already
/// decompressed): the final `segments` with their blocks and the trace of
/// every device (entries with action, address, size and stream, streams
/// renumbered densely), and the allocator settings in force. Long because it
/// checks every field of a format that is an input, not a contract: a
/// missing or mistyped field is a `SnapshotField` error or a warning, never
/// a panic.
pub fn read_snapshot(data: &[u8]) -> Result<Snapshot, ReplayError> {
    let p = pickle::parse(data)?;
    let root = p.root();
    let segments_id = p
        .dict_get(root, "segments")
        .ok_or(ReplayError::SnapshotField("segments"))?;
    let traces_id = p
        .dict_get(root, "device_traces")
        .ok_or(ReplayError::SnapshotField("device_traces"))?;
    let mut warnings = Vec::new();
    let mut streams = Streams::default();
    streams.id(0);
    let mut devices: BTreeMap<i64, DeviceRecording> = BTreeMap::new();
    let device = |id: i64| DeviceRecording {
        device: id,
        segments: Vec::new(),
        entries: Vec::new(),
    };
    let mut skipped_private = 0usize;
    for &s in p.items(segments_id) {
        let dev = p
            .dict_get(s, "device")
            .and_then(|v| p.as_i64(v))
            .unwrap_or(0);
        if let Some(pool_id) = p.dict_get(s, "segment_pool_id") {
            let ids: Vec<i64> = p
                .items(pool_id)
                .iter()
                .filter_map(|&v| p.as_i64(v))
                .collect();
            if ids.iter().any(|&v| v != 0) {
                skipped_private += 1;
                continue;
            }
        }
        let addr = get_u64(&p, s, "address")?;
        let size = get_u64(&p, s, "total_size")?;
        let stream_raw = p
            .dict_get(s, "stream")
            .and_then(|v| p.as_i64(v))
            .unwrap_or(0);
        let pool = match p.dict_get(s, "segment_type").and_then(|v| p.as_str(v)) {
            Some("small") => PoolKind::Small,
            Some("large") => PoolKind::Large,
            _ if size <= SMALL_BUFFER => PoolKind::Small,
            _ => PoolKind::Large,
        };
        let expandable = p
            .dict_get(s, "is_expandable")
            .and_then(|v| p.as_bool(v))
            .unwrap_or(false);
        let blocks_id = p
            .dict_get(s, "blocks")
            .ok_or(ReplayError::SnapshotField("blocks"))?;
        let mut blocks = Vec::new();
        for &b in p.items(blocks_id) {
            let state = p
                .dict_get(b, "state")
                .and_then(|v| p.as_str(v))
                .unwrap_or("");
            blocks.push(SnapshotBlock {
                addr: get_u64(&p, b, "address")?,
                size: get_u64(&p, b, "size")?,
                requested: get_u64(&p, b, "requested_size").unwrap_or(0),
                occupied: state.starts_with("active"),
            });
        }
        devices
            .entry(dev)
            .or_insert_with(|| device(dev))
            .segments
            .push(SnapshotSegment {
                addr,
                size,
                stream: streams.id(stream_raw),
                pool,
                expandable,
                blocks,
            });
    }
    if skipped_private > 0 {
        warnings.push(Warning::new(
            "private_pools_skipped",
            format!("{skipped_private} segments belong to CUDA-graph or user memory pools, which the replay does not model"),
        ));
    }
    // `device_traces` is indexed by device; a device without entries has an
    // empty list.
    for (index, &trace) in p.items(traces_id).iter().enumerate() {
        let items = p.items(trace);
        if items.is_empty() {
            continue;
        }
        let id = index as i64;
        let entries = &mut devices.entry(id).or_insert_with(|| device(id)).entries;
        for &e in items {
            let action = match p.dict_get(e, "action").and_then(|v| p.as_str(v)) {
                Some("alloc") => Action::Alloc,
                Some("free_requested") => Action::FreeRequested,
                // Older recordings log a single `free`.
                Some("free_completed" | "free") => Action::FreeCompleted,
                Some("segment_alloc") => Action::SegmentAlloc,
                Some("segment_free") => Action::SegmentFree,
                Some("segment_map") => Action::SegmentMap,
                Some("segment_unmap") => Action::SegmentUnmap,
                Some("oom") => Action::Oom,
                _ => Action::Other,
            };
            let num = |k: &str| {
                p.dict_get(e, k)
                    .and_then(|v| p.as_i64(v))
                    .and_then(|v| u64::try_from(v).ok())
                    .unwrap_or(0)
            };
            let stream_raw = p
                .dict_get(e, "stream")
                .and_then(|v| p.as_i64(v))
                .unwrap_or(0);
            entries.push(TraceEntry {
                action,
                addr: num("addr"),
                size: num("size"),
                stream: streams.id(stream_raw),
            });
        }
    }
    let (config, conf_note) = read_settings(&p, root)?;
    Ok(Snapshot {
        devices: devices.into_values().collect(),
        config,
        conf_note,
        warnings,
    })
}

/// A recording without any `free_completed` (an older or trimmed format)
/// frees blocks at `free_requested`: its entries with those as the frees, or
/// `None` for a recording that needs no change.
pub(super) fn frees_at_request(entries: &[TraceEntry]) -> Option<Vec<TraceEntry>> {
    let has_completed = entries.iter().any(|e| e.action == Action::FreeCompleted);
    let has_requested = entries.iter().any(|e| e.action == Action::FreeRequested);
    if !has_requested || has_completed {
        return None;
    }
    let mut out = entries.to_vec();
    for e in &mut out {
        if e.action == Action::FreeRequested {
            e.action = Action::FreeCompleted;
        }
    }
    Some(out)
}

/// The allocator configuration recorded in `allocator_settings` (defaults
/// when absent). Snapshots that record `graph_capture_record_stream_reuse`
/// come from recent PyTorch and use R-new rules; others use R-mid.
fn read_settings(p: &Pickle, root: ValueId) -> Result<(AllocatorConfig, String), ReplayError> {
    let Some(s) = p.dict_get(root, "allocator_settings") else {
        return Ok((
            AllocatorConfig::defaults_for(RuleVersion::Mid),
            "defaults (no allocator_settings in the snapshot)".to_owned(),
        ));
    };
    let version = if p.dict_get(s, "graph_capture_record_stream_reuse").is_some() {
        RuleVersion::New
    } else {
        RuleVersion::Mid
    };
    let mut c = AllocatorConfig::defaults_for(version);
    if let Some(v) = p.dict_get(s, "max_split_size").and_then(|v| p.as_i64(v)) {
        if v > 0 && v < i64::MAX {
            c.max_split_size = Some(Bytes(v as u64));
        }
    }
    if let Some(t) = p
        .dict_get(s, "garbage_collection_threshold")
        .and_then(|v| p.as_f64(v))
    {
        if t > 0.0 {
            c.garbage_collection_threshold = Some(t);
        }
    }
    if let Some(e) = p
        .dict_get(s, "expandable_segments")
        .and_then(|v| p.as_bool(v))
    {
        c.expandable_segments = e;
    }
    if let Some(d) = p.dict_get(s, "roundup_power2_divisions") {
        for &(k, v) in p.pairs(d) {
            let (Some(key), Some(val)) = (p.as_str(k), p.as_i64(v)) else {
                continue;
            };
            let Ok(mb) = key.parse::<u64>() else {
                continue;
            };
            if mb.is_power_of_two() {
                let idx = (mb.trailing_zeros() as usize).min(DIVISION_INTERVALS - 1);
                if let Some(slot) = c.roundup_power2_divisions.get_mut(idx) {
                    *slot = u32::try_from(val).unwrap_or(0);
                }
            }
        }
    }
    let conf = p
        .dict_get(s, "PYTORCH_CUDA_ALLOC_CONF")
        .and_then(|v| p.as_str(v))
        .unwrap_or("");
    Ok((c, format!("{conf:?} ({version:?} rules)")))
}
