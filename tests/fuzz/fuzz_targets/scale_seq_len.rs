//! Trace small, run big on fuzzed traces, always asking for `--seq-len` (the
//! other two as the input's header says): see `scale_case.rs` for the input
//! layout and the invariants, and `scale.rs` for the target that leaves all
//! three to the header.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../scale_case.rs"]
mod scale_case;

fuzz_target!(|data: &[u8]| {
    if let Some(case) = scale_case::decode_forcing(data, scale_case::SEQ_LEN) {
        scale_case::run(&case);
    }
});
