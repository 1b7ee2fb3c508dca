//! The trace reader's gzip path: the fuzzed bytes are compressed first, so
//! the decoder always sees a valid stream and the JSON behind it is fuzzed;
//! the result must equal parsing the same bytes uncompressed.
#![no_main]

use std::io::Write as _;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    if encoder.write_all(data).is_err() {
        return;
    }
    let Ok(gz) = encoder.finish() else {
        return;
    };
    let from_gzip = memcast::trace::parse(&gz);
    // Plain bytes that happen to start with the gzip magic take the other path.
    if !data.starts_with(&[0x1f, 0x8b]) {
        let plain = memcast::trace::parse(data);
        assert_eq!(from_gzip, plain, "gzip and plain parse differ");
    }
});
