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

/// The trace prepared (parsed already) with `config`.
fn prepared(trace: &memcast::trace::Trace, config: &Config) -> memcast::pipeline::Prepared {
    memcast::prepare_parsed(std::slice::from_ref(trace), Vec::new(), config, &mut |_| {}).unwrap()
}

/// The report's JSON, and whether the job was streamed as a program.
fn report(trace: &memcast::trace::Trace, config: &Config) -> (String, bool) {
    let prepared = prepared(trace, config);
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
    let job = memcast::pipeline::GenerationJob::derive(
        std::slice::from_ref(&trace),
        &config,
        &memcast::InTurn,
    )
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

/// Jobs asked for more blocks: (fixture, blocks per stack, new tokens).
const DEEP: &[(&str, u32, Option<u32>)] = &[
    (
        "fixtures/traces-depth/llama-small_adamw_bs4_seq128_L2.json.gz",
        24,
        None,
    ),
    (
        "fixtures/traces-depth/gpt2_nograd_bs4_seq128_L2.json.gz",
        48,
        None,
    ),
    (
        "fixtures/traces-depth/bert-base-cls_evalgrad_bs4_seq64_L2.json.gz",
        48,
        None,
    ),
    ("fixtures/traces-llm/llama_qlora_nf4.json.gz", 48, None),
    // Reentrant checkpointing does not grow block by block this way: built
    // whole, the same report.
    (
        "fixtures/traces-depth/llama-small_adamw_ckptre_bs4_seq64_L2.json.gz",
        24,
        None,
    ),
    ("fixtures/traces-llm/llama_gen16_dynamic.json.gz", 48, None),
    ("fixtures/traces-llm/mixtral_gen8.json.gz", 48, None),
    // A long generation at that depth: each step's job made in depth.
    (
        "fixtures/traces-llm/llama_gen16_dynamic.json.gz",
        12,
        Some(80),
    ),
    ("fixtures/traces-llm/distilgpt2_gen8.json.gz", 12, Some(48)),
];

/// A job asked for more blocks is derived in depth from four rebuilds of a
/// few blocks (and a long generation at that depth from four steps' jobs
/// made so): its report is the report of the job built whole, byte for
/// byte, on every GPU preset; and the jobs whose blocks grow copy by copy
/// (training, forwards, LoRA, generation) are derived, not rebuilt.
fn derived_in_depth(cases: &[(&str, u32, Option<u32>)], must: &[(&str, Option<u32>)]) {
    let mut streamed_names = Vec::new();
    for &(name, layers, new_tokens) in cases {
        let trace = parse(&read_shared(name));
        let settings = Settings {
            layers: Some(layers),
            new_tokens,
            ..Settings::default()
        };
        let mut config = settings.config().unwrap();
        let (streamed, was_streamed) = report(&trace, &config);
        config.materialize = true;
        let (whole, _) = report(&trace, &config);
        assert!(
            streamed == whole,
            "{name} at {layers} layers, {new_tokens:?} new tokens: the derived report differs from the whole job's"
        );
        if was_streamed {
            streamed_names.push((name, new_tokens));
        }
    }
    for must in must {
        assert!(
            streamed_names.contains(must),
            "{must:?} was not derived; derived: {streamed_names:?}"
        );
    }
}

#[test]
fn a_job_derived_in_depth_reports_what_the_job_built_whole_reports() {
    let (_, jobs): (Vec<_>, Vec<_>) = DEEP.iter().partition(|c| c.0.contains("_gen"));
    derived_in_depth(
        &jobs,
        &[
            (
                "fixtures/traces-depth/llama-small_adamw_bs4_seq128_L2.json.gz",
                None,
            ),
            (
                "fixtures/traces-depth/gpt2_nograd_bs4_seq128_L2.json.gz",
                None,
            ),
            (
                "fixtures/traces-depth/bert-base-cls_evalgrad_bs4_seq64_L2.json.gz",
                None,
            ),
            ("fixtures/traces-llm/llama_qlora_nf4.json.gz", None),
        ],
    );
}

#[test]
fn a_generation_derived_in_depth_reports_what_the_job_built_whole_reports() {
    let (generations, _): (Vec<_>, Vec<_>) = DEEP.iter().partition(|c| c.0.contains("_gen"));
    derived_in_depth(
        &generations,
        &[
            ("fixtures/traces-llm/llama_gen16_dynamic.json.gz", None),
            ("fixtures/traces-llm/llama_gen16_dynamic.json.gz", Some(80)),
        ],
    );
}

/// Every what-if on a job derived in depth (held whole for it) answers as
/// on the job built whole; the mixed-precision one too, whose job is
/// derived beside the estimate's.
#[test]
fn what_ifs_on_a_job_derived_in_depth_answer_as_on_the_job_built_whole() {
    use memcast::whatif::{run, WhatIfKind};
    let trace = parse(&read_shared(
        "fixtures/traces-depth/llama-small_adamw_bs4_seq128_L2.json.gz",
    ));
    let mut config = Settings {
        layers: Some(24),
        ..Settings::default()
    }
    .config()
    .unwrap();
    config.orchestrator.autocast.what_if = true;
    let prepare = |config: &Config| prepared(&trace, config);
    let streamed = prepare(&config);
    assert!(streamed.program.is_some(), "not derived in depth");
    let mut whole_config = config.clone();
    whole_config.materialize = true;
    let whole = prepare(&whole_config);
    assert!(whole.program.is_none());
    for what in [
        WhatIfKind::Alloc,
        WhatIfKind::ZeroGrad,
        WhatIfKind::Distributed { world_size: 2 },
        WhatIfKind::Precision,
    ] {
        let answer = |prepared| match run(prepared, what, &config) {
            Ok(result) => result.to_json_pretty(),
            Err(err) => err.to_string(),
        };
        assert!(
            answer(&streamed) == answer(&whole),
            "{what:?}: the what-if on the derived job differs from the job built whole"
        );
    }
}

/// Runs a derivation's rebuilds each on a thread of its own, the last
/// first, and the simulations each on a thread of its own, started in
/// order (a GPU's run at capacity waits there for the run it parts from).
struct SideBySide;

impl memcast::Parallel for SideBySide {
    fn run_all<'a>(
        &self,
        jobs: Vec<memcast::SimulationJob<'a>>,
        simulated: &mut dyn FnMut(u64),
    ) -> Vec<memcast::report::SimulatedRun> {
        let events = std::sync::atomic::AtomicU64::new(0);
        let runs = std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|job| {
                    let events = &events;
                    scope.spawn(move || {
                        job(&mut |n| {
                            events.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().unwrap())
                .collect()
        });
        simulated(events.load(std::sync::atomic::Ordering::Relaxed));
        runs
    }

    fn run_tasks<'a>(&self, tasks: Vec<memcast::Task<'a>>, done: &mut dyn FnMut(usize)) {
        let n = tasks.len();
        std::thread::scope(|scope| {
            for task in tasks.into_iter().rev() {
                scope.spawn(task);
            }
        });
        done(n);
    }
}

/// A shell that runs none of the tasks it is given: the core runs them.
struct Idle;

impl memcast::Parallel for Idle {
    fn run_all<'a>(
        &self,
        jobs: Vec<memcast::SimulationJob<'a>>,
        simulated: &mut dyn FnMut(u64),
    ) -> Vec<memcast::report::SimulatedRun> {
        memcast::InTurn.run_all(jobs, simulated)
    }

    fn run_tasks<'a>(&self, _tasks: Vec<memcast::Task<'a>>, _done: &mut dyn FnMut(usize)) {}
}

