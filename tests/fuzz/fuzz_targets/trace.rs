//! The trace reader on arbitrary bytes (plain JSON, or gzip when the bytes
//! start with its magic), and on success the rest of the pipeline (and the
//! rebuild of a deeper, longer job): no input
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
    // Trace small, run big: any trace rebuilt deeper and longer, or refused.
    for (layers, seq_len) in [(Some(5), None), (None, Some(96)), (Some(3), Some(40))] {
        let target = memcast::scale::Target {
            layers,
            seq_len,
            new_tokens: None,
        };
        if let Ok(scaled) = memcast::scale::scale(&trace.value, &target) {
            let _ = memcast::analyzer::analyze(&scaled.value.0, &config.analyzer);
        }
    }
});
