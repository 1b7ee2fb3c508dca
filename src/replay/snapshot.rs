//! Replay of a `torch.cuda.memory._dump_snapshot` pickle (allocator.md §13,
//! replay-notes.md §1): read the final `segments` and the device trace,
//! rebuild the allocator state at the start of the recording by walking the
//! trace backwards, load it into the simulator and replay forwards, comparing
//! every decision with the real allocator's.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::pickle::{self, Pickle, ValueId};
use super::{Divergence, ReplayError, ReplayKind, ReplayReport};
use crate::diag::Warning;
use crate::simulator::{
    AllocatorConfig, BlockHandle, CachingAllocator, Device, PoolKind, RuleVersion, SegmentChange,
    SegmentLayout, DIVISION_INTERVALS, SMALL_BUFFER, SMALL_SIZE,
};
use crate::units::Bytes;

/// How many times the start state may be repaired and the replay re-run.
const MAX_REPAIRS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Other,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    action: Action,
    addr: u64,
    size: u64,
    stream: u32,
}

#[derive(Debug, Clone)]
struct Block {
    addr: u64,
    size: u64,
    requested: u64,
    occupied: bool,
}

#[derive(Debug, Clone)]
struct Segment {
    addr: u64,
    size: u64,
    stream: u32,
    pool: PoolKind,
    expandable: bool,
    blocks: Vec<Block>,
}

