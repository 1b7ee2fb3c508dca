//! The trace reader on arbitrary bytes (plain JSON, or gzip when the bytes
//! start with its magic), and on success the rest of the pipeline: no input
//! may panic, hang or take memory out of proportion to its size.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A small limit keeps a fuzzed gzip bomb cheap; the code path is the same.
    let Ok(trace) = memcast::trace::parse_with_limit(data, 1 << 20, &mut |_, _| {}) else {
        return;
    };
    let mut config = memcast::Config::standard();
    config.gpus.truncate(1);
    if let Ok(analysis) = memcast::analyzer::analyze(&trace.value, &config.analyzer) {
        let _ = memcast::orchestrator::orchestrate(&analysis.value, &config.orchestrator);
    }
});
