//! Replay of the `[memory]` events of a `torch.profiler` Chrome trace recorded
//! on a GPU with `profile_memory=True` (allocator.md §14).
//!
//! The trace starts mid-run and its allocator layout is unknown, so the replay
//! is anchored on the first event: blocks freed in the window but allocated
//! before it are allocated first (their sizes are known from the frees), then
//! every event is replayed, and simulated totals are compared with the real
//! `Total Allocated`/`Total Reserved` after offsetting both by their difference
//! at the first event. A new segment's base is taken from the real `Addr` of
//! the allocation at which `Total Reserved` grew.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{without_totals, DeviceReplay, Divergence, ReplayError, ReplayKind, ReplayReport};
use crate::diag::Warning;
use crate::simulator::{AllocatorConfig, BlockHandle, CachingAllocator, GpuMemory};
use crate::trace::{self, Trace};
use crate::units::Bytes;

/// One GPU `[memory]` event with both totals.
#[derive(Debug, Clone, Copy)]
struct MemEvent {
    device: i64,
    addr: u64,
    bytes: i64,
    total_allocated: u64,
    total_reserved: u64,
}

/// The GPU (CUDA or HIP) `[memory]` events of a trace that carry both
/// totals, in time order; the `Device Type` code of the last one; and how
/// many GPU events lacked a total (or had a negative total or address).
fn read_events(trace: &Trace) -> (Vec<MemEvent>, i64, usize) {
    let mut out = Vec::new();
    let mut without_totals = 0usize;
    let mut device_type = -1;
    for m in &trace.memory {
        let code = match m.device {
            trace::Device::Cuda => 1,
            trace::Device::Hip => 6,
            trace::Device::Cpu | trace::Device::Other(_) => continue,
        };
        let totals = m.total_allocated.zip(m.total_reserved);
        let totals = totals.and_then(|(ta, tr)| u64::try_from(ta).ok().zip(u64::try_from(tr).ok()));
        // The trace keeps an address's bit pattern; a negative `Addr` is not one.
        let (Some((total_allocated, total_reserved)), true) =
            (totals, i64::try_from(m.addr).is_ok())
        else {
            without_totals += 1;
            continue;
        };
        device_type = code;
        out.push(MemEvent {
            device: m.device_id.unwrap_or(0),
            addr: m.addr,
            bytes: m.bytes,
            total_allocated,
            total_reserved,
        });
    }
    (out, device_type, without_totals)
}

/// How many times the window is replayed before the compared pass, when the
/// cache is taken to start warm.
const WARMUP_PASSES: usize = 2;

enum Step {
    Placed(u64),
    UnknownFree,
    Done,
}

/// Applies one `[memory]` event to the simulator.
fn step(
    sim: &mut CachingAllocator,
    live: &mut HashMap<u64, BlockHandle>,
    carry: &mut BTreeMap<u64, Vec<BlockHandle>>,
    e: &MemEvent,
    segment_base: Option<u64>,
) -> Step {
    let size = e.bytes.unsigned_abs();
    if e.bytes > 0 {
        sim.set_next_segment_address(segment_base);
        // The device is unlimited, so the simulator cannot run out here.
        let placed = sim.malloc(Bytes(size), 0);
        sim.set_next_segment_address(None);
        let Ok(a) = placed else {
            return Step::Done;
        };
        if let Some(old) = live.insert(e.addr, a.handle) {
            let _ = sim.free(old);
        }
        Step::Placed(a.addr)
    } else if e.bytes < 0 {
        let handle = live
            .remove(&e.addr)
            .or_else(|| carry.get_mut(&size).and_then(Vec::pop));
        match handle {
            Some(h) => {
                let _ = sim.free(h);
                Step::Done
            }
            None => Step::UnknownFree,
        }
    } else {
        Step::Done
    }
}

