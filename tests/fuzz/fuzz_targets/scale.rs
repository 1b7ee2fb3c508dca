//! Trace small, run big on fuzzed traces: `--layers`, `--seq-len` and
//! `--new-tokens` (any values, one trace or two, an estimate or the
//! longest-generation search) through the work check, the rebuild and the
//! rest of the pipeline under a small memory budget. See `scale_case.rs`
//! for the input layout and the invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../scale_case.rs"]
mod scale_case;

fuzz_target!(|data: &[u8]| {
    if let Some(case) = scale_case::decode(data) {
        scale_case::run(&case);
    }
});
