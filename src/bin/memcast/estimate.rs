//! `memcast estimate`: the peak GPU memory of a training job from its CPU
//! trace, and whether it fits on each GPU.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use memcast::orchestrator::OptimizerPath;
use memcast::report::Report;
use memcast::Bytes;

use crate::presets::gib;

/// Options of `memcast estimate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace written by `prof.export_chrome_trace` (`.json` or `.json.gz`).
    trace: PathBuf,
    /// A GPU preset (see `memcast presets`) or a capacity such as 24GiB,
    /// 80000MiB or 12884377600; repeat for several. The first one's overheads
    /// are used for the headline peak. Default: every preset, with the
    /// a100-80gb overheads for the headline.
    #[arg(long = "gpu", value_name = "NAME|SIZE")]
    gpus: Vec<String>,
    /// A `PYTORCH_CUDA_ALLOC_CONF` string, e.g. `expandable_segments:True`.
    #[arg(long, value_name = "STR", default_value = "")]
    alloc_conf: String,
    /// CUDA context size to assume on every GPU instead of the sourced
    /// per-architecture figure (e.g. 1GiB, as measured with
    /// `nvidia-smi used − torch.cuda.memory_reserved()` after one step).
    #[arg(long, value_name = "SIZE")]
    context: Option<String>,
    /// Training iterations to simulate.
    #[arg(long, value_name = "N", default_value_t = 3)]
    iterations: u32,
    /// Simulate the optimizer step as captured instead of CUDA's default
    /// `foreach` implementation.
    #[arg(long)]
    captured_optimizer: bool,
    /// Print the report as JSON (schema `memcast.estimate/1`).
    #[arg(long)]
    json: bool,
}

/// Runs the estimate and prints it.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let mut source = crate::source::FileSource::open(&args.trace)?;
    let mut config = crate::config_for(&args.gpus)?;
    if let Some(context) = &args.context {
        let bytes = if context.trim() == "0" {
            Bytes::ZERO
        } else {
            memcast::presets::parse_size(context).context("invalid --context")?
        };
        config = config.with_context(bytes);
    }
    config.alloc_conf = args.alloc_conf.clone();
    config.orchestrator.iterations = args.iterations;
    if args.captured_optimizer {
        config.orchestrator.optimizer_path = OptimizerPath::Captured;
    }
    let mut report = memcast::run_from(&mut source, &config, &mut |_| {}, &crate::source::Threads)
        .with_context(|| format!("failed to estimate {:?}", args.trace))?
        .value;
    crate::terms::report(&mut report);
    let mut out = String::new();
    if args.json {
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&report)?);
    } else {
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

/// Prints the estimate as tables: the peak, the summary, the breakdown at
/// the peak, the verdict per GPU, the top layers and the warnings.
fn print_table(out: &mut String, report: &Report) {
    let peak = &report.peak;
    let summary = &report.summary;
    let _ = writeln!(
        out,
        "memcast estimate — {} iterations simulated ({} captured), optimizer {}{}, reference GPU {}",
        summary.iterations_simulated,
        summary.iterations_captured,
        summary.optimizer.as_deref().unwrap_or("unknown"),
        if summary.foreach_modelled { " (foreach)" } else { "" },
        report.reference_gpu,
    );
    let recipe = &summary.recipe;
    let mut structure: Vec<String> = Vec::new();
    if let Some(k) = recipe.micro_batches_per_step {
        structure.push(format!("{k} micro-batch(es) per optimizer step"));
    }
    if recipe.checkpointing.is_some() {
        structure.push("activation checkpointing".to_owned());
    }
    if recipe.clip_calls > 0 {
        structure.push("gradient clipping".to_owned());
    }
    if recipe.compiled {
        structure.push("torch.compile".to_owned());
    }
    if let Some(d) = &recipe.distributed {
        structure.push(format!(
            "one rank of {} ({})",
            d.world_size
                .map_or_else(|| "several".to_owned(), |w| w.to_string()),
            d.backend.as_deref().unwrap_or("unknown backend")
        ));
    }
    structure.push(format!("loop: {}", recipe.training_loop.label()));
    let _ = writeln!(out, "run: {}", structure.join(", "));
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
        "  {:<17} {:>10} {:>16}  {:<4} {:>16}",
        "preset", "GiB", "capacity B", "fits", "headroom B"
    );
    for gpu in &report.gpus {
        let margin = match (gpu.headroom_bytes, gpu.shortfall_bytes) {
            (Some(headroom), _) => format!("+{}", headroom.get()),
            (None, Some(shortfall)) => format!("-{}", shortfall.get()),
            (None, None) => "-".to_owned(),
        };
        let _ = writeln!(
            out,
            "  {:<17} {:>10} {:>16}  {:<4} {:>16}",
            gpu.preset,
            gib(gpu.capacity_bytes),
            gpu.capacity_bytes.get(),
            if gpu.fits { "yes" } else { "NO" },
            margin
        );
    }
    if !report.warnings.is_empty() {
        let _ = writeln!(out, "warnings");
        for warning in &report.warnings {
            let _ = writeln!(out, "  [{}] {}", warning.code, warning.message);
        }
    }
}
