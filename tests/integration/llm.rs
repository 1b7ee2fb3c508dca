//! LLM jobs (issue 26) over `shared/fixtures/traces-llm`: a `generate()`
//! run and its KV cache, against the facts each sidecar records.

use memcast::analyzer::RunKind;
use memcast::orchestrator::Category;
use memcast::{Bytes, Config};

use crate::common;

fn meta_of(name: &str) -> serde_json::Value {
    let path = format!("fixtures/traces-llm/{name}.meta.json");
    serde_json::from_slice(&common::read_shared(&path)).unwrap()
}

fn prepared(name: &str) -> memcast::Prepared {
    let bytes = common::read_shared(&format!("fixtures/traces-llm/{name}.json.gz"));
    let trace = memcast::trace::parse(&bytes).unwrap().value;
    common::prepare_parsed(trace, &Config::standard())
}

/// Every generate trace is seen as one: its calls (prefill + decode
/// steps), its cache kind, and the KV cache at the end of the first
/// generation, positions and bytes per token exactly as the sidecar
/// measured them (2 · layers · kv heads · head dim · dtype bytes · batch,
/// grouped-query attention included); the run is inference, the cache its
/// own category in the schedule. A run that does not generate has none.
#[test]
fn a_generation_shows_its_kv_cache_exactly() {
    let mut checked = 0;
    for path in common::fixtures_in("traces-llm") {
        let name = path
            .rsplit('/')
            .next()
            .unwrap()
            .trim_end_matches(".json.gz")
            .to_owned();
        let meta = meta_of(&name);
        let p = prepared(&name);
        let Some(g) = meta["generate"].as_object() else {
            assert_eq!(p.generation, None, "{name}");
            assert_eq!(
                common::category_bytes(&p.orchestrated.schedule, Category::KvCache),
                Bytes::ZERO,
                "{name}"
            );
            continue;
        };
        let found = p.generation.as_ref().unwrap_or_else(|| panic!("{name}"));
        let calls = g["max_new_tokens"].as_u64().unwrap();
        assert_eq!(u64::from(found.calls), calls, "{name}");
        let cache = if g["cache"] == "static" {
            "static"
        } else {
            "dynamic"
        };
        assert_eq!(found.cache, cache, "{name}");
        assert_eq!(found.prompt_tokens, g["prompt_len"].as_u64(), "{name}");
        assert_eq!(
            found.positions,
            g["kv_cache_positions_at_end"].as_u64(),
            "{name}"
        );
        assert_eq!(
            found.kv_bytes_at_end.get(),
            g["kv_cache_bytes_measured_at_end"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            found.bytes_per_token.map(Bytes::get),
            g["kv_cache_bytes_per_token"].as_u64(),
            "{name}"
        );
        assert_eq!(p.run_kind, RunKind::Inference, "{name}");
        assert!(
            common::category_bytes(&p.orchestrated.schedule, Category::KvCache) > Bytes::ZERO,
            "{name}"
        );
        checked += 1;
    }
    assert!(checked >= 5, "{checked} generate traces");
}
