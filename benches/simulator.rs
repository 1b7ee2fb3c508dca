//! Simulator speed: one simulation of 10⁶ alloc/free events (target ≤ 150 ms
//! native, release). Run with `cargo bench --bench simulator`.
//!
//! Two synthetic workloads, both deterministic (a fixed LCG):
//! - `training`: a training loop whose per-layer sizes repeat every
//!   iteration (forward activations kept, temporaries freed at once, backward
//!   frees in reverse), the common steady state;
//! - `random`: sizes drawn fresh for every allocation with a random free
//!   order, so the cache holds many distinct block sizes.

#![allow(clippy::print_stdout)]

use std::time::Instant;

use memcast::simulator::{simulate, AllocatorConfig, GpuMemory, SimOp};
use memcast::Bytes;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn size(&mut self) -> u64 {
        let r = self.next() % 100;
        let x = self.next();
        match r {
            0..60 => 1 + x % (1 << 20),
            60..90 => (1 << 20) + x % (9 << 20),
            _ => (10 << 20) + x % (190 << 20),
        }
    }
}

/// CPU time of this thread in ns (Linux `schedstat`), so the figure does not
/// depend on how busy a shared machine is; `None` elsewhere.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

fn alloc(block: u64, size: u64) -> SimOp {
    SimOp::Alloc {
        block,
        size: Bytes(size),
        stream: 0,
    }
}

fn training(n_events: usize) -> Vec<SimOp> {
    let mut rng = Lcg(42);
    let layers: Vec<(u64, u64)> = (0..300).map(|_| (rng.size(), rng.size())).collect();
    let mut ops = Vec::with_capacity(n_events);
    let mut id = 0u64;
    while ops.len() < n_events {
        let mut kept = Vec::new();
        for &(act, tmp) in &layers {
            ops.push(alloc(id, act));
            kept.push(id);
            ops.push(alloc(id + 1, tmp));
            ops.push(SimOp::Free { block: id + 1 });
            id += 2;
        }
        for &(act, _) in layers.iter().rev() {
            let k = kept.pop().unwrap_or(0);
            ops.push(alloc(id, act));
            ops.push(SimOp::Free { block: k });
            ops.push(SimOp::Free { block: id });
            id += 1;
        }
    }
    ops.truncate(n_events);
    ops
}

fn random(n_events: usize) -> Vec<SimOp> {
    let mut rng = Lcg(7);
    let mut ops = Vec::with_capacity(n_events);
    let mut live: Vec<u64> = Vec::new();
    let mut id = 0u64;
    while ops.len() < n_events {
        if live.len() < 400 && (live.is_empty() || rng.next() % 2 == 0) {
            ops.push(alloc(id, rng.size()));
            live.push(id);
            id += 1;
        } else {
            let i = (rng.next() as usize) % live.len();
            let b = live.swap_remove(i);
            ops.push(SimOp::Free { block: b });
        }
    }
    ops
}

fn time(name: &str, ops: &[SimOp], config: &AllocatorConfig) {
    // `cargo bench --bench simulator -- training` runs only matching cases.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
        return;
    }
    let device = GpuMemory::unlimited();
    let mut runs = Vec::new();
    let mut cpu = Vec::new();
    let mut peak = 0;
    for _ in 0..7 {
        let (t, c) = (Instant::now(), thread_cpu_ns());
        let sim = simulate(ops, config, &device);
        runs.push(t.elapsed().as_secs_f64() * 1e3);
        cpu.push(thread_cpu_ns().zip(c).map(|(b, a)| (b - a) as f64 / 1e6));
        peak = sim.peak.reserved.get();
    }
    runs.sort_by(f64::total_cmp);
    let mut cpu: Vec<f64> = cpu.into_iter().flatten().collect();
    cpu.sort_by(f64::total_cmp);
    println!(
        "{name:<26} {} events: wall min {:>6.1} ms, median {:>6.1} ms; thread CPU min {:>6.1} ms, median {:>6.1} ms (peak reserved {} MiB)",
        ops.len(),
        runs[0],
        runs[runs.len() / 2],
        cpu.first().copied().unwrap_or(f64::NAN),
        cpu.get(cpu.len() / 2).copied().unwrap_or(f64::NAN),
        peak >> 20
    );
}

fn main() {
    let n = 1_000_000;
    let defaults = AllocatorConfig::pytorch_defaults();
    let expandable = AllocatorConfig::parse(
        "expandable_segments:True",
        memcast::simulator::RuleVersion::New,
    )
    .unwrap_or_else(|_| AllocatorConfig::pytorch_defaults());
    let ms = AllocatorConfig::parse(
        "max_split_size_mb:128,roundup_power2_divisions:4",
        memcast::simulator::RuleVersion::New,
    )
    .unwrap_or_else(|_| AllocatorConfig::pytorch_defaults());
    let t = training(n);
    let r = random(n);
    time("training / defaults", &t, &defaults);
    time("random / defaults", &r, &defaults);
    time("training / expandable", &t, &expandable);
    time("random / expandable", &r, &expandable);
    time("random / max_split+div4", &r, &ms);
}
