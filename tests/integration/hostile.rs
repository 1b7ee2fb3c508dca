//! Hostile input: every kind of file people drop into memcast that is not a
//! usable CPU trace, through the library and through the `memcast` binary.
//! Each one must give one clear message (what was wrong and what to do), the
//! CLI must exit non-zero with it on stderr, and nothing may panic, hang or
//! allocate out of proportion. Inputs are built here, small; crash inputs the
//! fuzzers found are kept at the end as regression tests.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output};

use memcast::analyzer::AnalyzeError;
use memcast::orchestrator::OrchestrateError;
use memcast::trace::{self, TraceError, MAX_DECOMPRESSED_BYTES};
use memcast::{Config, Error};

use crate::common;

const SMALL_FIXTURE: &str = "fixtures/traces/resnet18_sgd_bs16_pos1.json.gz";

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// A small pseudo-random byte string (xorshift), the same on every run.
fn random_bytes(n: usize, mut seed: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect()
}

fn memory(ts: f64, addr: u64, bytes: &str, device: i64, device_id: i64) -> String {
    format!(
        r#"{{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": {ts},
            "args": {{"Addr": {addr}, "Bytes": {bytes}, "Total Allocated": 0, "Total Reserved": 0,
                      "Device Type": {device}, "Device Id": {device_id}}}}}"#
    )
}

fn python(ts: f64, dur: f64) -> String {
    format!(
        r#"{{"ph": "X", "cat": "python_function", "name": "train.py(1): <module>", "pid": 1, "tid": 1,
            "ts": {ts}, "dur": {dur}, "args": {{"Python id": 1}}}}"#
    )
}

fn step(ts: f64, dur: f64) -> String {
    format!(
        r#"{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
            "ts": {ts}, "dur": {dur}, "args": {{}}}}"#
    )
}

/// A trace with one profiler step and one Python frame around `events`.
fn cpu_trace(events: &[String]) -> Vec<u8> {
    let mut all = vec![step(0.0, 1000.0), python(0.0, 1000.0)];
    all.extend_from_slice(events);
    format!(
        r#"{{"schemaVersion": 1, "traceEvents": [{}]}}"#,
        all.join(",\n")
    )
    .into_bytes()
}

fn run(bytes: &[u8]) -> Result<memcast::Warned<memcast::report::Report>, Error> {
    let mut config = Config::standard();
    config.gpus.truncate(1);
    memcast::run(bytes, &config, &mut |_| {})
}

