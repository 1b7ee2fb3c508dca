//! Pipeline throughput, stage by stage, in MB/s of raw (uncompressed) JSON.
//!
//! `cargo bench --bench pipeline [-- TRACE...]`: by default the largest fixture
//! in `../shared/fixtures/traces`. The file is read into memory before timing.
//! Each pass times, with `std::time::Instant`:
//! - `gunzip+serde`: decompression plus a bare `serde_json` parse that keeps
//!   nothing (`IgnoredAny`), the floor of any Rust reader of this file;
//! - `parse`: `trace::parse` (gunzip included);
//! - `analyze`, `orchestrate`: the two stages on the parsed trace;
//! - `simulate`: `memcast::estimate` (every GPU preset's simulations and the
//!   report), as the CLI runs it;
//! - `end-to-end`: `memcast::run` on the bytes, all of the above at once.
//!
//! The best of `MEMCAST_BENCH_PASSES` passes (default 3) is reported. The last
//! line per file, `RESULT name raw_bytes seconds...`, is what
//! `benches/run.sh` reads.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memcast::{analyzer, orchestrator, trace, Config};

const STAGES: [&str; 7] = [
    "gunzip+serde",
    "parse",
    "analyze",
    "orchestrate",
    "simulate",
    "prepare",
    "end-to-end",
];

fn main() {
    let files: Vec<PathBuf> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .collect();
    let files = if files.is_empty() {
        vec![largest_fixture()]
    } else {
        files
    };
    let passes: usize = std::env::var("MEMCAST_BENCH_PASSES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    for file in files {
        bench(&file, passes.max(1));
    }
}

fn bench(file: &Path, passes: usize) {
    let bytes = std::fs::read(file).expect("read trace");
    let raw_len = raw_len(&bytes);
    let config = Config::standard();
    let mut best = [Duration::MAX; STAGES.len()];
    for _ in 0..passes {
        let mut times = [Duration::ZERO; STAGES.len()];

        let t = Instant::now();
        floor(&bytes);
        times[0] = t.elapsed();

        let t = Instant::now();
        let parsed = trace::parse(&bytes).expect("parse").value;
        times[1] = t.elapsed();

        let t = Instant::now();
        let analysis = analyzer::analyze(&parsed, &config.analyzer)
            .expect("analyze")
            .value;
        times[2] = t.elapsed();
        drop(parsed);

        let t = Instant::now();
        let orchestrated =
            orchestrator::orchestrate(&analysis, &config.orchestrator).expect("orchestrate");
        times[3] = t.elapsed();
        drop((analysis, orchestrated));

        let t = Instant::now();
        let prepared = memcast::prepare(&bytes, &config, &mut |_| {}).expect("prepare");
        times[5] = t.elapsed();

        let t = Instant::now();
        let report = memcast::estimate(&prepared, &config, &mut |_| {}).expect("estimate");
        times[4] = t.elapsed();
        drop((prepared, report));

        let t = Instant::now();
        let report = memcast::run(&bytes, &config, &mut |_| {}).expect("run");
        times[6] = t.elapsed();
        std::hint::black_box(&report);

        for (b, t) in best.iter_mut().zip(times) {
            *b = (*b).min(t);
        }
    }
    let name = file
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mb = raw_len as f64 / 1e6;
    println!(
        "{name}: {mb:.1} MB raw JSON ({} bytes on disk), best of {passes}",
        bytes.len()
    );
    for (stage, t) in STAGES.iter().zip(best) {
        let s = t.as_secs_f64();
        println!("  {stage:<13} {:>9.3} s {:>9.1} MB/s", s, mb / s);
    }
    let seconds: Vec<String> = best
        .iter()
        .map(|t| format!("{:.6}", t.as_secs_f64()))
        .collect();
    println!("RESULT {name} {raw_len} {}", seconds.join(" "));
}

/// Decompression plus a `serde_json` pass that keeps nothing.
fn floor(bytes: &[u8]) {
    let json;
    let text: &[u8] = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .expect("gunzip");
        json = out;
        &json
    } else {
        bytes
    };
    let _: serde::de::IgnoredAny = serde_json::from_slice(text).expect("JSON");
}

/// The uncompressed size: the gzip trailer (mod 2^32) is not enough for big
/// files, so decompress and count.
fn raw_len(bytes: &[u8]) -> u64 {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return bytes.len() as u64;
    }
    let mut decoder = flate2::read::MultiGzDecoder::new(bytes);
    std::io::copy(&mut decoder, &mut std::io::sink()).expect("gunzip")
}

fn largest_fixture() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/traces");
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in std::fs::read_dir(&dir).expect("fixtures folder") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with(".json.gz") {
            continue;
        }
        let size = raw_len(&std::fs::read(&path).expect("read fixture"));
        if best.as_ref().is_none_or(|(s, _)| size > *s) {
            best = Some((size, path));
        }
    }
    best.expect("no fixtures").1
}
