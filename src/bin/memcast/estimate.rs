//! `memcast estimate`: the peak GPU memory of a PyTorch job from its CPU
//! trace, and whether it fits on each GPU.

use std::fmt::Write as _;
use std::path::PathBuf;

use memcast::report::Report;
use memcast::Bytes;

use crate::settings::{LinkArgs, SettingsArgs};
use memcast::present::gib_number as gib;

/// Options of `memcast estimate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace written by `prof.export_chrome_trace` (`.json` or
    /// `.json.gz`); or two or three traces of one job at different sequence
    /// lengths, with `--seq-len`.
    #[arg(required = true, num_args = 1..=3)]
    traces: Vec<PathBuf>,
    #[command(flatten)]
    settings: SettingsArgs,
    /// Print the report as JSON (schema `memcast.estimate/1`).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    link: LinkArgs,
}

/// Runs the estimate and prints it.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let settings = args.settings.settings();
    let config = args.settings.config()?;
    let estimate = || crate::source::estimate_files(&args.traces, &config);
    let mut out = String::new();
    if let Some(base) = &args.link.link {
        // The page fingerprints the file while it estimates; so does this.
        let (report, trace) = std::thread::scope(|scope| {
            let trace = scope.spawn(|| crate::settings::identify_all(&args.traces));
            let report = estimate();
            (report, trace.join())
        });
        let trace = trace.map_err(|_| anyhow::anyhow!("the fingerprinting thread stopped"))??;
        out = crate::settings::link_line(base, trace, settings, &report?, None);
    } else if args.json {
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&estimate()?)?);
    } else {
        // The table names the flags that give what a warning asks for; the
        // JSON keeps the core's words and the setting, as the page does.
        let mut report = estimate()?;
        crate::terms::report(&mut report);
        print_table(&mut out, &report);
    }
    crate::write_stdout(&out);
    Ok(())
}

fn row(out: &mut String, label: &str, bytes: Bytes) {
    let _ = writeln!(
        out,
        "  {label:<24} {:>10} GiB {:>16} B",
        gib(bytes),
        bytes.get()
    );
}

fn print_table(out: &mut String, report: &Report) {
    let peak = &report.peak;
    let summary = &report.summary;
    let _ = writeln!(
        out,
        "memcast estimate — {}",
        memcast::present::run_line(report)
    );
    let _ = writeln!(out, "run: {}", memcast::present::recipe_line(summary));
    if let Some(capture) = &summary.capture {
        let _ = writeln!(
            out,
            "captured: {}",
            memcast::present::captured(capture, &summary.scaled)
        );
    }
    let _ = writeln!(out, "model: {}", memcast::present::model_line(summary));
    let _ = writeln!(out, "peak");
    row(out, "total (reserved+context)", peak.total_bytes);
    row(out, "reserved", peak.reserved_bytes);
    row(out, "allocated", peak.allocated_bytes);
    row(out, "cuda context", peak.context_bytes);
    let at = &peak.at;
    let _ = writeln!(
        out,
        "  at iteration {}, {:?}, op {}, layer {}",
        at.iteration.map_or("setup".to_owned(), |i| i.to_string()),
        at.phase,
        at.op.as_deref().unwrap_or("-"),
        at.layer.as_deref().unwrap_or("-"),
    );
    let b = &report.breakdown_at_peak;
    let _ = writeln!(out, "breakdown at peak");
    for (label, bytes) in [
        ("parameters", b.parameters),
        ("buffers", b.buffers),
        ("gradients", b.gradients),
        ("optimizer state", b.optimizer_state),
        ("activations", b.activations),
        ("batch", b.batch),
        ("temporaries", b.temporaries),
        ("cached/fragmentation", b.cached),
        ("overheads", b.overheads),
    ] {
        row(out, label, bytes);
    }
    if !b.kv_cache.is_zero() {
        row(out, "KV cache", b.kv_cache);
    }
    if !b.quant_state.is_zero() {
        row(out, "quantisation state", b.quant_state);
    }
    if let Some(m) = &report.summary.moe {
        let _ = writeln!(
            out,
            "mixture of experts ({}): {} layers of {} experts{}, {} B of weights per expert per layer; {}",
            m.implementation,
            m.layers,
            m.experts,
            m.top_k.map(|k| format!(", top-{k}")).unwrap_or_default(),
            m.expert_parameter_bytes.get(),
            if m.routing_invariant {
                "memory does not depend on the routing".to_owned()
            } else {
                format!(
                    "the worst routing could add up to {} B",
                    m.worst_routing_extra_bytes.get()
                )
            }
        );
        for r in &m.routing {
            let rows: Vec<String> = r.tokens_per_expert.iter().map(u64::to_string).collect();
            let _ = writeln!(
                out,
                "  {}: {} tokens, rows per expert [{}]",
                r.layer,
                r.tokens.map_or_else(|| "?".to_owned(), |t| t.to_string()),
                rows.join(", ")
            );
        }
    }
    if let Some(g) = &report.summary.generation {
        let per_token = g
            .bytes_per_token
            .map_or_else(|| "unknown".to_owned(), |b| format!("{} B", b.get()));
        let live = |b: Option<memcast::Bytes>| {
            b.map_or_else(|| "-".to_owned(), |b| format!("{} B", b.get()))
        };
        let _ = writeln!(
            out,
            "generation: {} calls of the model (prefill + decode steps), {} KV cache, {} B at the end, {per_token} per token; live peak {} in the prefill, {} in the decode steps",
            g.calls,
            g.cache,
            g.kv_bytes_at_end.get(),
            live(g.prefill_peak_allocated_bytes),
            live(g.decode_peak_allocated_bytes)
        );
    }
    if !report.top_layers.is_empty() {
        let _ = writeln!(
            out,
            "{}",
            match report.top_layers_by {
                memcast::report::LayerKey::Layer => "top layers at peak",
                memcast::report::LayerKey::Op => "top operators at peak (no Python frames)",
            }
        );
        for layer in report.top_layers.iter().take(5) {
            let _ = writeln!(
                out,
                "  {:>10} GiB {:>16} B  {}",
                gib(layer.bytes),
                layer.bytes.get(),
                layer.layer
            );
        }
    }
    let _ = writeln!(out, "gpus");
    let _ = writeln!(
        out,
        "  {:<17} {:>10} {:>16}  {:<23} {:>16}",
        "preset", "GiB", "capacity B", "verdict", "headroom B"
    );
    for gpu in &report.gpus {
        let margin = match (gpu.headroom_bytes, gpu.shortfall_bytes) {
            (Some(headroom), _) => format!("+{}", headroom.get()),
            (None, Some(shortfall)) => format!("-{}", shortfall.get()),
            (None, None) => "-".to_owned(),
        };
        let verdict = if gpu.fits {
            gpu.margin.label()
        } else {
            "DOES NOT FIT"
        };
        let _ = writeln!(
            out,
            "  {:<17} {:>10} {:>16}  {:<23} {:>16}",
            gpu.preset,
            gib(gpu.capacity_bytes),
            gpu.capacity_bytes.get(),
            verdict,
            margin
        );
    }
    if let Some((sentence, _)) = memcast::present::target_verdict(report) {
        let _ = writeln!(out, "verdict: {sentence}");
    }
    if let Some(band) = &report.error_band {
        let _ = writeln!(out, "margin: {}", memcast::present::margin_note(band));
    }
    if !report.warnings.is_empty() {
        let _ = writeln!(out, "warnings");
        for warning in &report.warnings {
            let _ = writeln!(out, "  [{}] {}", warning.code, warning.message);
        }
    }
}
