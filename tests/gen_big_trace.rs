//! Builds a big, valid profiler trace by repeating a real fixture's profiled
//! window, for the huge-input benchmarks. Nothing it writes is committed.
//!
//! ```text
//! cargo run --release --example gen_big_trace -- OUT.json [SIZE_MB] [FIXTURE]
//! ```
//!
//! `OUT` ends in `.json` (plain) or `.json.gz`; `SIZE_MB` is the raw JSON size
//! to reach (default 1024); `FIXTURE` defaults to the largest fixture in
//! `../shared/fixtures/traces`. Copy `k` of the fixture's events is the
//! original with its time shifted past copy `k − 1`, its block addresses moved
//! to a range of their own (so each copy pairs its allocations and frees
//! exactly as the original does), its Python, op, flow and autograd ids moved
//! past the previous copy's, and `ProfilerStep#n` renumbered, so the analyzer
//! sees one long run of `3 × copies` profiled steps.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Block addresses of copy `k` are moved by `k × ADDR_STRIDE`.
const ADDR_STRIDE: u64 = 1 << 44;
/// Integer ids (Python, External, Sequence number, flow) shift by this per copy.
const ID_STRIDE: i64 = 1 << 32;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(out) = args.first().map(PathBuf::from) else {
        eprintln!("usage: gen_big_trace OUT.json[.gz] [SIZE_MB] [FIXTURE]");
        std::process::exit(2);
    };
    let target_mb: u64 = args.get(1).map_or(1024, |s| s.parse().expect("SIZE_MB"));
    let fixture = args
        .get(2)
        .map(PathBuf::from)
        .unwrap_or_else(largest_fixture);

    let mut raw = Vec::new();
    File::open(&fixture)
        .expect("open fixture")
        .read_to_end(&mut raw)
        .expect("read fixture");
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut json = Vec::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut json)
            .expect("gunzip fixture");
        raw = json;
    }
    let mut doc: Value = serde_json::from_slice(&raw).expect("fixture JSON");
    let raw_len = raw.len() as u64;
    drop(raw);
    let events = match doc.get_mut("traceEvents").map(Value::take) {
        Some(Value::Array(events)) => events,
        _ => panic!("{fixture:?} has no traceEvents list"),
    };
    let (min_ts, max_ts) = events
        .iter()
        .filter_map(|e| e.get("ts").and_then(Value::as_f64))
        .fold((f64::MAX, f64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
    // Metadata (ph "M") is written once; everything else is repeated.
    let (meta, timed): (Vec<Value>, Vec<Value>) = events
        .into_iter()
        .partition(|e| e.get("ph").and_then(Value::as_str) == Some("M"));
    let span_us = (max_ts - min_ts) + 1000.0;
    let steps_per_copy = timed.iter().filter(|e| step_number(e).is_some()).count() as u64;
    let copies = (target_mb << 20).div_ceil(raw_len).max(1);

    let file = BufWriter::with_capacity(1 << 20, File::create(&out).expect("create OUT"));
    let mut sink: Box<dyn Write> = if out.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::write::GzEncoder::new(
            file,
            flate2::Compression::fast(),
        ))
    } else {
        Box::new(file)
    };
    // The header: every top-level field but the events, then the events.
    let Value::Object(header) = doc else {
        panic!("fixture is not a JSON object")
    };
    sink.write_all(b"{").unwrap();
    for (key, value) in &header {
        if key == "traceEvents" {
            continue;
        }
        serde_json::to_writer(&mut sink, key).unwrap();
        sink.write_all(b":").unwrap();
        serde_json::to_writer(&mut sink, value).unwrap();
        sink.write_all(b",\n").unwrap();
    }
    sink.write_all(b"\"traceEvents\":[\n").unwrap();
    let mut first = true;
    let mut write_event = |sink: &mut Box<dyn Write>, event: &Value| {
        if !first {
            sink.write_all(b",\n").unwrap();
        }
        first = false;
        serde_json::to_writer(&mut **sink, event).unwrap();
    };
    for event in &meta {
        write_event(&mut sink, event);
    }
    for k in 0..copies {
        for event in &timed {
            let mut event = event.clone();
            shift(&mut event, k, span_us, steps_per_copy);
            write_event(&mut sink, &event);
        }
    }
    sink.write_all(b"\n]}\n").unwrap();
    sink.flush().unwrap();
    drop(sink);
    let written = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    println!(
        "{}: {copies} copies of {} ({} profiled steps), {} bytes on disk",
        out.display(),
        fixture.display(),
        copies * steps_per_copy,
        written
    );
}

/// Moves one event into copy `k`.
fn shift(event: &mut Value, k: u64, span_us: f64, steps_per_copy: u64) {
    if k == 0 {
        return;
    }
    let ids = ID_STRIDE * k as i64;
    if let Some(ts) = event.get("ts").and_then(Value::as_f64) {
        event["ts"] = Value::from(ts + span_us * k as f64);
    }
    if let Some(id) = event.get("id").and_then(Value::as_i64) {
        event["id"] = Value::from(id + ids);
    }
    if let Some(n) = step_number(event) {
        event["name"] = Value::from(format!("ProfilerStep#{}", n + steps_per_copy * k));
    }
    let Some(args) = event.get_mut("args").and_then(Value::as_object_mut) else {
        return;
    };
    for key in [
        "Python id",
        "Python parent id",
        "External id",
        "Sequence number",
        "Ev Idx",
    ] {
        if let Some(v) = args.get(key).and_then(Value::as_i64) {
            args.insert(key.to_owned(), Value::from(v + ids));
        }
    }
    if let Some(addr) = args.get("Addr").and_then(Value::as_u64) {
        args.insert(
            "Addr".to_owned(),
            Value::from(addr.wrapping_add(ADDR_STRIDE * k)),
        );
    }
}

fn step_number(event: &Value) -> Option<u64> {
    event
        .get("name")
        .and_then(Value::as_str)?
        .strip_prefix("ProfilerStep#")?
        .parse()
        .ok()
}

/// The fixture with the most raw JSON: its gzip trailer holds the size.
fn largest_fixture() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/traces");
    let mut best: Option<(u32, PathBuf)> = None;
    for entry in std::fs::read_dir(&dir).expect("fixtures folder") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with(".json.gz") {
            continue;
        }
        let bytes = std::fs::read(&path).expect("read fixture");
        let tail: [u8; 4] = bytes[bytes.len() - 4..].try_into().expect("gzip trailer");
        let size = u32::from_le_bytes(tail);
        if best.as_ref().is_none_or(|(s, _)| size > *s) {
            best = Some((size, path));
        }
    }
    best.expect("no fixtures").1
}