/// Moves the blocks still live after a pass into `carry`, keyed by size.
fn carry_over(
    live: &mut HashMap<u64, BlockHandle>,
    carry: &mut BTreeMap<u64, Vec<BlockHandle>>,
    sim: &CachingAllocator,
) {
    let mut left: Vec<(u64, BlockHandle)> = live
        .drain()
        .filter_map(|(_, h)| Some((sim.block_size(h)?, h)))
        .collect();
    // HashMap order is arbitrary: sort so the simulation is deterministic.
    left.sort_unstable_by_key(|&(size, h)| (size, sim.block_addr(h)));
    for (size, h) in left {
        carry.entry(size).or_default().push(h);
    }
}

/// Replays the GPU `[memory]` events of a profiler trace read by
/// [`crate::trace`], each device on its own.
pub fn replay_profiler(trace: &Trace) -> Result<ReplayReport, ReplayError> {
    let (events, device_type, n_without_totals) = read_events(trace);
    // Already in time order (ties in file order): the trace sorts its events.
    let mut per_device: BTreeMap<i64, Vec<MemEvent>> = BTreeMap::new();
    for e in events {
        per_device.entry(e.device).or_default().push(e);
    }
    if per_device.is_empty() {
        return Err(ReplayError::NoMemoryEvents(without_totals(
            n_without_totals,
        )));
    }
    let several = per_device.len() > 1;
    let mut warnings = Vec::new();
    let mut devices = Vec::new();
    for (&device, events) in &per_device {
        let mut own = Vec::new();
        let mut cold_warnings = Vec::new();
        let warm = replay_device(device, events, WARMUP_PASSES, &mut own);
        let cold = replay_device(device, events, 0, &mut cold_warnings);
        // The segments the real allocator made are what the cache's start
        // decides; exact totals after them come next.
        let score = |r: &DeviceReplay| {
            (
                r.segment_events_matched,
                r.exact_events,
                r.allocated_exact_events,
            )
        };
        if score(&cold) > score(&warm) {
            devices.push(cold);
            own = cold_warnings;
        } else {
            devices.push(warm);
        }
        for mut w in own {
            if several {
                w.message = format!("device {device}: {}", w.message);
            }
            warnings.push(w);
        }
    }
    if n_without_totals > 0 {
        warnings.push(Warning::new(
            "events_without_totals",
            format!("{n_without_totals} GPU [memory] events lack Addr or totals and were skipped"),
        ));
    }
    let mut r = ReplayReport::from_devices(ReplayKind::Profiler, devices);
    r.allocator_conf = format!(
        "defaults (profiler traces do not record the allocator settings); device type {device_type}{}",
        if device_type == 6 { " (HIP)" } else { " (CUDA)" }
    );
    r.warnings = warnings;
    Ok(r)
}

