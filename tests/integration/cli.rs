//! The `memcast estimate` and `memcast presets` commands, run as a real binary:
//! output formats, the JSON contract and error exits.

use std::process::{Command, Output};

use memcast::Config;

use crate::common;

const TRACE: &str = "fixtures/traces/resnet18_sgd_bs16_pos1.json.gz";

fn memcast(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memcast"))
        .args(args)
        .output()
        .expect("run memcast")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn estimate_json_has_the_versioned_contract_and_equals_the_library_report() {
    let path = common::shared_file(TRACE);
    let path = path.to_str().unwrap();
    let output = memcast(&[
        "estimate",
        path,
        "--gpu",
        "a100-80gb",
        "--gpu",
        "24GiB",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(json["schema"], "memcast.estimate/1");
    for key in ["reserved_bytes", "allocated_bytes", "total_bytes"] {
        assert!(json["peak"][key].as_u64().unwrap() > 0, "peak.{key}");
    }
    let breakdown = json["breakdown_at_peak"].as_object().unwrap();
    for key in [
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "batch",
        "temporaries",
        "cached",
        "overheads",
    ] {
        assert!(breakdown[key].is_u64(), "breakdown_at_peak.{key}");
    }
    let sum: u64 = breakdown.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(sum, json["peak"]["total_bytes"].as_u64().unwrap());
    let gpus = json["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0]["preset"], "a100-80gb");
    assert_eq!(gpus[0]["capacity_bytes"], 85_100_068_864u64);
    assert_eq!(gpus[1]["preset"], "24GiB");
    assert_eq!(gpus[1]["capacity_bytes"], 24u64 << 30);
    assert!(gpus.iter().all(|g| g["fits"].is_boolean()));

    // The CLI's JSON is exactly what the library returns (and what the
    // page shows): the warnings in the core's words, with their setting.
    let config =
        Config::for_gpus("a100-80gb", &["a100-80gb".to_owned(), "24GiB".to_owned()]).unwrap();
    let bytes = common::read_shared(TRACE);
    let report = memcast::run(&bytes, &config, &mut |_| {}).unwrap().value;
    assert_eq!(json, serde_json::to_value(&report).unwrap());
}

#[test]
fn estimate_table_shows_gib_and_exact_bytes() {
    let path = common::shared_file(TRACE);
    let output = memcast(&["estimate", path.to_str().unwrap(), "--gpu", "t4"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let json = memcast(&["estimate", path.to_str().unwrap(), "--gpu", "t4", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let total = json["peak"]["total_bytes"].as_u64().unwrap();
    assert!(text.contains(&format!("{total} B")), "{text}");
    assert!(text.contains("GiB"), "{text}");
    assert!(text.contains("t4"), "{text}");
    assert!(text.contains("15843721216"), "{text}");
}

#[test]
fn estimate_options_change_the_run() {
    let path = common::shared_file(TRACE);
    let path = path.to_str().unwrap();
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["estimate", path, "--gpu", "l4", "--json"];
        args.extend_from_slice(extra);
        let output = memcast(&args);
        assert!(output.status.success(), "{}", stderr(&output));
        serde_json::from_str(&stdout(&output)).unwrap()
    };
    let five = run(&["--iterations", "5"]);
    assert_eq!(five["summary"]["iterations_simulated"], 5);
    let conf = run(&["--alloc-conf", "expandable_segments:True"]);
    assert_eq!(conf["summary"]["alloc_conf"], "expandable_segments:True");
    let context = run(&["--context", "1GiB"]);
    assert_eq!(context["peak"]["context_bytes"], 1u64 << 30);
    assert_eq!(context["gpus"][0]["context_bytes"], 1u64 << 30);
    assert_eq!(
        context["peak"]["total_bytes"].as_u64().unwrap(),
        context["peak"]["reserved_bytes"].as_u64().unwrap() + (1 << 30)
    );
    let captured = run(&["--captured-optimizer"]);
    assert_eq!(captured["summary"]["foreach_modelled"], false);
}

#[test]
fn estimate_errors_exit_non_zero_with_advice() {
    let path = common::shared_file(TRACE);
    let path = path.to_str().unwrap();
    let unknown = memcast(&["estimate", path, "--gpu", "a100"]);
    assert!(!unknown.status.success());
    let message = stderr(&unknown);
    assert!(message.contains("unknown gpu"), "{message}");
    assert!(message.contains("memcast presets"), "{message}");
    assert!(message.contains("\"a100\""), "{message}");

    let missing = memcast(&["estimate", "no/such/trace.json.gz"]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("failed to read trace"),
        "{}",
        stderr(&missing)
    );

    let zero = memcast(&["estimate", path, "--iterations", "0"]);
    assert!(!zero.status.success());
    assert!(stderr(&zero).contains("--iterations"), "{}", stderr(&zero));

    let conf = memcast(&["estimate", path, "--alloc-conf", "max_split_size_mb"]);
    assert!(!conf.status.success());
    assert!(
        stderr(&conf).contains("max_split_size_mb"),
        "{}",
        stderr(&conf)
    );
}

#[test]
fn presets_lists_every_preset_with_exact_bytes() {
    let output = memcast(&["presets"]);
    assert!(output.status.success());
    let text = stdout(&output);
    for preset in memcast::presets::PRESETS {
        assert!(text.contains(preset.slug), "{}", preset.slug);
        assert!(
            text.contains(&preset.cuda_visible.get().to_string()),
            "{}",
            preset.slug
        );
    }
    let json = memcast(&["presets", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), memcast::presets::PRESETS.len());
    let h100 = rows.iter().find(|r| r["preset"] == "h100-80gb").unwrap();
    assert_eq!(h100["capacity_bytes"], 85_045_477_376u64);
    assert_eq!(h100["cublas_workspace_bytes"], 33_554_432u64);
}

/// A plain JSON trace past 32 MiB is read in two halves on two threads; a
/// gzip one by a reader thread that inflates while the main thread parses; the
/// simulations run on threads. None of it may change a byte of the report.
#[test]
fn threaded_reading_and_simulation_give_the_library_report() {
    let name = "fixtures/traces/t5-small_adamw_bs8_pos1.json.gz";
    let gz = common::read_shared(name);
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz.as_slice()), &mut plain)
        .unwrap();
    assert!(
        plain.len() > 32 << 20,
        "the fixture is too small to be split"
    );
    let dir = std::env::temp_dir().join(format!("memcast-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plain_path = dir.join("t5-small.json");
    std::fs::write(&plain_path, &plain).unwrap();

    // The CLI's default: the default target, then every other preset.
    let config = memcast::Settings::default().config().unwrap();
    let library = memcast::run(&gz, &config, &mut |_| {}).unwrap().value;
    let expected = serde_json::to_value(&library).unwrap();
    for path in [common::shared_file(name), plain_path.clone()] {
        let output = memcast(&["estimate", "--json", path.to_str().unwrap()]);
        assert!(output.status.success(), "{}", stderr(&output));
        let shown: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(shown, expected, "{path:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The permalink a command prints with `--link`, decoded.
fn link_of(args: &[&str]) -> (String, memcast::permalink::Shared) {
    let output = memcast(args);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "--link prints the link alone: {text:?}");
    let link = lines[0].to_owned();
    let shared = memcast::permalink::decode(&link).unwrap();
    (link, shared)
}

#[test]
fn estimate_link_carries_the_json_report_the_settings_and_the_file_identity() {
    let path = common::shared_file(TRACE);
    let path = path.to_str().unwrap();
    let settings = [
        "--gpu",
        "t4",
        "--gpu",
        "16000MiB",
        "--alloc-conf",
        "expandable_segments:True",
    ];
    let base = "https://example.test/tools/memcast/";
    let (link, shared) = link_of(&[&["estimate", path, "--link", base][..], &settings].concat());
    assert!(link.starts_with(&format!("{base}#e=v2.")), "{link}");
    // The same estimate as --json, its timeline downsampled as the page does.
    let json = memcast(&[&["estimate", "--json", path][..], &settings].concat());
    let report: memcast::report::Report = serde_json::from_slice(&json.stdout).unwrap();
    let identity = memcast::permalink::TraceIdentity::of(
        "resnet18_sgd_bs16_pos1.json.gz",
        &common::read_shared(TRACE),
    );
    let expected = memcast::permalink::Shared::new(
        identity,
        memcast::Settings {
            gpus: vec!["t4".into(), "16000MiB".into()],
            alloc_conf: "expandable_segments:True".into(),
            ..memcast::Settings::default()
        },
        &report,
    );
    assert_eq!(shared, expected);
    assert_eq!(link, memcast::permalink::link(base, &expected));
    // A base with a fragment of its own: the fragment is replaced.
    let (again, _) = link_of(
        &[
            &[
                "estimate",
                path,
                "--link",
                "https://example.test/tools/memcast/#old",
            ][..],
            &settings,
        ]
        .concat(),
    );
    assert_eq!(again, link);
}

#[test]
fn whatif_and_batch_links_carry_the_estimate_and_the_answer() {
    let path = common::shared_file(TRACE);
    let path = path.to_str().unwrap();
    let base = "https://example.test/memcast/";
    let (_, estimate) = link_of(&["estimate", path, "--gpu", "l4", "--link", base]);
    for command in [
        &["whatif", "alloc"][..],
        &["whatif", "zero-grad"],
        &["whatif", "plan"],
        &["whatif", "precision"],
        &["whatif", "distributed"],
        &["batch"],
    ] {
        let (_, shared) = link_of(&[command, &[path, "--gpu", "l4", "--link", base]].concat());
        assert_eq!(shared.report, estimate.report, "{command:?}");
        assert_eq!(shared.settings, estimate.settings, "{command:?}");
        let whatif = shared
            .whatif
            .unwrap_or_else(|| panic!("{command:?}: no what-if"));
        let json = memcast(&[command, &[path, "--gpu", "l4", "--json"]].concat());
        let printed: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        let carried: serde_json::Value = serde_json::from_str(&whatif.to_json_pretty()).unwrap();
        assert_eq!(carried, printed, "{command:?}");
    }
}

#[test]
fn without_gpus_the_default_target_comes_first_then_every_other_preset() {
    let path = common::shared_file(TRACE);
    let output = memcast(&["estimate", "--json", path.to_str().unwrap()]);
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let gpus: Vec<&str> = json["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["preset"].as_str().unwrap())
        .collect();
    assert_eq!(json["reference_gpu"], "a100-80gb");
    assert_eq!(gpus[0], "a100-80gb");
    assert_eq!(gpus.len(), memcast::presets::PRESETS.len());
    let mut rest: Vec<&str> = memcast::presets::PRESETS.iter().map(|p| p.slug).collect();
    rest.retain(|s| *s != "a100-80gb");
    assert_eq!(gpus[1..], rest[..]);
}

#[test]
fn links_refuse_what_the_page_cannot_show() {
    let path = common::shared_file(TRACE);
    let path = path.to_str().unwrap();
    let both = memcast(&[
        "estimate",
        path,
        "--json",
        "--link",
        "https://example.test/",
    ]);
    assert!(!both.status.success());
    assert!(stderr(&both).contains("--json"), "{}", stderr(&both));
    let two = memcast(&["batch", path, path, "--link", "https://example.test/"]);
    assert!(!two.status.success());
    assert!(stderr(&two).contains("one trace"), "{}", stderr(&two));
}

#[test]
fn estimate_takes_layers_a_length_and_several_traces_of_one_job() {
    let a = common::shared_file("fixtures/traces-depth/llama-small_adamw_bs4_seq32_L2.json.gz");
    let b = common::shared_file("fixtures/traces-depth/llama-small_adamw_bs4_seq64_L2.json.gz");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let args = [
        "estimate",
        a,
        b,
        "--layers",
        "3",
        "--seq-len",
        "128",
        "--gpu",
        "l4",
        "--json",
    ];
    let output = memcast(&args);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let scaled = &report["summary"]["scaled"];
    assert_eq!(scaled["depth"]["estimated"], 3);
    assert_eq!(scaled["length"]["traced"], serde_json::json!([32, 64]));
    assert_eq!(scaled["length"]["method"], "fit");
    assert_eq!(report["summary"]["traced"]["seq_len"], 32);
    // The link carries both settings and names both files.
    let mut link_args = args[..args.len() - 1].to_vec();
    link_args.extend(["--link", "https://example.org/memcast/"]);
    let output = memcast(&link_args);
    assert!(output.status.success(), "{}", stderr(&output));
    let link = stdout(&output);
    let fragment = link.trim().split_once('#').unwrap().1;
    let shared = memcast::permalink::decode(fragment).unwrap();
    assert_eq!(shared.settings.layers, Some(3));
    assert_eq!(shared.settings.seq_len, Some(128));
    assert_eq!(
        shared.trace.name,
        "llama-small_adamw_bs4_seq32_L2.json.gz + llama-small_adamw_bs4_seq64_L2.json.gz"
    );
    // Several traces without a length: the error names the flag.
    let output = memcast(&["estimate", a, b, "--json"]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("--seq-len"), "{}", stderr(&output));
}
