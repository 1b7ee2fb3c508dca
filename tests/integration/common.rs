//! Helpers shared by the integration tests: the one place that finds real
//! fixtures in `../shared` and fails loudly when one is missing.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use memcast::orchestrator::{Category, Schedule};
use memcast::report::Report;
use memcast::trace::{SliceSource, Trace, TraceError, TraceSource};
use memcast::{Bytes, Config, Prepared, Settings, Warned};

/// The `shared/` folder beside this checkout (`../shared`), or the folder named
/// by `MEMCAST_SHARED`.
pub fn shared_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MEMCAST_SHARED") {
        return PathBuf::from(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared")
}

/// The path of a file under `shared/`; panics with the path it tried when the
/// file is missing, so a test never silently skips a fixture.
pub fn shared_file(relative: &str) -> PathBuf {
    let path = shared_dir().join(relative);
    assert!(
        path.is_file(),
        "missing shared fixture {path:?}: the tests need ../shared beside the checkout (or MEMCAST_SHARED)"
    );
    path
}

/// Reads a file under `shared/` into memory (see [`shared_file`]).
pub fn read_shared(relative: &str) -> Vec<u8> {
    let path = shared_file(relative);
    std::fs::read(&path).unwrap_or_else(|err| panic!("cannot read {path:?}: {err}"))
}

/// The fixtures (`*.json.gz`) of one folder under `shared/fixtures`, as paths
/// relative to `shared/` (`fixtures/{folder}/{name}`), sorted; panics if the
/// folder is missing or empty.
pub fn fixtures_in(folder: &str) -> Vec<String> {
    let dir = shared_dir().join("fixtures").join(folder);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("cannot list {dir:?}: {err}"))
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json.gz"))
        .map(|name| format!("fixtures/{folder}/{name}"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no fixtures in {dir:?}");
    names
}

/// The names of every CPU trace fixture (`*.json.gz`) in `shared/fixtures/traces`,
/// sorted; panics if the folder is missing or empty.
pub fn trace_fixtures() -> Vec<String> {
    fixtures_in("traces")
        .into_iter()
        .map(|path| path.trim_start_matches("fixtures/traces/").to_owned())
        .collect()
}

/// The path of a small hand-written trace in this checkout's `tests/fixtures`.
pub fn local_fixture(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    assert!(path.is_file(), "missing test fixture {path:?}");
    path
}

/// A trace already parsed, handed to the pipeline as a source.
struct Parsed(Option<Warned<Trace>>);

impl TraceSource for Parsed {
    fn size_hint(&self) -> Option<u64> {
        None
    }
    fn next_chunk(&mut self) -> Result<Option<&[u8]>, TraceError> {
        Ok(None)
    }
    fn parsed(&mut self) -> Option<Result<Warned<Trace>, TraceError>> {
        self.0.take().map(Ok)
    }
}

/// Prepares (analyzes and orchestrates) a trace already parsed.
pub fn prepare_parsed(trace: Trace, config: &Config) -> Prepared {
    let mut source = Parsed(Some(Warned {
        value: trace,
        warnings: Vec::new(),
    }));
    memcast::prepare_from(&mut source, config, &mut |_| {})
        .unwrap_or_else(|err| panic!("prepare: {err}"))
}

/// The report of the trace file at `path` under `settings`, as the CLI
/// gives it (the file read whole, then prepared and estimated); panics with
/// the path on any error.
pub fn estimate_file(path: &Path, settings: &Settings) -> Report {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let config: Config = settings.config().unwrap();
    let mut source = SliceSource::new(&bytes);
    let mut sources: Vec<&mut dyn TraceSource> = vec![&mut source];
    let prepared = memcast::pipeline::prepare_many_from(&mut sources, &config, &mut |_| {})
        .unwrap_or_else(|e| panic!("{path:?}: {e}"));
    memcast::estimate(&prepared, &config, &mut |_| {})
        .unwrap_or_else(|e| panic!("{path:?}: {e}"))
        .value
}

/// The bytes of every block of `category` in a schedule.
pub fn category_bytes(schedule: &Schedule, category: Category) -> Bytes {
    schedule
        .blocks
        .iter()
        .filter(|b| b.category == category)
        .map(|b| b.size)
        .sum()
}
