//! The permalink decoder on arbitrary fragments (raw, and behind the `#e=v1.`
//! and `#e=v2.` prefixes so the base64/deflate/JSON layers are reached); a
//! decoded value must encode and decode to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for fragment in [text.to_owned(), format!("#e=v1.{text}"), format!("#e=v2.{text}")] {
        if let Ok(shared) = memcast::permalink::decode(&fragment) {
            let again = memcast::permalink::decode(&memcast::permalink::encode(&shared));
            assert_eq!(again.as_ref(), Ok(&shared), "permalink does not round-trip");
        }
    }
});