#[test]
fn a_job_derived_from_rebuilds_run_side_by_side_is_the_job_derived_in_turn() {
    for (name, layers, new_tokens) in [
        (
            "fixtures/traces-llm/llama_gen16_dynamic.json.gz",
            16,
            Some(200),
        ),
        (
            "fixtures/traces-depth/llama-small_adamw_bs4_seq128_L2.json.gz",
            24,
            None,
        ),
    ] {
        let bytes = read_shared(name);
        let settings = Settings {
            layers: Some(layers),
            new_tokens,
            ..Settings::default()
        };
        let config = settings.config().unwrap();
        let prepared = |parallel: &dyn memcast::Parallel| {
            let mut source = memcast::trace::SliceSource::new(&bytes);
            let mut sources: Vec<&mut dyn memcast::trace::TraceSource> = vec![&mut source];
            let prepared =
                memcast::pipeline::prepare_many_with(&mut sources, &config, &mut |_| {}, parallel)
                    .unwrap();
            assert!(prepared.program.is_some(), "{name}: not derived");
            let report = memcast::pipeline::estimate(&prepared, &config, &mut |_| {})
                .unwrap()
                .value;
            serde_json::to_string(&report).unwrap()
        };
        let in_turn = prepared(&memcast::InTurn);
        assert!(
            prepared(&SideBySide) == in_turn,
            "{name}: the reports differ"
        );
        assert!(
            prepared(&Idle) == in_turn,
            "{name}: the tasks a shell did not run were not run"
        );
    }
}