/// The parts of a snapshot the replay needs.
#[derive(Debug, Clone)]
struct Snapshot {
    segments: Vec<Segment>,
    events: Vec<Event>,
    config: AllocatorConfig,
    conf_note: String,
    warnings: Vec<Warning>,
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

fn read_snapshot(data: &[u8]) -> Result<Snapshot, ReplayError> {
    let p = pickle::parse(data)?;
    let root = p.root();
    let segments_id = p
        .dict_get(root, "segments")
        .ok_or(ReplayError::SnapshotField("segments"))?;
    let traces_id = p
        .dict_get(root, "device_traces")
        .ok_or(ReplayError::SnapshotField("device_traces"))?;
    let mut warnings = Vec::new();
    // Replay the device with the most trace entries (lowest index on ties).
    let traces = p.items(traces_id);
    let device = traces
        .iter()
        .enumerate()
        .max_by_key(|(i, &t)| (p.items(t).len(), std::cmp::Reverse(*i)))
        .map_or(0, |(i, _)| i);
    if traces.iter().filter(|&&t| !p.items(t).is_empty()).count() > 1 {
        warnings.push(Warning::new(
            "several_devices",
            format!(
                "the snapshot has traces for several devices; only device {device} is replayed"
            ),
        ));
    }
    let mut streams = Streams::default();
    streams.id(0);
    let mut segments = Vec::new();
    let mut skipped_private = 0usize;
    for &s in p.items(segments_id) {
        let dev = p
            .dict_get(s, "device")
            .and_then(|v| p.as_i64(v))
            .unwrap_or(0);
        if dev != device as i64 {
            continue;
        }
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
            blocks.push(Block {
                addr: get_u64(&p, b, "address")?,
                size: get_u64(&p, b, "size")?,
                requested: get_u64(&p, b, "requested_size").unwrap_or(0),
                occupied: state.starts_with("active"),
            });
        }
        segments.push(Segment {
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
    let mut events = Vec::new();
    if let Some(&trace) = traces.get(device) {
        for &e in p.items(trace) {
            let action = match p.dict_get(e, "action").and_then(|v| p.as_str(v)) {
                Some("alloc") => Action::Alloc,
                Some("free_requested") => Action::FreeRequested,
                Some("free_completed") => Action::FreeCompleted,
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
            events.push(Event {
                action,
                addr: num("addr"),
                size: num("size"),
                stream: streams.id(stream_raw),
            });
        }
    }
    let (config, conf_note) = read_settings(&p, root)?;
    Ok(Snapshot {
        segments,
        events,
        config,
        conf_note,
        warnings,
    })
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

/// A pre-trace block whose size had to be inferred.
#[derive(Debug, Clone, Copy)]
struct Inferred {
    size: u64,
}

/// The allocator state at the start of the recording.
struct StartState {
    layouts: Vec<SegmentLayout>,
    /// Addresses of occupied blocks, in layout order, per layout.
    occupied_addrs: Vec<Vec<u64>>,
    inferred: BTreeMap<u64, Inferred>,
    reserved: u64,
    complete: bool,
    inconsistencies: u64,
}

fn rebuild_start(snap: &Snapshot, repairs: &BTreeMap<u64, u64>) -> Result<StartState, ReplayError> {
    #[derive(Clone, Copy)]
    struct Occ {
        size: Option<u64>,
        requested: u64,
    }
    #[derive(Clone, Copy)]
    struct Seg {
        size: u64,
        stream: u32,
        pool: PoolKind,
        expandable: bool,
    }
    let mut occupied: BTreeMap<u64, Occ> = BTreeMap::new();
    let mut segs: BTreeMap<u64, Seg> = BTreeMap::new();
    for s in &snap.segments {
        segs.insert(
            s.addr,
            Seg {
                size: s.size,
                stream: s.stream,
                pool: s.pool,
                expandable: s.expandable,
            },
        );
        for b in s.blocks.iter().filter(|b| b.occupied) {
            occupied.insert(
                b.addr,
                Occ {
                    size: Some(b.size),
                    requested: b.requested,
                },
            );
        }
    }
    let mut inconsistencies = 0u64;
    for e in snap.events.iter().rev() {
        match e.action {
            Action::Alloc => {
                if occupied.remove(&e.addr).is_none() {
                    inconsistencies += 1;
                }
            }
            Action::FreeCompleted => {
                let occ = Occ {
                    size: None,
                    requested: e.size,
                };
                if occupied.insert(e.addr, occ).is_some() {
                    inconsistencies += 1;
                }
            }
            Action::SegmentAlloc => {
                if segs.remove(&e.addr).is_none() {
                    inconsistencies += 1;
                }
            }
            Action::SegmentFree => {
                let pool = if e.size <= SMALL_BUFFER {
                    PoolKind::Small
                } else {
                    PoolKind::Large
                };
                let seg = Seg {
                    size: e.size,
                    stream: e.stream,
                    pool,
                    expandable: false,
                };
                if segs.insert(e.addr, seg).is_some() {
                    inconsistencies += 1;
                }
            }
            Action::SegmentMap | Action::SegmentUnmap => {
                return Err(ReplayError::ExpandableGrowth);
            }
            Action::FreeRequested | Action::Oom | Action::Other => {}
        }
    }
    let mut layouts = Vec::new();
    let mut occupied_addrs = Vec::new();
    let mut inferred = BTreeMap::new();
    let mut reserved = 0u64;
    let mut placed = 0usize;
    for (&addr, seg) in &segs {
        reserved += seg.size;
        let end = addr + seg.size;
        let inside: Vec<(u64, Occ)> = occupied.range(addr..end).map(|(&a, &o)| (a, o)).collect();
        placed += inside.len();
        let mut blocks = Vec::new();
        let mut addrs = Vec::new();
        let mut at = addr;
        for (i, &(a, occ)) in inside.iter().enumerate() {
            let next_start = inside.get(i + 1).map_or(end, |&(n, _)| n);
            if a < at {
                inconsistencies += 1;
                continue;
            }
            if a > at {
                blocks.push((a - at, false, 0));
            }
            let size = match occ.size {
                Some(s) => s,
                None => {
                    let mut s = snap.config.round_size(occ.requested);
                    let gap = next_start.saturating_sub(a + s);
                    // An unsplit remainder: large-pool free blocks are > 1 MiB.
                    if seg.pool == PoolKind::Large
                        && !seg.expandable
                        && gap > 0
                        && gap <= SMALL_SIZE
                    {
                        s += gap;
                    }
                    s += repairs.get(&a).copied().unwrap_or(0);
                    inferred.insert(a, Inferred { size: s });
                    s
                }
            };
            let size = size.min(next_start - a);
            blocks.push((size, true, occ.requested));
            addrs.push(a);
            at = a + size;
        }
        if at < end {
            blocks.push((end - at, false, 0));
        }
        layouts.push(SegmentLayout {
            addr,
            size: seg.size,
            stream: seg.stream,
            pool: seg.pool,
            expandable: seg.expandable,
            blocks,
        });
        occupied_addrs.push(addrs);
    }
    inconsistencies += (occupied.len() - placed) as u64;
    let complete = segs.is_empty() && occupied.is_empty();
    Ok(StartState {
        layouts,
        occupied_addrs,
        inferred,
        reserved,
        complete,
        inconsistencies,
    })
}

struct RunOutcome {
    report: ReplayReport,
    repair: Option<(u64, u64)>,
}

fn run_once(snap: &Snapshot, repairs: &BTreeMap<u64, u64>) -> Result<RunOutcome, ReplayError> {
    let start = rebuild_start(snap, repairs)?;
    let mut sim = CachingAllocator::new(snap.config.clone(), Device::unlimited());
    let mut live: HashMap<u64, BlockHandle> = HashMap::new();
    for (layout, addrs) in start.layouts.iter().zip(&start.occupied_addrs) {
        let handles = sim
            .load_segment(layout)
            .map_err(|e| ReplayError::StartState(e.to_string()))?;
        for (a, &addr) in handles.iter().zip(addrs) {
            live.insert(addr, a.handle);
        }
    }
    sim.record_segment_changes(true);
    let mut inferred_live = start.inferred.clone();

    let mut r = ReplayReport::new(ReplayKind::Snapshot);
    r.allocator_conf = snap.conf_note.clone();
    r.start_reserved_bytes = start.reserved;
    r.start_complete = start.complete;
    r.events = snap.events.len() as u64;
    let mut real_reserved = start.reserved;
    let mut real_peak = real_reserved;
    let mut sim_peak = sim.reserved().get();
    let mut pending_segments: Vec<(u64, u64)> = Vec::new();
    let mut burst_frees: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut prev_action = Action::Other;
    let mut unknown_frees = 0u64;
    let mut real_ooms = 0u64;
    let mut repair = None;

    for (index, e) in snap.events.iter().enumerate() {
        let index = index as u64;
        match e.action {
            Action::SegmentAlloc => {
                real_reserved += e.size;
                r.segment_events_real += 1;
                pending_segments.push((e.addr, e.size));
            }
            Action::SegmentFree => {
                real_reserved = real_reserved.saturating_sub(e.size);
                r.segment_events_real += 1;
                if prev_action != Action::SegmentFree {
                    // A burst of cudaFree: the real allocator flushed its cache
                    // (empty_cache or an OOM retry); its timing is an input.
                    sim.release_cached_blocks();
                    for c in sim.take_segment_changes() {
                        r.segment_events_simulated += 1;
                        if let SegmentChange::Free { addr, size } = c {
                            burst_frees.insert((addr, size));
                        }
                    }
                }
                if burst_frees.remove(&(e.addr, e.size)) {
                    r.segment_events_matched += 1;
                } else {
                    r.note_divergence(Divergence {
                        event_index: index,
                        what: "segment_free".to_owned(),
                        expected: e.size,
                        got: 0,
                        detail: format!(
                            "the real allocator freed the segment at {:#x}, the simulator did not",
                            e.addr
                        ),
                    });
                }
            }
            Action::SegmentMap | Action::SegmentUnmap => return Err(ReplayError::ExpandableGrowth),
            Action::Alloc => {
                r.allocs += 1;
                let real_new = pending_segments.first().copied();
                sim.set_next_segment_address(real_new.map(|(a, _)| a));
                let result = sim.malloc(Bytes(e.size), e.stream);
                sim.set_next_segment_address(None);
                let changes = sim.take_segment_changes();
                r.segment_events_simulated += changes.len() as u64;
                let sim_new: Vec<u64> = changes
                    .iter()
                    .filter_map(|c| match c {
                        SegmentChange::Alloc { size, .. } => Some(*size),
                        _ => None,
                    })
                    .collect();
                for &(addr, size) in &pending_segments {
                    if sim_new.len() == 1
                        && sim_new.first() == Some(&size)
                        && real_new == Some((addr, size))
                    {
                        r.segment_events_matched += 1;
                    } else {
                        r.note_divergence(Divergence {
                            event_index: index,
                            what: "segment_alloc".to_owned(),
                            expected: size,
                            got: sim_new.first().copied().unwrap_or(0),
                            detail: format!("alloc of {} B: the real allocator created a {size} B segment at {addr:#x}; the simulator created {sim_new:?}", e.size),
                        });
                    }
                }
                if pending_segments.is_empty() && !sim_new.is_empty() {
                    r.note_divergence(Divergence {
                        event_index: index,
                        what: "segment_alloc".to_owned(),
                        expected: 0,
                        got: sim_new.first().copied().unwrap_or(0),
                        detail: format!("alloc of {} B at {:#x}: the simulator created a segment, the real allocator reused a cached block", e.size, e.addr),
                    });
                }
                pending_segments.clear();
                match result {
                    Ok(a) => {
                        if a.addr == e.addr {
                            r.address_exact_allocs += 1;
                        } else {
                            if repair.is_none() {
                                repair = find_repair(&sim, &inferred_live, e.addr);
                            }
                            r.note_divergence(Divergence {
                                event_index: index,
                                what: "address".to_owned(),
                                expected: e.addr,
                                got: a.addr,
                                detail: format!(
                                    "alloc of {} B (block {} B) placed at {:#x}, real {:#x}",
                                    e.size,
                                    a.size.get(),
                                    a.addr,
                                    e.addr
                                ),
                            });
                        }
                        if live.insert(e.addr, a.handle).is_some() {
                            unknown_frees += 1;
                        }
                    }
                    Err(oom) => {
                        r.note_divergence(Divergence {
                            event_index: index,
                            what: "oom".to_owned(),
                            expected: 0,
                            got: oom.segment_size.get(),
                            detail: format!(
                                "the simulator ran out of memory on an alloc of {} B",
                                e.size
                            ),
                        });
                    }
                }
            }
            Action::FreeCompleted => match live.remove(&e.addr) {
                Some(h) => {
                    inferred_live.remove(&e.addr);
                    let _ = sim.free(h);
                }
                None => unknown_frees += 1,
            },
            Action::Oom => real_ooms += 1,
            Action::FreeRequested | Action::Other => {}
        }
        real_peak = real_peak.max(real_reserved);
        sim_peak = sim_peak.max(sim.reserved().get());
        if !matches!(
            e.action,
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
        ) {
            r.compared_events += 1;
            let got = sim.reserved().get();
            if got == real_reserved {
                r.reserved_exact_events += 1;
            } else {
                r.note_divergence(Divergence {
                    event_index: index,
                    what: "reserved".to_owned(),
                    expected: real_reserved,
                    got,
                    detail: format!("after {:?} of {} B at {:#x}", e.action, e.size, e.addr),
                });
            }
        }
        prev_action = e.action;
    }
    r.real_peak_reserved_bytes = real_peak;
    r.simulated_peak_reserved_bytes = sim_peak;
    r.warnings = snap.warnings.clone();
    if start.inconsistencies > 0 {
        r.warnings.push(Warning::new(
            "start_state_inconsistent",
            format!("{} trace entries disagree with the final segments while rebuilding the start state", start.inconsistencies),
        ));
    }
    if unknown_frees > 0 {
        r.warnings.push(Warning::new(
            "free_of_unknown_block",
            format!("{unknown_frees} frees or allocs did not match the rebuilt block map"),
        ));
    }
    if real_ooms > 0 {
        r.warnings.push(Warning::new(
            "real_oom",
            format!("the recording contains {real_ooms} out-of-memory errors; the simulator is not told the device capacity"),
        ));
    }
    let final_real: Vec<(u64, u64)> = snap.segments.iter().map(|s| (s.addr, s.size)).collect();
    let final_sim: Vec<(u64, u64)> = sim.segments().iter().map(|s| (s.addr, s.size)).collect();
    r.final_segments_match = Some(final_real == final_sim);
    r.start_state_inferred_blocks = start.inferred.len() as u64;
    Ok(RunOutcome { report: r, repair })
}

/// replay-notes.md §3: a real alloc that lands a little inside a simulated
/// free block, right after a pre-trace block of inferred size, shows that the
/// inferred block had an unsplit remainder: grow it by the difference.
fn find_repair(
    sim: &CachingAllocator,
    inferred: &BTreeMap<u64, Inferred>,
    real: u64,
) -> Option<(u64, u64)> {
    for seg in sim.segments() {
        if real < seg.addr || real >= seg.addr + seg.size {
            continue;
        }
        let free = seg
            .blocks
            .iter()
            .find(|b| !b.allocated && b.addr < real && real < b.addr + b.size)?;
        let delta = real - free.addr;
        if delta > SMALL_SIZE {
            return None;
        }
        let (&addr, inf) = inferred.range(..free.addr).next_back()?;
        if addr + inf.size == free.addr {
            return Some((addr, delta));
        }
        return None;
    }
    None
}

/// Replays a snapshot pickle (already decompressed).
pub fn replay_snapshot(data: &[u8]) -> Result<ReplayReport, ReplayError> {
    let snap = read_snapshot(data)?;
    let mut repairs: BTreeMap<u64, u64> = BTreeMap::new();
    let mut outcome = run_once(&snap, &repairs)?;
    while let Some((addr, delta)) = outcome.repair {
        if repairs.len() >= MAX_REPAIRS || repairs.contains_key(&addr) {
            break;
        }
        repairs.insert(addr, delta);
        outcome = run_once(&snap, &repairs)?;
    }
    outcome.report.start_state_repairs = repairs.len() as u64;
    Ok(outcome.report)
}
