//! The `PYTORCH_CUDA_ALLOC_CONF` parser on arbitrary strings, for both rule
//! versions; a parsed config must print to a string that parses back to it,
//! and its rounding must never shrink a request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memcast::simulator::{AllocatorConfig, RuleVersion};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for version in [RuleVersion::Old, RuleVersion::Mid, RuleVersion::New] {
        let Ok(config) = AllocatorConfig::parse(text, version) else {
            continue;
        };
        let printed = config.to_conf_string();
        let again = AllocatorConfig::parse(&printed, version);
        assert_eq!(
            again.as_ref(),
            Ok(&config),
            "{text:?} printed as {printed:?}"
        );
        for request in [1_u64, 511, 512, 1 << 20, (1 << 20) + 1, 10 << 20, 3 << 30] {
            assert!(
                config.round_size(request) >= request,
                "{request} rounded down"
            );
        }
    }
});