/// Writes `bytes` to a temporary file and runs `memcast <command> FILE`.
fn cli(command: &str, name: &str, bytes: &[u8]) -> Output {
    let dir = std::env::temp_dir().join(format!("memcast-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let mut args = vec![command];
    if command == "estimate" {
        args.extend(["--gpu", "a100-80gb"]);
    }
    args.push(path.to_str().unwrap());
    let output = Command::new(env!("CARGO_BIN_EXE_memcast"))
        .args(&args)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    output
}

/// The CLI refuses the file: exit code 1, nothing on stdout, and one line
/// `error: …` on stderr that contains `expected`.
fn assert_cli_refuses(name: &str, bytes: &[u8], expected: &str) {
    let output = cli("estimate", name, bytes);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{name}: {stderr}");
    assert!(output.stdout.is_empty(), "{name}: wrote to stdout");
    assert!(stderr.starts_with("error: "), "{name}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{name}: {stderr}");
    assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    assert!(
        stderr.contains(expected),
        "{name}: {stderr:?} lacks {expected:?}"
    );
}

fn trace_error(bytes: &[u8]) -> TraceError {
    match run(bytes) {
        Err(Error::Trace(err)) => err,
        other => panic!("expected a trace error, got {other:?}"),
    }
}

#[test]
fn an_empty_file_is_named_empty() {
    assert_eq!(trace_error(b""), TraceError::Empty);
    assert_eq!(trace_error(b" \n\t "), TraceError::Empty);
    assert_eq!(trace_error(&gzip(b"")), TraceError::Empty);
    assert_cli_refuses("empty.json", b"", "the file is empty");
}

#[test]
fn random_bytes_are_not_json() {
    for seed in 1..=64 {
        let mut bytes = random_bytes(2048, seed);
        // Random bytes that open like JSON or gzip go to those readers.
        if matches!(bytes.first(), Some(b'{' | b'[' | b' ' | 0x1f | 0xef)) {
            bytes[0] = b'x';
        }
        assert!(
            matches!(trace_error(&bytes), TraceError::NotJson(_)),
            "seed {seed}"
        );
    }
    assert_cli_refuses(
        "random.bin",
        &random_bytes(4096, 7),
        "neither JSON nor gzip-compressed JSON",
    );
    // Random bytes behind a gzip header are a corrupt stream, not a panic.
    let mut fake = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
    fake.extend(random_bytes(4096, 9));
    assert!(matches!(
        trace_error(&fake),
        TraceError::CorruptGzip(_) | TraceError::TruncatedGzip
    ));
    // Random bytes inside valid gzip are random JSON.
    let mut inner = random_bytes(4096, 11);
    inner[0] = b'#';
    assert!(matches!(trace_error(&gzip(&inner)), TraceError::NotJson(_)));
}

#[test]
fn truncated_gzip_is_named_truncated_at_every_cut() {
    let whole = common::read_shared(SMALL_FIXTURE);
    for cut in [11, 100, whole.len() / 3, whole.len() / 2, whole.len() - 9] {
        let err = trace_error(&whole[..cut]);
        assert_eq!(err, TraceError::TruncatedGzip, "cut at {cut}");
    }
    // Cut inside the 8-byte trailer: the JSON is complete, the check is not.
    let err = trace_error(&whole[..whole.len() - 4]);
    assert!(
        matches!(err, TraceError::TruncatedGzip | TraceError::CorruptGzip(_)),
        "{err:?}"
    );
    assert_cli_refuses(
        "cut.json.gz",
        &whole[..whole.len() / 2],
        "the gzip data is truncated",
    );
}

#[test]
fn a_gzip_bomb_is_refused_past_the_limit() {
    // 64 MiB of spaces compress to ~64 KiB. The real limit
    // (MAX_DECOMPRESSED_BYTES, 2 GiB) takes the same code path with a bigger
    // number; a smaller one keeps this test fast.
    let limit = 16 << 20;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut spaces = vec![b' '; 1 << 20];
    spaces[0] = b'[';
    encoder.write_all(&spaces).unwrap();
    spaces[0] = b' ';
    for _ in 1..64 {
        encoder.write_all(&spaces).unwrap();
    }
    let bomb = encoder.finish().unwrap();
    assert!(bomb.len() < 256 << 10, "{}", bomb.len());
    let err = trace::parse_with_limit(&bomb, limit, &mut |_, _| {}).unwrap_err();
    assert_eq!(err, TraceError::GzipTooLarge { limit });
    let message = err.to_string();
    assert!(message.contains("16777216 bytes"), "{message}");
    assert!(message.contains("fewer profiled steps"), "{message}");
    assert_eq!(MAX_DECOMPRESSED_BYTES, 2 << 30);
    // A multi-member stream is bounded over all members, not per member.
    let mut members = Vec::new();
    for _ in 0..3 {
        members.extend(gzip(&vec![b' '; 8 << 20]));
    }
    let err = trace::parse_with_limit(&members, limit, &mut |_, _| {}).unwrap_err();
    assert_eq!(err, TraceError::GzipTooLarge { limit });
}

#[test]
fn json_that_is_not_a_trace_is_named_as_such() {
    for (text, found) in [
        (r#"{"hello": [1, 2, 3]}"#, "keys hello"),
        ("{}", "without keys"),
        (r#"{"traceEvents": 5}"#, ""),
        ("[1, 2, 3]", ""),
        (r#""a string""#, ""),
    ] {
        let err = run(text.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Trace(
                    TraceError::NotAProfilerTrace(_)
                        | TraceError::NotJson(_)
                        | TraceError::NoMemoryEvents
                )
            ),
            "{text}: {err:?}"
        );
        assert!(err.to_string().contains(found), "{text}: {err}");
    }
    assert_cli_refuses(
        "package.json",
        br#"{"name": "left-pad", "version": "1.3.0"}"#,
        "is not a torch.profiler trace",
    );
}

#[test]
fn deeply_nested_json_neither_overflows_the_stack_nor_passes() {
    let depth = 200_000;
    let open = "[".repeat(depth);
    let close = "]".repeat(depth);
    let cases = [
        // As an event, as the whole document, as an unknown header field,
        // inside an event's args, and inside a field the reader descends into.
        format!(r#"{{"traceEvents": [{open}{close}]}}"#),
        format!("{open}{close}"),
        format!(r#"{{"x": {open}{close}, "traceEvents": []}}"#),
        format!(
            r#"{{"traceEvents": [{{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1, "args": {{"deep": {open}{close}}}}}]}}"#
        ),
        format!(
            r#"{{"traceEvents": [{{"ph": "X", "cat": "cpu_op", "name": "AccumulateGrad", "ts": 1, "dur": 1, "args": {{"Input Dims": {open}{close}}}}}]}}"#
        ),
        format!(
            r#"{{"traceEvents": [{}]}}"#,
            r#"{"a":"#.repeat(depth) + &"}".repeat(depth)
        ),
    ];
    for (i, text) in cases.iter().enumerate() {
        let err = run(text.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Trace(TraceError::NoMemoryEvents | TraceError::InvalidJson { .. })
            ),
            "case {i}: {err:?}"
        );
    }
    assert_cli_refuses(
        "nested.json",
        cases[0].as_bytes(),
        "the trace has no [memory] events",
    );
    // Unclosed nesting is a truncated file.
    let err = run(format!(r#"{{"traceEvents": [{open}"#).as_bytes()).unwrap_err();
    assert!(
        matches!(err, Error::Trace(TraceError::Truncated { .. })),
        "{err:?}"
    );
}

#[test]
fn sizes_out_of_range_are_refused_and_huge_timestamps_do_not_overflow() {
    for bytes in ["1e30", "-1e300", "9223372036854775807", "1125899906842625"] {
        let text = cpu_trace(&[memory(10.0, 100, bytes, 0, -1)]);
        let err = trace_error(&text);
        assert!(
            matches!(err, TraceError::MemorySizeOutOfRange(_)),
            "{bytes}: {err:?}"
        );
        assert!(err.to_string().contains("2^50 bytes"), "{err}");
    }
    assert_cli_refuses(
        "huge.json",
        &cpu_trace(&[memory(10.0, 100, "1e30", 0, -1)]),
        "more than any device holds",
    );
    // Timestamps at the ends of f64 saturate; the estimate still completes.
    let text = cpu_trace(&[
        memory(-1e300, 100, "64", 0, -1),
        memory(1e300, 100, "-64", 0, -1),
        memory(5.0, 200, "128", 0, -1),
    ]);
    let report = run(&text).unwrap().value;
    assert!(report.peak.total_bytes.get() > 0);
}

#[test]
fn zero_and_negative_sizes_alone_are_not_a_training_run() {
    // Zero-byte events are skipped (and counted), so nothing is left.
    let zero = cpu_trace(&[memory(10.0, 100, "0", 0, -1), memory(20.0, 100, "0", 0, -1)]);
    assert_eq!(trace_error(&zero), TraceError::NoMemoryEvents);
    // Only negative sizes: frees of memory allocated before profiling.
    let frees = cpu_trace(&[
        memory(10.0, 100, "-64", 0, -1),
        memory(20.0, 200, "-32", 0, -1),
    ]);
    let err = run(&frees).unwrap_err();
    assert_eq!(err, Error::Orchestrate(OrchestrateError::NoBlocks));
    assert!(err.to_string().contains("profile_memory=True"), "{err}");
    assert_cli_refuses("frees.json", &frees, "no memory blocks to orchestrate");
    assert_cli_refuses("zero.json", &zero, "no [memory] events");
}

#[test]
fn frees_without_allocations_are_counted_and_left_out() {
    let text = cpu_trace(&[
        memory(10.0, 100, "-64", 0, -1),
        memory(20.0, 200, "256", 0, -1),
        memory(30.0, 300, "-16", 0, -1),
        memory(40.0, 200, "-256", 0, -1),
    ]);
    let report = run(&text).unwrap();
    let warning = report
        .warnings
        .iter()
        .find(|w| w.code == "free_of_unknown_block")
        .unwrap();
    assert!(
        warning.message.starts_with("2 frees (80 bytes)"),
        "{warning:?}"
    );
}

#[test]
fn an_address_allocated_twice_keeps_both_blocks() {
    let once = cpu_trace(&[
        memory(10.0, 100, "512", 0, -1),
        memory(30.0, 100, "-512", 0, -1),
    ]);
    let twice = cpu_trace(&[
        memory(10.0, 100, "512", 0, -1),
        memory(20.0, 100, "512", 0, -1),
        memory(30.0, 100, "-512", 0, -1),
    ]);
    let once = run(&once).unwrap();
    let twice = run(&twice).unwrap();
    assert!(twice
        .warnings
        .iter()
        .any(|w| w.code == "allocation_at_live_address" && w.message.starts_with("1 allocations")));
    // The first block is kept as never freed: the second adds to the peak.
    assert!(
        twice.value.peak.allocated_bytes > once.value.peak.allocated_bytes,
        "{:?} vs {:?}",
        twice.value.peak,
        once.value.peak
    );
}

#[test]
fn event_order_in_the_file_does_not_matter() {
    // Chrome traces are not sorted; the reader sorts memory events by time.
    // Reversing a real trace's event list must give the same estimate.
    let bytes = common::read_shared(SMALL_FIXTURE);
    let mut json: serde_json::Value = {
        use std::io::Read as _;
        let mut text = Vec::new();
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .read_to_end(&mut text)
            .unwrap();
        serde_json::from_slice(&text).unwrap()
    };
    json["traceEvents"].as_array_mut().unwrap().reverse();
    let reversed = serde_json::to_vec(&json).unwrap();
    let a = run(&bytes).unwrap().value;
    let b = run(&reversed).unwrap().value;
    assert_eq!(a.peak, b.peak);
    assert_eq!(a.breakdown_at_peak, b.breakdown_at_peak);
    // A free stamped before its allocation is a free of an unknown block.
    let text = cpu_trace(&[
        memory(30.0, 100, "64", 0, -1),
        memory(10.0, 100, "-64", 0, -1),
        memory(20.0, 200, "32", 0, -1),
    ]);
    let report = run(&text).unwrap();
    assert!(report
        .warnings
        .iter()
        .any(|w| w.code == "free_of_unknown_block"));
}

#[test]
fn events_for_several_gpus_are_refused() {
    let text = cpu_trace(&[
        memory(10.0, 100, "64", 1, 0),
        memory(11.0, 100, "64", 1, 1),
        memory(12.0, 300, "64", 0, -1),
        memory(20.0, 100, "-64", 1, 0),
        memory(21.0, 100, "-64", 1, 1),
    ]);
    let err = run(&text).unwrap_err();
    assert_eq!(err, Error::Analyze(AnalyzeError::SeveralGpus(vec![0, 1])));
    assert!(err.to_string().contains("CUDA_VISIBLE_DEVICES=0"), "{err}");
    assert_cli_refuses("two-gpus.json", &text, "device ids [0, 1]");
    // CPU and one GPU together are fine: the GPU blocks are the run.
    let text = cpu_trace(&[
        memory(10.0, 100, "64", 1, 0),
        memory(12.0, 300, "64", 0, -1),
        memory(20.0, 100, "-64", 1, 0),
    ]);
    let report = run(&text).unwrap();
    assert!(report.warnings.iter().any(|w| w.code == "gpu_trace"));
}

#[test]
fn a_cuda_trace_points_to_replay_mode() {
    let cuda = std::fs::read(common::local_fixture("cuda_memory.json")).unwrap();
    let err = run(&cuda).unwrap_err();
    assert_eq!(
        err,
        Error::Analyze(AnalyzeError::GpuTraceWithoutPythonFrames)
    );
    assert!(err.to_string().contains("memcast replay"), "{err}");
    assert_cli_refuses(
        "cuda.json",
        &cuda,
        "use replay mode (`memcast replay FILE`)",
    );
    // The same file is what replay mode reads.
    let output = cli("replay", "cuda.json", &cuda);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // A real GPU trace with Python frames is estimated, with a pointer to replay.
    let real = common::read_shared(
        "ground-truth/kineto_traces/yuchen404__cs336_assignment2_systems/log__lc-SA5212M5_358448.1767529307559178376.pt.trace.json.gz",
    );
    let report = run(&real).unwrap();
    let warning = report
        .warnings
        .iter()
        .find(|w| w.code == "gpu_trace")
        .unwrap();
    assert!(warning.message.contains("memcast replay"), "{warning:?}");
}

#[test]
fn missing_profiler_flags_are_named() {
    // No python_function events: with_stack=True.
    let text = format!(
        r#"{{"traceEvents": [{}, {}, {}]}}"#,
        step(0.0, 100.0),
        memory(10.0, 100, "64", 0, -1),
        memory(20.0, 100, "-64", 0, -1)
    );
    // Without them the estimate is made from the markers and ops, with a
    // warning naming the option that brings the layers back.
    let report = run(text.as_bytes()).unwrap().value;
    let warning = report
        .warnings
        .iter()
        .find(|w| w.code == "no_python_frames")
        .unwrap();
    assert!(warning.message.contains("with_stack=True"), "{warning:?}");
    let output = cli("estimate", "no-stack.json", text.as_bytes());
    assert_eq!(output.status.code(), Some(0));
    // No [memory] events: profile_memory=True.
    let text = cpu_trace(&[]);
    assert_eq!(trace_error(&text), TraceError::NoMemoryEvents);
    assert_cli_refuses("no-memory.json", &text, "profile_memory=True");
    // [memory] events without addresses: an old PyTorch.
    let text = cpu_trace(&[
        r#"{"ph": "i", "name": "[memory]", "ts": 10, "args": {"Bytes": 64}}"#.to_owned(),
    ]);
    assert_eq!(
        trace_error(&text),
        TraceError::MemoryEventsWithoutAddress(1)
    );
    assert_cli_refuses("no-addr.json", &text, "no \"Addr\"");
}

#[test]
fn hostile_files_given_to_replay_mode_fail_cleanly() {
    let whole = common::read_shared(SMALL_FIXTURE);
    let mut pickle_garbage = vec![0x80, 0x04, 0x95];
    pickle_garbage.extend(random_bytes(512, 3));
    for (name, bytes) in [
        ("empty.pickle", Vec::new()),
        ("random.bin", random_bytes(4096, 5)),
        ("cut.json.gz", whole[..whole.len() / 2].to_vec()),
        ("garbage.pickle", pickle_garbage),
        ("cpu.json.gz", whole.clone()),
    ] {
        assert!(memcast::replay::replay(&bytes).is_err(), "{name}");
        let output = cli("replay", name, &bytes);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.starts_with("error: "), "{name}: {stderr}");
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    }
}

#[test]
fn hostile_permalinks_are_refused_quickly() {
    use memcast::permalink::{self, PermalinkError, MAX_FRAGMENT_CHARS};
    let started = std::time::Instant::now();
    let long = format!("#e=v1.{}", "A".repeat(MAX_FRAGMENT_CHARS + 1));
    assert!(permalink::decode(&long).is_err());
    // A deflate bomb inside a well-formed fragment stops at the size bound.
    let mut deflater = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    deflater.write_all(&vec![b' '; 64 << 20]).unwrap();
    let bomb = deflater.finish().unwrap();
    use base64::Engine as _;
    let fragment = format!(
        "#e=v1.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bomb)
    );
    assert!(fragment.len() < MAX_FRAGMENT_CHARS, "{}", fragment.len());
    assert!(permalink::decode(&fragment).is_err());
    for junk in ["", "#", "#e=", "#e=v1.", "#e=v9.AAAA", "#e=v1.!!!!", "#x=1"] {
        let err: PermalinkError = permalink::decode(junk).unwrap_err();
        assert!(!err.to_string().is_empty());
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

/// A minimal pickle writer for synthetic `_dump_snapshot` files: JSON
/// objects become dicts, arrays lists, integers 8-byte longs, strings
/// BINUNICODE, booleans NEWTRUE/NEWFALSE, null NONE, floats BINFLOAT.
pub fn pickle(v: &serde_json::Value) -> Vec<u8> {
    fn write(v: &serde_json::Value, out: &mut Vec<u8>) {
        use serde_json::Value;
        match v {
            Value::Null => out.push(b'N'),
            Value::Bool(b) => out.push(if *b { 0x88 } else { 0x89 }),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    out.extend([0x8a, 8]);
                    out.extend(i.to_le_bytes());
                } else {
                    out.push(b'G');
                    out.extend(n.as_f64().unwrap_or(0.0).to_be_bytes());
                }
            }
            Value::String(s) => {
                out.push(b'X');
                out.extend((s.len() as u32).to_le_bytes());
                out.extend(s.as_bytes());
            }
            Value::Array(items) => {
                out.extend([b']', b'(']);
                for i in items {
                    write(i, out);
                }
                out.push(b'e');
            }
            Value::Object(map) => {
                out.extend([b'}', b'(']);
                for (k, v) in map {
                    write(&Value::String(k.clone()), out);
                    write(v, out);
                }
                out.push(b'u');
            }
        }
    }
    let mut out = vec![0x80, 2];
    write(v, &mut out);
    out.push(b'.');
    out
}

/// A small `_dump_snapshot`-shaped dict: segments `(device, address, size,
/// [(block size, active)])` (large pool, default stream) and one trace list
/// per device index of `(action, address, size)`.
/// `(device, address, size, blocks as (size, active))`.
type TestSegment<'a> = (i64, u64, u64, &'a [(u64, bool)]);

fn snapshot_pickle(segments: &[TestSegment], traces: &[&[(&str, u64, u64)]]) -> Vec<u8> {
    use serde_json::json;
    let segments: Vec<serde_json::Value> = segments
        .iter()
        .map(|&(device, address, size, blocks)| {
            let mut at = address;
            let blocks: Vec<serde_json::Value> = blocks
                .iter()
                .map(|&(size, active)| {
                    let b = json!({"address": at, "size": size, "requested_size": size,
                        "state": if active { "active_allocated" } else { "inactive" }});
                    at += size;
                    b
                })
                .collect();
            json!({"device": device, "address": address, "total_size": size, "stream": 0,
                "segment_type": "large", "segment_pool_id": [0, 0], "is_expandable": false,
                "blocks": blocks})
        })
        .collect();
    let traces: Vec<serde_json::Value> = traces
        .iter()
        .map(|entries| {
            entries
                .iter()
                .map(|&(action, addr, size)| {
                    json!({"action": action, "addr": addr, "size": size, "stream": 0})
                })
                .collect()
        })
        .collect();
    pickle(&json!({"segments": segments, "device_traces": traces,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": false}}))
}

#[test]
fn snapshots_with_odd_device_lists_replay_every_device() {
    use memcast::replay::replay;
    use memcast::Bytes;
    const MIB: u64 = 1 << 20;
    let (a, b) = (0x7f00_0000_0000u64, 0x7f40_0000_0000u64);
    // The only device holds segments but recorded no trace entries, and it
    // is not device 0: its reserved bytes are its real and simulated peak.
    let only = snapshot_pickle(
        &[(1, a, 40 * MIB, &[(30 * MIB, true), (10 * MIB, false)])],
        &[&[], &[]],
    );
    let r = replay(&only).unwrap();
    let ids: Vec<i64> = r.devices.iter().map(|d| d.device).collect();
    assert_eq!(ids, [1]);
    assert_eq!(r.largest.device, 1);
    assert_eq!(r.largest.events, 0);
    assert_eq!(r.largest.real_peak_reserved_bytes, Bytes(40 * MIB));
    assert_eq!(r.largest.simulated_peak_reserved_bytes, Bytes(40 * MIB));
    assert!(r.is_exact(), "{r:#?}");
    // Devices 0 and 3 (a gap; the trace list stops before device 3):
    // device 0 recorded entries, device 3 only segments, device 3 is larger.
    let gaps = snapshot_pickle(
        &[
            (3, b, 60 * MIB, &[(60 * MIB, true)]),
            (0, a, 20 * MIB, &[(4 * MIB, true), (16 * MIB, false)]),
        ],
        &[
            &[
                ("free_completed", a + 4 * MIB, 8 * MIB),
                ("alloc", a, 4 * MIB),
            ],
            &[],
        ],
    );
    let r = replay(&gaps).unwrap();
    let ids: Vec<i64> = r.devices.iter().map(|d| d.device).collect();
    assert_eq!(ids, [0, 3]);
    assert_eq!(r.largest.device, 3);
    assert_eq!(r.largest.real_peak_reserved_bytes, Bytes(60 * MIB));
    let dev0 = &r.devices[0];
    assert_eq!(
        (dev0.events, dev0.allocs, dev0.real_peak_reserved_bytes),
        (2, 1, Bytes(20 * MIB))
    );
    assert!(r.is_exact(), "{r:#?}");
    // The CLI lists the devices.
    let output = cli("replay", "gaps.pickle", &gaps);
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("devices: 2"), "{text}");
    // Nothing recorded at all: device 0, empty.
    let empty = snapshot_pickle(&[], &[&[], &[], &[]]);
    let r = replay(&empty).unwrap();
    assert_eq!(r.devices.len(), 1);
    assert!(r.largest.start_complete && r.is_exact());
    // Entries of a device without segments that free unknown blocks, and
    // negative device numbers, are reported, not fatal.
    let odd = snapshot_pickle(
        &[(-1, a, 20 * MIB, &[(20 * MIB, false)])],
        &[&[("free_completed", b, MIB), ("alloc", b, 2 * MIB)]],
    );
    let r = replay(&odd).unwrap();
    let ids: Vec<i64> = r.devices.iter().map(|d| d.device).collect();
    assert_eq!(ids, [-1, 0]);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.message.starts_with("device 0: ")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn snapshots_with_malformed_device_fields_do_not_panic() {
    use memcast::replay::replay;
    use serde_json::json;
    for root in [
        json!({"segments": [], "device_traces": 7}),
        json!({"segments": [{"device": "zero", "address": 0, "total_size": 0, "blocks": []}], "device_traces": [[]]}),
        json!({"segments": [{"device": 0, "address": 4096, "total_size": 1024, "blocks": [{"address": 4096, "size": 4096}]}], "device_traces": [[{"action": "alloc"}]]}),
        json!({"segments": [], "device_traces": [[{"action": "alloc", "addr": -5, "size": 1e30}], [7, "x", null]]}),
    ] {
        let _ = replay(&pickle(&root));
    }
}

// Crash inputs found by the fuzzers (tests/fuzz), kept as regressions.

#[test]
fn fuzz_snapshot_a_huge_pickle_memo_index_is_refused_without_allocating() {
    // PROTO 4, NONE, LONG_BINPUT 0xfffffff0, STOP: the memo used to be
    // resized to 4 G entries (16 GiB) before anything checked the index.
    let pickle = [0x80, 0x04, b'N', b'r', 0xf0, 0xff, 0xff, 0xff, b'.'];
    let err = memcast::replay::replay_snapshot(&pickle).unwrap_err();
    assert!(
        err.to_string().contains("memo index beyond the file"),
        "{err}"
    );
    let output = cli("replay", "memo.pickle", &pickle);
    assert_eq!(output.status.code(), Some(1));
}

#[test]
fn fuzz_alloc_conf_old_rule_lists_round_trip() {
    use memcast::simulator::{AllocatorConfig, RuleVersion};
    let conf = "max_split_size_mb:66,roundup_power2_divisions:[,2:2,4:4]";
    for version in [RuleVersion::Old, RuleVersion::Mid, RuleVersion::New] {
        let Ok(parsed) = AllocatorConfig::parse(conf, version) else {
            continue;
        };
        let again = AllocatorConfig::parse(&parsed.to_conf_string(), version);
        assert_eq!(again, Ok(parsed), "{version:?}");
    }
}

/// What a trace needs for an answer is `[memory]` events; every other gap
/// costs detail, never a panic, a hang or a silent number.
#[test]
fn odd_structures_give_a_degraded_estimate_with_their_warning() {
    let mem = |ts: f64, addr: u64, bytes: &str| memory(ts, addr, bytes, 0, -1);
    let with =
        |events: &[String]| format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n")).into_bytes();
    let codes = |bytes: &[u8]| -> Vec<String> {
        let report = run(bytes).unwrap().value;
        assert!(report.peak.allocated_bytes.get() > 0);
        report.warnings.into_iter().map(|w| w.code).collect()
    };
    // Only [memory] events: one iteration, no phases, no layers.
    let only_memory = with(&[
        mem(1.0, 100, "4096"),
        mem(2.0, 200, "8192"),
        mem(3.0, 100, "-4096"),
    ]);
    let got = codes(&only_memory);
    for code in ["no_python_frames", "no_iterations_found", "no_parameters"] {
        assert!(
            got.iter().any(|c| c == code),
            "only memory: {got:?} lacks {code}"
        );
    }
    let output = cli("estimate", "only-memory.json", &only_memory);
    assert_eq!(output.status.code(), Some(0));
    // AccumulateGrad with a shape but no memory event inside or before it.
    let accumulate = with(&[
        step(0.0, 100.0),
        r#"{"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 50, "dur": 10, "args": {}}"#.to_owned(),
        r#"{"ph": "X", "cat": "cpu_op", "name": "torch::autograd::AccumulateGrad", "pid": 1, "tid": 1, "ts": 51, "dur": 8, "args": {"Input Dims": [[10, 10]], "Input type": ["float"]}}"#.to_owned(),
        r#"{"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1, "ts": 70, "dur": 20, "args": {}}"#.to_owned(),
        mem(5.0, 100, "4096"),
        mem(95.0, 100, "-4096"),
    ]);
    let got = codes(&accumulate);
    assert!(
        got.iter().any(|c| c == "gradient_block_not_found"),
        "{got:?}"
    );
    // ProfilerStep annotations with no op inside.
    let empty_steps = with(&[
        step(0.0, 100.0),
        r#"{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 100, "dur": 100, "args": {}}"#.to_owned(),
        mem(5.0, 100, "4096"),
        mem(150.0, 100, "-4096"),
    ]);
    let got = codes(&empty_steps);
    assert!(got.iter().any(|c| c == "no_python_frames"), "{got:?}");
}
