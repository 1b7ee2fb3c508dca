//! What-if speed: a 50-point batch-size sweep (target ≤ 2 s native, release).
//! Run with `cargo bench --bench whatif` (fixtures from `../shared`, or the
//! folder named by `MEMCAST_SHARED`).
//!
//! - `t5-small` (the largest fixture, one trace: the single-trace model) at
//!   batch 1..=50, points only, then with the largest-batch search on one GPU;
//! - `resnet18` SGD at batch 16 and 32 (the fitted model) at batch 1..=50.
//!
//! Parsing and orchestration are timed apart: the sweep starts from prepared
//! traces, as the worker does.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Instant;

use memcast::whatif::batch::{self, BatchInput};
use memcast::{Config, Prepared};

fn shared() -> PathBuf {
    std::env::var_os("MEMCAST_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"))
}

fn prepare(name: &str, config: &Config) -> Prepared {
    let path = shared().join("fixtures/traces").join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let started = Instant::now();
    let prepared = memcast::prepare(&bytes, config, &mut |_| {}).unwrap();
    println!(
        "prepare {name}: {:.3} s ({} events)",
        started.elapsed().as_secs_f64(),
        prepared.orchestrated.schedule.events.len()
    );
    prepared
}

fn main() {
    let gpu = ["a100-80gb".to_owned()];
    let config = Config::for_gpus(&gpu[0], &gpu).unwrap();
    let mut points_only = config.clone();
    points_only.gpus.clear();
    let at: Vec<u32> = (1..=50).collect();

    let t5 = prepare("t5-small_adamw_bs8_pos1.json.gz", &config);
    let t5_batch = t5.batch_size.unwrap();
    let single = [BatchInput {
        batch: t5_batch,
        prepared: &t5,
    }];
    let started = Instant::now();
    let sweep = batch::sweep(&single, &at, &points_only).unwrap();
    let points = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let searched = batch::sweep(&single, &at, &config).unwrap();
    let with_search = started.elapsed().as_secs_f64();
    println!(
        "t5-small (batch {t5_batch}, single trace): 50-point sweep {points:.3} s; with the largest-batch search on a100-80gb {with_search:.3} s (max batch {})",
        searched.max_batch.first().map_or(0, |m| m.batch)
    );
    println!(
        "  peak at batch 1 / 50: {} / {} bytes",
        sweep.points.first().map_or(0, |p| p.peak_total_bytes.get()),
        sweep.points.last().map_or(0, |p| p.peak_total_bytes.get())
    );

    let bs16 = prepare("resnet18_sgd_bs16_pos1.json.gz", &config);
    let bs32 = prepare("resnet18_sgd_bs32_pos1.json.gz", &config);
    let fitted = [
        BatchInput {
            batch: 16,
            prepared: &bs16,
        },
        BatchInput {
            batch: 32,
            prepared: &bs32,
        },
    ];
    let started = Instant::now();
    let result = batch::sweep(&fitted, &at, &config).unwrap();
    println!(
        "resnet18 SGD (batch 16 + 32, fitted): 50-point sweep with the largest-batch search on a100-80gb {:.3} s (max batch {})",
        started.elapsed().as_secs_f64(),
        result.max_batch.first().map_or(0, |m| m.batch)
    );
}
