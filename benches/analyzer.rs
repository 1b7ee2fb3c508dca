//! Analyzer throughput in MB/s of raw (uncompressed) JSON.
//!
//! `cargo bench --bench analyzer [-- TRACE]`: by default the largest fixture in
//! `../shared/fixtures/traces` (by raw JSON size). Decompression is done once
//! before timing; each pass times `trace::parse` on the plain JSON, then
//! `analyzer::analyze`, and compares with serde_json parsing the same bytes
//! into a minimal borrowed struct (the ceiling for any serde-based reader).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use memcast::analyzer::{self, AnalyzerConfig};
use memcast::trace;
use serde::Deserialize;

const PASSES: usize = 7;

#[derive(Deserialize)]
#[allow(dead_code)]
struct MinimalTrace<'a> {
    #[serde(rename = "traceEvents", borrow)]
    trace_events: Vec<MinimalEvent<'a>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct MinimalEvent<'a> {
    #[serde(borrow)]
    ph: Option<&'a str>,
    #[serde(borrow)]
    cat: Option<&'a str>,
    #[serde(borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    ts: Option<f64>,
    dur: Option<f64>,
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return bytes.to_vec();
    }
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("gzip");
    out
}

fn largest_fixture() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/traces");
    let mut best: Option<(usize, PathBuf)> = None;
    for entry in std::fs::read_dir(&dir).expect("fixtures dir") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with(".json.gz") {
            continue;
        }
        let size = gunzip(&std::fs::read(&path).expect("read")).len();
        if best.as_ref().is_none_or(|(s, _)| size > *s) {
            best = Some((size, path));
        }
    }
    best.expect("no fixture").1
}

fn mb_per_s(bytes: usize, time: Duration) -> f64 {
    bytes as f64 / 1e6 / time.as_secs_f64()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is a trace path.
    let path = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .unwrap_or_else(largest_fixture);
    let json = gunzip(&std::fs::read(&path).expect("read trace"));
    println!(
        "trace: {} ({:.1} MB raw JSON)",
        path.display(),
        json.len() as f64 / 1e6
    );

    let (mut serde_t, mut parse_t, mut analyze_t, mut total_t) = (vec![], vec![], vec![], vec![]);
    for _ in 0..PASSES {
        let start = Instant::now();
        let minimal: MinimalTrace = serde_json::from_slice(&json).expect("minimal parse");
        serde_t.push(start.elapsed());
        std::hint::black_box(minimal.trace_events.len());

        let start = Instant::now();
        let parsed = trace::parse(&json).expect("parse");
        let parse_time = start.elapsed();
        let start = Instant::now();
        let analysis =
            analyzer::analyze(&parsed.value, &AnalyzerConfig::standard()).expect("analyze");
        let analyze_time = start.elapsed();
        std::hint::black_box(analysis.value.blocks.len());
        parse_t.push(parse_time);
        analyze_t.push(analyze_time);
        total_t.push(parse_time + analyze_time);
    }
    let n = json.len();
    for (label, times) in [
        ("serde_json, minimal borrowed struct", serde_t),
        ("trace::parse", parse_t),
        ("analyzer::analyze (on the parsed trace)", analyze_t),
        ("trace::parse + analyzer::analyze", total_t),
    ] {
        let best = *times.iter().min().expect("passes");
        let med = median(times);
        println!(
            "{label:<42} median {:>7.1} ms = {:>6.0} MB/s   best {:>7.1} ms = {:>6.0} MB/s",
            med.as_secs_f64() * 1e3,
            mb_per_s(n, med),
            best.as_secs_f64() * 1e3,
            mb_per_s(n, best)
        );
    }
}
