//! Replay of a `torch.cuda.memory._dump_snapshot` pickle (allocator.md §13,
//! replay-notes.md §1): read the final `segments` and the device trace,
//! rebuild the allocator state at the start of the recording by walking the
//! trace backwards, load it into the simulator and replay forwards, comparing
//! every decision with the real allocator's.
//!
//! Long file: the snapshot replay is one pipeline (read, rebuild backwards,
//! replay forwards, repair and rerun) over types private to it, and more than
//! a third of the file is its tests; its long functions say what each step does.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::pickle::{self, Pickle, ValueId};
use super::{Divergence, ReplayError, ReplayKind, ReplayReport};
use crate::diag::Warning;
use crate::simulator::{
    AllocatorConfig, BlockHandle, CachingAllocator, GpuMemory, PoolKind, RuleVersion,
    SegmentChange, SegmentLayout, DIVISION_INTERVALS, LARGE_BUFFER, SMALL_BUFFER, SMALL_SIZE,
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

/// Reads what the replay needs from a `_dump_snapshot` pickle: the final
/// `segments` with their blocks, the device trace of the busiest device
/// (entries with action, address, size and stream, streams renumbered
/// densely), and the allocator settings in force. Long because it checks
/// every field of a format that is an input, not a contract: a missing or
/// mistyped field is a `SnapshotField` error or a warning, never a panic.
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
            events.push(Event {
                action,
                addr: num("addr"),
                size: num("size"),
                stream: streams.id(stream_raw),
            });
        }
    }
    // A recording without any `free_completed` (an older or trimmed format)
    // frees blocks at `free_requested`.
    let has_completed = events.iter().any(|e| e.action == Action::FreeCompleted);
    let has_requested = events.iter().any(|e| e.action == Action::FreeRequested);
    if has_requested && !has_completed {
        for e in &mut events {
            if e.action == Action::FreeRequested {
                e.action = Action::FreeCompleted;
            }
        }
        warnings.push(Warning::new(
            "frees_at_request",
            "the recording has no free_completed entries, so blocks are freed at free_requested",
        ));
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

/// Rebuilds the allocator state at the start of the recording by walking the
/// trace backwards from the final `segments` (replay-notes §2): an `alloc`
/// seen backwards frees its block, a `free_completed` makes it occupied
/// again, segment events remove or add whole segments. Blocks occupied
/// before the recording whose size the trace never shows are inferred from
/// the gaps they leave (`repairs` corrects those that later addresses
/// contradict, §3). Returns the segments as layouts to load into the
/// simulator, the addresses of their occupied blocks, and how complete and
/// consistent the rebuilt state is. One function because the backward walk
/// and the inference share the same occupied/segment maps.
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
            Action::SegmentMap => {
                // Before the mapping, [addr, addr + size) was unmapped.
                let found = segs
                    .range(..=e.addr)
                    .next_back()
                    .map(|(&a, &g)| (a, g))
                    .filter(|&(a, g)| g.expandable && e.addr + e.size <= a + g.size);
                let Some((start, seg)) = found else {
                    inconsistencies += 1;
                    continue;
                };
                segs.remove(&start);
                if e.addr > start {
                    segs.insert(
                        start,
                        Seg {
                            size: e.addr - start,
                            ..seg
                        },
                    );
                }
                let end = start + seg.size;
                if end > e.addr + e.size {
                    segs.insert(
                        e.addr + e.size,
                        Seg {
                            size: end - e.addr - e.size,
                            ..seg
                        },
                    );
                }
            }
            Action::SegmentUnmap => {
                // Before the unmapping, the range was mapped: merge it with
                // mapped neighbours of the same expandable segment.
                let mut start = e.addr;
                let mut size = e.size;
                let mut like: Option<Seg> = None;
                if let Some((&a, &g)) = segs.range(..e.addr).next_back() {
                    if g.expandable && g.stream == e.stream && a + g.size == e.addr {
                        segs.remove(&a);
                        start = a;
                        size += g.size;
                        like = Some(g);
                    }
                }
                if let Some(&g) = segs.get(&(e.addr + e.size)) {
                    if g.expandable && g.stream == e.stream {
                        segs.remove(&(e.addr + e.size));
                        size += g.size;
                        like = like.or(Some(g));
                    }
                }
                let pool = like.map_or(
                    if e.size % LARGE_BUFFER == 0 {
                        PoolKind::Large
                    } else {
                        PoolKind::Small
                    },
                    |g| g.pool,
                );
                segs.insert(
                    start,
                    Seg {
                        size,
                        stream: e.stream,
                        pool,
                        expandable: true,
                    },
                );
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
        reserved = reserved.saturating_add(seg.size);
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
                    // An oversize block (≥ max_split_size) is never split: it
                    // is its whole segment, up to the oversize tolerance.
                    let oversize = snap.config.max_split_size.is_some_and(|m| s >= m.get());
                    if oversize
                        && !seg.expandable
                        && gap > SMALL_SIZE
                        && gap < snap.config.max_non_split_rounding.get()
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

/// One forward replay of the snapshot's trace from the rebuilt start state:
/// loads the start state into a fresh simulator (expandable ranges grouped
/// per pool and stream), then applies every trace entry, comparing after
/// each one reserved memory, the segment decisions (a real `segment_alloc`
/// the simulator must also make, at the same size) and the address of every
/// allocation. Real cache flushes (a burst of `segment_free` equal to what
/// flushing would free) are replayed as flushes; other real frees are forced
/// and counted. Returns the report, and the first inferred start block that
/// a later address contradicts (`repair`), for [`replay_snapshot`] to rerun
/// with it corrected. Long because it is one state machine over the trace
/// whose counters all feed one report; its steps are commented in order.
fn run_once(snap: &Snapshot, repairs: &BTreeMap<u64, u64>) -> Result<RunOutcome, ReplayError> {
    let start = rebuild_start(snap, repairs)?;
    let mut sim = CachingAllocator::new(snap.config.clone(), GpuMemory::unlimited());
    let mut live: HashMap<u64, BlockHandle> = HashMap::new();
    // Expandable mapped ranges of one pool and stream share a virtual range
    // (one expandable segment per pool and stream, allocator.md §9.1).
    let mut groups: BTreeMap<(u32, u8), (Vec<SegmentLayout>, Vec<u64>)> = BTreeMap::new();
    for (layout, addrs) in start.layouts.iter().zip(&start.occupied_addrs) {
        if layout.expandable {
            let pool = u8::from(layout.pool == PoolKind::Large);
            let g = groups.entry((layout.stream, pool)).or_default();
            g.0.push(layout.clone());
            g.1.extend(addrs);
            continue;
        }
        let handles = sim
            .load_segment(layout)
            .map_err(|e| ReplayError::StartState(e.to_string()))?;
        for (a, &addr) in handles.iter().zip(addrs) {
            live.insert(addr, a.handle);
        }
    }
    for ((stream, _), (ranges, addrs)) in &groups {
        let Some(first) = ranges.first() else {
            continue;
        };
        let handles = sim
            .load_expandable(first.addr, first.pool, *stream, ranges)
            .map_err(|e| ReplayError::StartState(e.to_string()))?;
        for (a, &addr) in handles.iter().zip(addrs) {
            live.insert(addr, a.handle);
        }
    }
    sim.record_segment_changes(true);
    let mut inferred_live = start.inferred.clone();

    let mut r = ReplayReport::new(ReplayKind::Snapshot);
    r.allocator_conf = snap.conf_note.clone();
    r.start_reserved_bytes = Bytes(start.reserved);
    r.start_complete = start.complete;
    r.events = snap.events.len() as u64;
    let mut real_reserved = start.reserved;
    let mut real_peak = real_reserved;
    let mut sim_peak = sim.reserved().get();
    let mut pending_segments: Vec<(u64, u64)> = Vec::new();
    let mut burst_frees: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut prev_action = Action::Other;
    let mut forcing_burst = false;
    let mut pending_maps: Vec<(u64, u64)> = Vec::new();
    let mut unknown_frees = 0u64;
    let mut real_ooms = 0u64;
    let mut repair = None;

    for (index, e) in snap.events.iter().enumerate() {
        let index = index as u64;
        match e.action {
            Action::SegmentAlloc => {
                real_reserved = real_reserved.saturating_add(e.size);
                r.segment_events_real += 1;
                pending_segments.push((e.addr, e.size));
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                real_reserved = real_reserved.saturating_sub(e.size);
                r.segment_events_real += 1;
                let releasing = |a: Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap);
                if !releasing(prev_action) {
                    // A burst of cudaFree. If it is exactly what flushing the
                    // cache would free, the real allocator ran
                    // release_cached_blocks (empty_cache or the last-resort OOM
                    // retry), whose timing is an input: flush the simulator too.
                    // Otherwise (garbage collection, max_split release, a flush
                    // the simulator's state disagrees with) apply the recorded
                    // frees one by one and count them as forced.
                    let burst_events: Vec<&Event> = snap
                        .events
                        .get(index as usize..)
                        .unwrap_or_default()
                        .iter()
                        .take_while(|b| releasing(b.action))
                        .collect();
                    let unmaps = burst_events
                        .iter()
                        .any(|b| b.action == Action::SegmentUnmap);
                    let mut burst: Vec<(u64, u64)> =
                        burst_events.iter().map(|b| (b.addr, b.size)).collect();
                    burst.sort_unstable();
                    // Unmapping only happens in release_cached_blocks.
                    forcing_burst = !unmaps && burst != sim.releasable_segments();
                    if !forcing_burst {
                        sim.release_cached_blocks();
                        for c in sim.take_segment_changes() {
                            r.segment_events_simulated += 1;
                            match c {
                                SegmentChange::Free { addr, size }
                                | SegmentChange::Unmap { addr, size } => {
                                    burst_frees.insert((addr, size));
                                }
                                _ => {}
                            }
                        }
                    }
                }
                if forcing_burst {
                    if sim.release_segment_at(e.addr) {
                        r.segment_frees_forced += 1;
                        let _ = sim.take_segment_changes();
                    } else {
                        r.note_divergence(Divergence {
                            event_index: index,
                            what: "segment_free".to_owned(),
                            expected: e.size,
                            got: 0,
                            detail: format!("the real allocator freed the segment at {:#x}, which is not a whole cached segment in the simulator", e.addr),
                        });
                    }
                } else if burst_frees.remove(&(e.addr, e.size)) {
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
            Action::SegmentMap => {
                real_reserved = real_reserved.saturating_add(e.size);
                r.segment_events_real += 1;
                pending_maps.push((e.addr, e.size));
            }
            Action::Alloc => {
                r.allocs += 1;
                let real_new = pending_segments.first().copied();
                let seed = real_new.or(pending_maps.first().copied());
                sim.set_next_segment_address(seed.map(|(a, _)| a));
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
                let mut sim_maps: BTreeSet<(u64, u64)> = changes
                    .iter()
                    .filter_map(|c| match c {
                        SegmentChange::Map { addr, size } => Some((*addr, *size)),
                        _ => None,
                    })
                    .collect();
                for &(addr, size) in &pending_maps {
                    if sim_maps.remove(&(addr, size)) {
                        r.segment_events_matched += 1;
                    } else {
                        r.note_divergence(Divergence {
                            event_index: index,
                            what: "segment_map".to_owned(),
                            expected: size,
                            got: 0,
                            detail: format!("alloc of {} B: the real allocator mapped {size} B at {addr:#x}; the simulator did not", e.size),
                        });
                    }
                }
                if let Some(&(addr, size)) = sim_maps.iter().next() {
                    r.note_divergence(Divergence {
                        event_index: index,
                        what: "segment_map".to_owned(),
                        expected: 0,
                        got: size,
                        detail: format!("alloc of {} B: the simulator mapped {size} B at {addr:#x}; the real allocator did not", e.size),
                    });
                }
                pending_maps.clear();
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
    r.real_peak_reserved_bytes = Bytes(real_peak);
    r.simulated_peak_reserved_bytes = Bytes(sim_peak);
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

#[cfg(test)]
mod tests {
    //! Synthetic snapshots written with a tiny pickle writer: a complete
    //! recording is cut at every possible start, so the backward rebuild has
    //! to recover the state the cut removed.

    use super::*;

    enum Pv {
        Int(i64),
        Str(&'static str),
        Bool(bool),
        List(Vec<Pv>),
        Dict(Vec<(&'static str, Pv)>),
    }

    fn write(v: &Pv, out: &mut Vec<u8>) {
        match v {
            Pv::Int(i) => {
                out.extend([0x8a, 8]);
                out.extend(i.to_le_bytes());
            }
            Pv::Str(s) => {
                out.push(b'X');
                out.extend((s.len() as u32).to_le_bytes());
                out.extend(s.as_bytes());
            }
            Pv::Bool(b) => out.push(if *b { 0x88 } else { 0x89 }),
            Pv::List(items) => {
                out.extend([b']', b'(']);
                for i in items {
                    write(i, out);
                }
                out.push(b'e');
            }
            Pv::Dict(items) => {
                out.extend([b'}', b'(']);
                for (k, v) in items {
                    write(&Pv::Str(k), out);
                    write(v, out);
                }
                out.push(b'u');
            }
        }
    }

    fn event(action: &'static str, addr: u64, size: u64) -> Pv {
        Pv::Dict(vec![
            ("action", Pv::Str(action)),
            ("addr", Pv::Int(addr as i64)),
            ("size", Pv::Int(size as i64)),
            ("stream", Pv::Int(0)),
        ])
    }

    /// `(address, size, expandable, pool, blocks: (address, size, active))`.
    type Seg = (u64, u64, bool, &'static str, Vec<(u64, u64, bool)>);

    fn snapshot(
        events: &[(&'static str, u64, u64)],
        segments: &[Seg],
        conf: &'static str,
    ) -> Vec<u8> {
        snapshot_with(events, segments, conf, -1)
    }

    /// A snapshot pickle with these trace entries, segments, allocator
    /// settings and `max_split_size` (-1: unset), as `_dump_snapshot` writes it.
    fn snapshot_with(
        events: &[(&'static str, u64, u64)],
        segments: &[Seg],
        conf: &'static str,
        max_split: i64,
    ) -> Vec<u8> {
        let segs = segments
            .iter()
            .map(|(addr, size, exp, pool, blocks)| {
                Pv::Dict(vec![
                    ("device", Pv::Int(0)),
                    ("address", Pv::Int(*addr as i64)),
                    ("total_size", Pv::Int(*size as i64)),
                    ("stream", Pv::Int(0)),
                    ("segment_type", Pv::Str(pool)),
                    ("is_expandable", Pv::Bool(*exp)),
                    (
                        "blocks",
                        Pv::List(
                            blocks
                                .iter()
                                .map(|(a, s, active)| {
                                    Pv::Dict(vec![
                                        ("address", Pv::Int(*a as i64)),
                                        ("size", Pv::Int(*s as i64)),
                                        ("requested_size", Pv::Int(*s as i64)),
                                        (
                                            "state",
                                            Pv::Str(if *active {
                                                "active_allocated"
                                            } else {
                                                "inactive"
                                            }),
                                        ),
                                    ])
                                })
                                .collect(),
                        ),
                    ),
                ])
            })
            .collect();
        let trace = events
            .iter()
            .map(|&(a, addr, size)| event(a, addr, size))
            .collect();
        let root = Pv::Dict(vec![
            ("segments", Pv::List(segs)),
            ("device_traces", Pv::List(vec![Pv::List(trace)])),
            (
                "allocator_settings",
                Pv::Dict(vec![
                    ("PYTORCH_CUDA_ALLOC_CONF", Pv::Str(conf)),
                    ("expandable_segments", Pv::Bool(conf.contains("expandable"))),
                    ("max_split_size", Pv::Int(max_split)),
                ]),
            ),
        ]);
        let mut out = vec![0x80, 2];
        write(&root, &mut out);
        out.push(b'.');
        out
    }

    const MIB: u64 = Bytes::MIB;

    fn check_every_start(
        events: &[(&'static str, u64, u64)],
        segments: &[Seg],
        conf: &'static str,
    ) {
        for cut in 0..events.len() {
            let data = snapshot(&events[cut..], segments, conf);
            let r = replay_snapshot(&data).unwrap();
            assert!(
                r.is_exact() && r.final_segments_match == Some(true),
                "start at event {cut}: {r:#?}"
            );
            if cut == 0 {
                assert!(r.start_complete);
            }
        }
    }

    #[test]
    fn expandable_growth_unmap_and_new_range_replay_exactly() {
        let (a, b) = (0x7000_0000_0000u64, 0x7100_0000_0000u64);
        let events = [
            ("segment_map", a, 20 * MIB),
            ("alloc", a, 5 * MIB),
            ("alloc", a + 5 * MIB, 10 * MIB),
            ("segment_map", a + 20 * MIB, 20 * MIB),
            ("alloc", a + 15 * MIB, 10 * MIB),
            ("free_requested", a, 5 * MIB),
            ("free_completed", a, 5 * MIB),
            ("free_requested", a + 5 * MIB, 10 * MIB),
            ("free_completed", a + 5 * MIB, 10 * MIB),
            ("alloc", a, 4 * MIB),
            ("free_requested", a + 15 * MIB, 10 * MIB),
            ("free_completed", a + 15 * MIB, 10 * MIB),
            ("free_requested", a, 4 * MIB),
            ("free_completed", a, 4 * MIB),
            ("segment_unmap", a, 40 * MIB),
            ("segment_map", b, 40 * MIB),
            ("alloc", b, 30 * MIB),
        ];
        let segments: Vec<Seg> = vec![(
            b,
            40 * MIB,
            true,
            "large",
            vec![(b, 30 * MIB, true), (b + 30 * MIB, 10 * MIB, false)],
        )];
        check_every_start(&events, &segments, "expandable_segments:True");
    }

    #[test]
    fn segment_allocs_and_an_empty_cache_burst_replay_exactly() {
        let (s1, s2, s3, s4) = (
            0x7f00_0000_0000u64,
            0x7f00_4000_0000u64,
            0x7f00_8000_0000u64,
            0x7f00_c000_0000u64,
        );
        let events = [
            ("segment_alloc", s1, 20 * MIB),
            ("alloc", s1, 5 * MIB),
            ("alloc", s1 + 5 * MIB, 12 * MIB),
            ("segment_alloc", s2, 2 * MIB),
            ("alloc", s2, 1000),
            ("segment_alloc", s3, 100 * MIB),
            ("alloc", s3, 100 * MIB),
            ("free_requested", s3, 100 * MIB),
            ("free_completed", s3, 100 * MIB),
            ("free_requested", s2, 1000),
            ("free_completed", s2, 1000),
            ("segment_free", s2, 2 * MIB),
            ("segment_free", s3, 100 * MIB),
            ("segment_alloc", s4, 50 * MIB),
            ("alloc", s4, 50 * MIB),
            ("alloc", s1 + 17 * MIB, 3 * MIB),
        ];
        let segments: Vec<Seg> = vec![
            (
                s1,
                20 * MIB,
                false,
                "large",
                vec![
                    (s1, 5 * MIB, true),
                    (s1 + 5 * MIB, 12 * MIB, true),
                    (s1 + 17 * MIB, 3 * MIB, true),
                ],
            ),
            (s4, 50 * MIB, false, "large", vec![(s4, 50 * MIB, true)]),
        ];
        check_every_start(&events, &segments, "");
    }

    #[test]
    fn a_partial_release_is_forced_and_reported() {
        // Two cached segments but only one is freed: not a cache flush (a GC
        // or an oversize release), so the free is applied as recorded.
        let (s1, s2) = (0x7f00_0000_0000u64, 0x7f00_4000_0000u64);
        let events = [
            ("segment_alloc", s1, 40 * MIB),
            ("alloc", s1, 40 * MIB),
            ("segment_alloc", s2, 60 * MIB),
            ("alloc", s2, 60 * MIB),
            ("free_completed", s1, 40 * MIB),
            ("free_completed", s2, 60 * MIB),
            ("segment_free", s1, 40 * MIB),
            ("alloc", s2, 50 * MIB),
        ];
        let segments: Vec<Seg> = vec![(
            s2,
            60 * MIB,
            false,
            "large",
            vec![(s2, 50 * MIB, true), (s2 + 50 * MIB, 10 * MIB, false)],
        )];
        let r = replay_snapshot(&snapshot(&events, &segments, "")).unwrap();
        assert_eq!(r.segment_frees_forced, 1);
        assert_eq!(r.segment_events_matched, 2);
        assert_eq!(r.reserved_exact_events, r.compared_events);
        assert_eq!(r.address_exact_allocs, r.allocs);
    }

    #[test]
    fn pre_trace_oversize_block_is_its_whole_segment() {
        // max_split_size 100 MiB: a 140 MiB request reused a cached 150 MiB
        // segment before the recording (150 < 140 + 20), unsplit. While it is
        // live, a 10 MiB request needs its own segment: the 10 MiB tail is
        // part of the oversize block, not free space.
        let (s1, s2) = (0x7f00_0000_0000u64, 0x7f00_4000_0000u64);
        let events = [
            ("segment_alloc", s2, 10 * MIB),
            ("alloc", s2, 10 * MIB),
            ("free_completed", s1, 140 * MIB),
            ("alloc", s1, 145 * MIB),
        ];
        let segments: Vec<Seg> = vec![
            (s1, 150 * MIB, false, "large", vec![(s1, 150 * MIB, true)]),
            (s2, 10 * MIB, false, "large", vec![(s2, 10 * MIB, true)]),
        ];
        let data = snapshot_with(
            &events,
            &segments,
            "max_split_size_mb:100",
            (100 * MIB) as i64,
        );
        let r = replay_snapshot(&data).unwrap();
        assert!(r.is_exact(), "{r:#?}");
        assert!(r.allocator_conf.contains("max_split_size_mb:100"));
    }

    #[test]
    fn recordings_without_free_completed_free_at_request() {
        let s1 = 0x7f00_0000_0000u64;
        let events = [
            ("segment_alloc", s1, 20 * MIB),
            ("alloc", s1, 5 * MIB),
            ("free_requested", s1, 5 * MIB),
            ("alloc", s1, 5 * MIB),
        ];
        let segments: Vec<Seg> = vec![(
            s1,
            20 * MIB,
            false,
            "large",
            vec![(s1, 5 * MIB, true), (s1 + 5 * MIB, 15 * MIB, false)],
        )];
        let r = replay_snapshot(&snapshot(&events, &segments, "")).unwrap();
        assert!(r.is_exact(), "{r:#?}");
        assert!(r.warnings.iter().any(|w| w.code == "frees_at_request"));
    }
}
