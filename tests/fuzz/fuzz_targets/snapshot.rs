//! The replay reader on arbitrary bytes: the snapshot pickle reader (when the
//! bytes start with a pickle protocol opcode) and the GPU profiler-trace
//! replay otherwise. No input may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memcast::replay::replay_snapshot(data);
    let _ = memcast::replay::replay(data);
});
