//! A generation rebuilt to a longer length is streamed to the simulator as
//! a program derived from four short rebuilds (issue 33, item 1): on every
//! generation fixture, at another depth too, its report is the report of
//! the job built whole as a trace, byte for byte, on every GPU preset.

use memcast::scale;
use memcast::{Config, Settings};

use crate::common::read_shared;

/// The generation fixtures (under `shared/`, or in this repository's
/// `tests/data/traces-llm`), each at the depth asked for (`None`: as traced).
const CASES: &[(&str, Option<u32>)] = &[
    ("fixtures/traces-llm/llama_gen16_dynamic.json.gz", None),
    ("fixtures/traces-llm/distilgpt2_gen8.json.gz", Some(3)),
    ("fixtures/traces-llm/mixtral_gen8.json.gz", None),
    ("llama_gen4_nf4.json.gz", None),
    ("llama_gen8_b2_p16.json.gz", Some(3)),
];

fn parse(bytes: &[u8]) -> memcast::trace::Trace {
    memcast::trace::parse(bytes).unwrap().value
}

/// The report's JSON, and whether the job was streamed as a program.
fn report(trace: &memcast::trace::Trace, config: &Config) -> (String, bool) {
    let prepared =
        memcast::prepare_parsed(std::slice::from_ref(trace), Vec::new(), config, &mut |_| {})
            .unwrap();
    let report = memcast::pipeline::estimate(&prepared, config, &mut |_| {})
        .unwrap()
        .value;
    (
        serde_json::to_string_pretty(&report).unwrap(),
        prepared.program.is_some(),
    )
}

#[test]
fn a_streamed_generation_reports_what_the_job_built_whole_reports() {
    for &(name, layers) in CASES {
        let bytes = if name.starts_with("fixtures/") {
            read_shared(name)
        } else {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/traces-llm")
                .join(name);
            std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"))
        };
        let trace = parse(&bytes);
        let traced = scale::traced_new_tokens(&trace)
            .unwrap_or_else(|| panic!("{name}: no generation found"));
        // Long enough that building it whole is the larger work.
        let settings = Settings {
            layers,
            new_tokens: Some(4 * traced + 64),
            ..Settings::default()
        };
        let mut config = settings.config().unwrap();
        let (streamed, was_streamed) = report(&trace, &config);
        assert!(was_streamed, "{name} {layers:?}: not streamed");
        config.materialize = true;
        let (whole, was) = report(&trace, &config);
        assert!(!was);
        assert!(
            streamed == whole,
            "{name} {layers:?}: the streamed report differs from the whole job's"
        );
    }
}

/// A search over lengths derives the generation once and makes each length
/// from it: the same report as the pipeline gives for that length.
#[test]
fn a_generation_derived_once_is_the_job_at_every_length() {
    let trace = parse(&read_shared("fixtures/traces-llm/distilgpt2_gen8.json.gz"));
    let config = Settings {
        layers: Some(3),
        ..Settings::default()
    }
    .config()
    .unwrap();
    let job = memcast::pipeline::GenerationJob::derive(std::slice::from_ref(&trace), &config)
        .unwrap()
        .expect("the generation derives");
    for n in [job.first_tokens(), 40, 97] {
        let mut at = config.clone();
        at.scale.new_tokens = Some(n);
        at.materialize = true;
        let (whole, _) = report(&trace, &at);
        let prepared = job.prepared(n).unwrap();
        let derived = memcast::pipeline::estimate(&prepared, &at, &mut |_| {})
            .unwrap()
            .value;
        assert!(
            serde_json::to_string_pretty(&derived).unwrap() == whole,
            "{n} new tokens: the derived job's report differs from the whole job's"
        );
    }
}
