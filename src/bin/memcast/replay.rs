//! `memcast replay FILE [--json]`: replay real GPU allocator data through the
//! simulator and report how faithfully it reproduces the real allocator.

use std::path::PathBuf;

use anyhow::Context;
use memcast::replay::{replay, ReplayKind, ReplayReport};

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
    format!("{:.3} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The replay report as text: the start state, the exact-match rates, the
/// peaks, the segment decisions, addresses and the first divergence.
fn text(r: &ReplayReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "kind: {:?}   allocator: {}", r.kind, r.allocator_conf);
    let _ = writeln!(
        s,
        "events: {} ({} compared)   start: {}{}",
        r.events,
        r.compared_events,
        if r.start_complete {
            "empty allocator".to_owned()
        } else if r.kind == ReplayKind::Profiler {
            format!(
                "reserved {} at the first event (layout unknown; cache warmed by replaying the window twice)",
                gib(r.start_reserved_bytes.get())
            )
        } else {
            format!("reserved {} rebuilt", gib(r.start_reserved_bytes.get()))
        },
        if r.start_state_repairs > 0 {
            format!(", {} inferred blocks repaired", r.start_state_repairs)
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        s,
        "reserved exact after: {} / {} events ({})",
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
    for w in &r.warnings {
        let _ = writeln!(s, "warning [{}]: {}", w.code, w.message);
    }
    s
}