/// GPUs the job outgrows, each run at capacity handed over by the
/// unlimited run on another thread as it parts (or, for a GPU it fits,
/// when it ends): the same report as the runs in turn.
#[test]
fn runs_at_capacity_handed_over_side_by_side_are_the_runs_in_turn() {
    let bytes = read_shared("fixtures/traces-llm/llama_gen16_dynamic.json.gz");
    let settings = Settings {
        new_tokens: Some(400),
        gpus: ["a100-80gb", "530MiB", "500MiB", "420MiB", "t4"]
            .map(String::from)
            .to_vec(),
        ..Settings::default()
    };
    let config = settings.config().unwrap();
    let prepared = memcast::pipeline::prepare(&bytes, &config, &mut |_| {}).unwrap();
    let in_turn = memcast::pipeline::estimate(&prepared, &config, &mut |_| {})
        .unwrap()
        .value;
    // The three capacities below its 536 MiB run out of memory, at
    // different events.
    let verdicts: Vec<(bool, u64)> = in_turn
        .gpus
        .iter()
        .map(|g| (g.fits, g.peak_total_bytes.get()))
        .collect();
    assert_eq!(
        verdicts.iter().map(|v| v.0).collect::<Vec<_>>(),
        [true, false, false, false, true],
        "{verdicts:?}"
    );
    let side_by_side =
        memcast::pipeline::estimate_with(&prepared, &config, &mut |_| {}, &SideBySide)
            .unwrap()
            .value;
    assert!(
        serde_json::to_string(&side_by_side).unwrap() == serde_json::to_string(&in_turn).unwrap(),
        "the reports differ"
    );
}