/// Replays one device's events (in time order).
fn replay_device(
    device: i64,
    events: &[MemEvent],
    warmup_passes: usize,
    warnings: &mut Vec<Warning>,
) -> DeviceReplay {
    let mut r = DeviceReplay::new(device);
    r.warmup_passes = warmup_passes as u64;
    let config = AllocatorConfig::pytorch_defaults();
    r.events = events.len() as u64;
    r.compared_events = events.len() as u64;
    let mut sim = CachingAllocator::new(config, GpuMemory::unlimited());

    // Blocks freed in the window but allocated before it.
    let mut seen_alloc: BTreeSet<u64> = BTreeSet::new();
    let mut pre: Vec<(u64, u64)> = Vec::new();
    let mut pre_seen: BTreeSet<u64> = BTreeSet::new();
    for e in events {
        if e.bytes > 0 {
            seen_alloc.insert(e.addr);
        } else if e.bytes < 0 && !seen_alloc.contains(&e.addr) && pre_seen.insert(e.addr) {
            pre.push((e.addr, e.bytes.unsigned_abs()));
        }
    }
    let mut live: HashMap<u64, BlockHandle> = HashMap::new();
    for &(addr, size) in &pre {
        if let Ok(a) = sim.malloc(Bytes(size), 0) {
            live.insert(addr, a.handle);
        }
    }
    // Warm the cache (warm start): the window is a slice of a steady loop,
    // so replay it `warmup_passes` times before the compared pass. Blocks
    // still live at the end of a pass stand in for the next pass's
    // pre-window blocks (matched by size when those are freed).
    let mut carry: BTreeMap<u64, Vec<BlockHandle>> = BTreeMap::new();
    for _ in 0..warmup_passes {
        let mut prev_reserved = None;
        for e in events {
            if prev_reserved.is_some_and(|p| e.total_reserved < p) {
                sim.release_cached_blocks();
            }
            prev_reserved = Some(e.total_reserved);
            let _ = step(&mut sim, &mut live, &mut carry, e, None);
        }
        carry_over(&mut live, &mut carry, &sim);
    }
    r.start_reserved_bytes = Bytes(events.first().map_or(0, |e| e.total_reserved));
    sim.record_segment_changes(true);
    let _ = sim.take_segment_changes();

    let mut offsets: Option<(i128, i128)> = None;
    let mut allocated_exact = 0u64;
    let mut prev_real: Option<(u64, u64)> = None;
    let mut prev_sim_reserved = sim.reserved().get();
    let mut gaps = 0u64;
    let mut sim_peak: i128 = 0;
    let mut unknown_frees = 0u64;
    for (index, e) in events.iter().enumerate() {
        let index = index as u64;
        let real_grew = prev_real.is_some_and(|(_, rr)| e.total_reserved > rr);
        // Frees never lower reserved: a drop means the cache was flushed
        // (empty_cache, which logs no event) before this event.
        if prev_real.is_some_and(|(_, rr)| e.total_reserved < rr) {
            sim.release_cached_blocks();
        }
        let gap = prev_real.is_some_and(|(ra, _)| {
            i128::from(e.total_allocated) - i128::from(ra) != i128::from(e.bytes)
        });
        if gap {
            gaps += 1;
        }
        if e.bytes > 0 {
            r.allocs += 1;
        }
        match step(
            &mut sim,
            &mut live,
            &mut carry,
            e,
            real_grew.then_some(e.addr),
        ) {
            Step::Placed(addr) if addr == e.addr => r.address_exact_allocs += 1,
            Step::UnknownFree => unknown_frees += 1,
            Step::Placed(_) | Step::Done => {}
        }
        let changes = sim.take_segment_changes();
        r.segment_events_simulated += changes.len() as u64;
        let (sa, sr) = (
            i128::from(sim.allocated().get()),
            i128::from(sim.reserved().get()),
        );
        let (ra, rr) = (i128::from(e.total_allocated), i128::from(e.total_reserved));
        let (oa, or) = *offsets.get_or_insert((ra - sa, rr - sr));
        if gap {
            // The profiler dropped events here: re-anchor allocated; this
            // event does not count as exact.
            offsets = Some((ra - sa, or));
        } else if sa + oa == ra {
            allocated_exact += 1;
        } else {
            r.note_divergence(Divergence {
                event_index: index,
                what: "allocated".to_owned(),
                expected: e.total_allocated,
                got: u64::try_from(sa + oa).unwrap_or(0),
                detail: format!("after {} B at {:#x}", e.bytes, e.addr),
            });
        }
        if sr + or == rr {
            r.reserved_exact_events += 1;
        } else {
            r.note_divergence(Divergence {
                event_index: index,
                what: "reserved".to_owned(),
                expected: e.total_reserved,
                got: u64::try_from(sr + or).unwrap_or(0),
                detail: format!("after {} B at {:#x}", e.bytes, e.addr),
            });
        }
        if let Some((_, prr)) = prev_real {
            let real_delta = i128::from(e.total_reserved) - i128::from(prr);
            let sim_delta = sr - i128::from(prev_sim_reserved);
            if real_delta != 0 {
                r.segment_events_real += 1;
                if real_delta == sim_delta {
                    r.segment_events_matched += 1;
                }
            }
        }
        r.real_peak_reserved_bytes = r.real_peak_reserved_bytes.max(Bytes(e.total_reserved));
        sim_peak = sim_peak.max(sr + or);
        prev_real = Some((e.total_allocated, e.total_reserved));
        prev_sim_reserved = sim.reserved().get();
    }
    r.simulated_peak_reserved_bytes = Bytes(u64::try_from(sim_peak).unwrap_or(0));
    r.allocated_exact_events = Some(allocated_exact);
    r.exact_events = r.reserved_exact_events;
    if !pre.is_empty() {
        warnings.push(Warning::new(
            "pre_window_blocks",
            format!("{} blocks were allocated before the window and freed in it; they were allocated first, on a cold allocator", pre.len()),
        ));
    }
    if gaps > 0 {
        warnings.push(Warning::new(
            "event_gaps",
            format!("{gaps} events change Total Allocated by more than their own Bytes: the profiler dropped events there"),
        ));
    }
    if unknown_frees > 0 {
        warnings.push(Warning::new(
            "free_of_unknown_block",
            format!("{unknown_frees} frees name an address that is not live"),
        ));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: i64 = 1 << 20;

    /// A profiler trace of CUDA `[memory]` events: (bytes, addr, total
    /// allocated, total reserved), one microsecond apart.
    fn trace(events: &[(i64, u64, i64, i64)]) -> Vec<u8> {
        let events: Vec<String> = events
            .iter()
            .enumerate()
            .map(|(i, (bytes, addr, allocated, reserved))| {
                format!(
                    r#"{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": {}, "args": {{"Total Reserved": {reserved}, "Total Allocated": {allocated}, "Bytes": {bytes}, "Addr": {addr}, "Device Type": 1, "Device Id": 0}}}}"#,
                    1000 + i
                )
            })
            .collect();
        format!(r#"{{"traceEvents": [{}]}}"#, events.join(",")).into_bytes()
    }

    fn replay_of(events: &[(i64, u64, i64, i64)]) -> DeviceReplay {
        let data = trace(events);
        let parsed = crate::trace::parse(&data).map(|t| t.value);
        let report = parsed
            .ok()
            .and_then(|t| replay_profiler(&t).ok())
            .map(|r| r.largest);
        report.unwrap_or_else(|| DeviceReplay::new(-1))
    }

    /// A recording of a job's first steps: every segment it shows being
    /// made is made again only if the cache starts cold (warmed by the
    /// window, it already holds them and the simulated peak falls below
    /// the real one).
    #[test]
    fn a_window_that_makes_segments_is_replayed_from_a_cold_cache() {
        let r = replay_of(&[
            (20 * MIB, 0x1000_0000, 20 * MIB, 20 * MIB),
            (-20 * MIB, 0x1000_0000, 0, 20 * MIB),
            (40 * MIB, 0x2000_0000, 40 * MIB, 60 * MIB),
            (-40 * MIB, 0x2000_0000, 0, 60 * MIB),
        ]);
        assert_eq!(r.device, 0);
        assert_eq!(r.warmup_passes, 0);
        assert_eq!(r.real_peak_reserved_bytes, Bytes(60 << 20));
        assert_eq!(r.simulated_peak_reserved_bytes, Bytes(60 << 20));
        assert_eq!((r.segment_events_real, r.segment_events_matched), (1, 1));
        assert_eq!(r.exact_events, 4);
    }

    /// A window cut from a steady loop (it frees what an earlier iteration
    /// made and makes no segment) keeps the warmed cache: the cold start
    /// explains it no better.
    #[test]
    fn a_steady_window_keeps_the_warm_cache() {
        let r = replay_of(&[
            (-20 * MIB, 0x1000_0000, 0, 20 * MIB),
            (20 * MIB, 0x1000_0000, 20 * MIB, 20 * MIB),
            (-20 * MIB, 0x1000_0000, 0, 20 * MIB),
        ]);
        assert_eq!(r.warmup_passes, WARMUP_PASSES as u64);
        assert_eq!(r.exact_events, 3);
        assert_eq!(r.simulated_peak_reserved_bytes, Bytes(20 << 20));
    }
}
