//! `memcast replay FILE [--json]`: replay real GPU allocator data through the
//! simulator and report how faithfully it reproduces the real allocator.

use std::path::PathBuf;

use anyhow::Context;
use memcast::replay::{replay, DeviceReplay, ReplayKind, ReplayReport};

/// Arguments of `memcast replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// A `torch.cuda.memory._dump_snapshot` pickle or a `torch.profiler`
    /// trace recorded on a GPU with `profile_memory=True` (`.gz` accepted).
    pub file: PathBuf,
    /// Print the report as JSON (schema `memcast.replay/1`).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    let data = std::fs::read(&args.file).with_context(|| format!("cannot read {:?}", args.file))?;
    let report = replay(&data).with_context(|| format!("cannot replay {:?}", args.file))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&report));
    }
    Ok(())
}

fn pct(n: u64, d: u64) -> String {
    if d == 0 {
        "-".to_owned()
    } else {
        format!("{:.3} %", n as f64 * 100.0 / d as f64)
    }
}

fn gib(b: u64) -> String {
    memcast::present::gib(memcast::Bytes(b))
}

fn kib(b: u64) -> String {
    format!("{:.1} KiB", b as f64 / 1024.0)
}

/// The replay report as text: the devices (when there are several), then the
/// largest device's start state, exact-match rates, peaks, segment decisions,
/// addresses, start-state repairs and first divergence.
fn text(r: &ReplayReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "kind: {:?}   allocator: {}", r.kind, r.allocator_conf);
    if r.devices.len() > 1 {
        let _ = writeln!(
            s,
            "devices: {}, each replayed on its own; the details below are device {}'s (largest real peak)",
            r.devices.len(),
            r.largest.device
        );
        let _ = writeln!(
            s,
            "  {:>6}  {:>9}  {:>21}  {:>21}  {:>12}  {:>12}",
            "device", "events", "exact events", "exact addresses", "peak real", "peak sim"
        );
        for d in &r.devices {
            let _ = writeln!(
                s,
                "  {:>6}  {:>9}  {:>21}  {:>21}  {:>12}  {:>12}",
                d.device,
                d.events,
                format!("{} ({})", d.exact_events, pct(d.exact_events, d.events)),
                format!(
                    "{} ({})",
                    d.address_exact_allocs,
                    pct(d.address_exact_allocs, d.allocs)
                ),
                gib(d.real_peak_reserved_bytes.get()),
                gib(d.simulated_peak_reserved_bytes.get()),
            );
        }
    }
    device_text(&mut s, r.kind, &r.largest);
    for w in &r.warnings {
        let _ = writeln!(s, "warning [{}]: {}", w.code, w.message);
    }
    s
}

/// The details of one device's replay.
fn device_text(s: &mut String, kind: ReplayKind, r: &DeviceReplay) {
    use std::fmt::Write;
    let _ = writeln!(
        s,
        "events: {}   start: {}",
        r.events,
        if r.start_complete {
            "empty allocator".to_owned()
        } else if kind == ReplayKind::Profiler {
            format!(
                "reserved {} at the first event (layout unknown; {})",
                gib(r.start_reserved_bytes.get()),
                match r.warmup_passes {
                    0 => "cache taken cold: the window starts the job".to_owned(),
                    1 => "cache warmed by replaying the window once".to_owned(),
                    2 => "cache warmed by replaying the window twice".to_owned(),
                    n => format!("cache warmed by replaying the window {n} times"),
                }
            )
        } else {
            format!(
                "reserved {} rebuilt, {} pre-trace block sizes inferred",
                gib(r.start_reserved_bytes.get()),
                r.start_state_inferred_blocks
            )
        },
    );
    let _ = writeln!(
        s,
        "exact events: {} / {} ({}), segment events included",
        r.exact_events,
        r.events,
        pct(r.exact_events, r.events)
    );
    let _ = writeln!(
        s,
        "reserved exact after: {} / {} compared events ({})",
        r.reserved_exact_events,
        r.compared_events,
        pct(r.reserved_exact_events, r.compared_events)
    );
    if let Some(a) = r.allocated_exact_events {
        let _ = writeln!(
            s,
            "allocated exact after: {} / {} events ({})",
            a,
            r.compared_events,
            pct(a, r.compared_events)
        );
    }
    let _ = writeln!(
        s,
        "peak reserved: real {} ({} B), simulated {} ({} B){}",
        gib(r.real_peak_reserved_bytes.get()),
        r.real_peak_reserved_bytes.get(),
        gib(r.simulated_peak_reserved_bytes.get()),
        r.simulated_peak_reserved_bytes.get(),
        if r.real_peak_reserved_bytes.get() == r.simulated_peak_reserved_bytes.get() {
            "  exact"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "segment events: real {}, simulated {}, matched {}{}",
        r.segment_events_real,
        r.segment_events_simulated,
        r.segment_events_matched,
        if r.segment_frees_forced > 0 {
            format!(", {} frees applied as recorded", r.segment_frees_forced)
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        s,
        "allocations at the real address: {} / {} ({})",
        r.address_exact_allocs,
        r.allocs,
        pct(r.address_exact_allocs, r.allocs)
    );
    if r.start_state_repairs > 0 {
        let _ = writeln!(
            s,
            "start-state repairs: {} pre-trace blocks grown by an unsplit remainder (a real allocation landed 1 MiB or less past the live block's inferred end; large-pool cached blocks are larger than 1 MiB, so the gap is the block's):",
            r.start_state_repairs
        );
        for e in &r.start_state_repair_evidence {
            let _ = writeln!(
                s,
                "  block at {:#x}, inferred {}, grown by {} ({}): entry {}, an alloc of {} at {:#x}",
                e.block_addr,
                e.inferred_bytes,
                e.grown_by_bytes,
                kib(e.grown_by_bytes.get()),
                e.event_index,
                e.alloc_request_bytes,
                e.alloc_addr
            );
        }
    }
    if let Some(m) = r.final_segments_match {
        let _ = writeln!(
            s,
            "final segments equal the snapshot's: {}",
            if m { "yes" } else { "no" }
        );
    }
    match &r.first_divergence {
        None => {
            let _ = writeln!(s, "first divergence: none");
        }
        Some(d) => {
            let _ = writeln!(
                s,
                "first divergence: event {} ({}): expected {}, got {}; {}",
                d.event_index, d.what, d.expected, d.got, d.detail
            );
        }
    }
}