/// Generations long enough that the KV cache leaves the small pool: their
/// decode steps then repeat what the small pool did a step or two before,
/// and the simulation lets those steps' small events go by without the
/// allocator (`pipeline/cycles.rs`). The report is the job built whole's,
/// byte for byte: on GPUs it fits and on capacities around its peak (runs
/// at capacity parting from the unlimited run inside those steps, and
/// running out of memory), with allocator settings that keep the cycles
/// (`max_split_size_mb`) and that turn them off (garbage collection,
/// expandable segments).
#[test]
fn decode_steps_let_go_by_report_what_the_job_built_whole_reports() {
    let cases: &[(&str, Option<u32>, u32, &[&str])] = &[
        (
            "fixtures/traces-llm/llama_gen16_dynamic.json.gz",
            None,
            600,
            &[
                "",
                "max_split_size_mb:20",
                "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9",
                "expandable_segments:True",
            ],
        ),
        (
            "fixtures/traces-llm/llama_gen16_static.json.gz",
            None,
            200,
            &[""],
        ),
        (
            "fixtures/traces-llm/distilgpt2_gen8.json.gz",
            Some(3),
            450,
            &[""],
        ),
    ];
    for &(name, layers, new_tokens, alloc_confs) in cases {
        let trace = parse(&read_shared(name));
        let settings = Settings {
            layers,
            new_tokens: Some(new_tokens),
            gpus: vec!["a100-80gb".into()],
            ..Settings::default()
        };
        let mut config = settings.config().unwrap();
        let prepare = |config: &Config| prepared(&trace, config);
        let streamed = prepare(&config);
        assert!(streamed.program.is_some(), "{name}: not streamed");
        config.materialize = true;
        let whole = prepare(&config);
        let estimate = |prepared: &memcast::pipeline::Prepared, config: &Config| {
            memcast::pipeline::estimate(prepared, config, &mut |_| {})
                .unwrap()
                .value
        };
        let peak_mib = estimate(&streamed, &config).peak.reserved_bytes.get() >> 20;
        let mut gpus = vec!["a100-80gb".to_owned(), "t4".to_owned()];
        gpus.extend(
            [peak_mib / 2, peak_mib + 100, peak_mib + 300, peak_mib + 500]
                .iter()
                .map(|m| format!("{m}MiB")),
        );
        for alloc_conf in alloc_confs {
            let settings = Settings {
                gpus: gpus.clone(),
                alloc_conf: (*alloc_conf).to_owned(),
                ..settings.clone()
            };
            let config = settings.config().unwrap();
            let json = |p| serde_json::to_string_pretty(&estimate(p, &config)).unwrap();
            assert!(
                json(&streamed) == json(&whole),
                "{name} {layers:?} at {new_tokens} new tokens, {alloc_conf:?}: the streamed report differs from the whole job's"
            );
        }
    }
}

/// A run at capacity that runs out in the first call's decode steps keeps
/// checkpoints along them, and the run of a shorter generation on that GPU
/// taken up from the last one is the run `at_capacity` gives it from the
/// first event: the same verdict, peak and event it runs out at (or not),
/// for every length whose steps reach the checkpoint; a length whose steps
/// end before it is not taken up.
#[test]
fn a_run_taken_up_from_a_longer_runs_checkpoint_is_the_run_from_the_start() {
    use memcast::pipeline::{at_capacity, at_capacity_from, at_capacity_keeping};
    let trace = parse(&read_shared(
        "fixtures/traces-llm/llama_gen16_dynamic.json.gz",
    ));
    let settings = Settings {
        gpus: vec!["533MiB".to_owned()],
        ..Settings::default()
    };
    let at = |n: u32| {
        let mut config = settings.config().unwrap();
        config.scale.new_tokens = Some(n);
        config
    };
    let long = 512;
    let config = at(long);
    let runs = at_capacity_keeping(
        &prepared(&trace, &config),
        &config,
        &mut |_| {},
        &memcast::InTurn,
        true,
    )
    .unwrap();
    let (run, resume) = runs.into_iter().next().unwrap();
    assert!(
        !run.at.fits,
        "the 533 MiB GPU runs out before {long} new tokens"
    );
    let resume = resume.expect("a checkpoint along the first call's steps");
    let ran_out = run.ran_out_at.unwrap();
    assert!(resume.at() < ran_out);
    let mut taken_up = 0;
    for n in (16..long).rev().step_by(29) {
        let config = at(n);
        let p = prepared(&trace, &config);
        let fresh = at_capacity(&p, &config, &mut |_| {}, &memcast::InTurn).unwrap()[0];
        match at_capacity_from(&p, &config.gpus[0], &resume) {
            Some((run, _)) => {
                assert_eq!(run, fresh, "{n} new tokens");
                taken_up += 1;
            }
            None => assert!(
                p.job()
                    .first_steps_fixed()
                    .is_none_or(|r| r.start + r.copies * r.events < resume.at()),
                "{n} new tokens: not taken up although its steps reach the checkpoint"
            ),
        }
    }
    assert!(taken_up > 0);
}
