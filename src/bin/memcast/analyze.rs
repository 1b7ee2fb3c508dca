//! `memcast analyze TRACE [--json]`: read a trace and describe what the
//! analyzer found.

use std::path::PathBuf;

use anyhow::Context;
use memcast::analyzer::{self, AnalysisSummary, AnalyzerConfig, ZeroGradPlacement};
use memcast::trace;
use memcast::{Bytes, Nanos};

#[derive(Debug, clap::Args)]
pub struct AnalyzeArgs {
    /// The trace written by `prof.export_chrome_trace` (`.json` or `.json.gz`).
    trace: PathBuf,
    /// Print machine-readable JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn ms(ns: Nanos) -> String {
    let ns = ns.get();
    format!("{}.{:03} ms", ns / 1_000_000, (ns % 1_000_000).abs() / 1000)
}

fn mib(bytes: Bytes) -> String {
    format!("{} B ({})", bytes.get(), memcast::present::mib(bytes))
}

/// Prints the summary as text: iterations with their phases, blocks, roles,
/// optimizer, zero_grad, bytes by phase, top layers and warnings.
fn print_text(s: &AnalysisSummary) {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "iterations: {}", s.iterations);
    for (i, it) in s.iteration_details.iter().enumerate() {
        let label = it.label.as_deref().unwrap_or("(inferred)");
        let _ = writeln!(
            out,
            "  #{i} {label}: {} .. {}, {} micro-batch(es), {} allocs, {} frees, peak {}",
            ms(it.start_ns),
            ms(it.end_ns),
            it.micro_batches,
            it.n_allocs,
            it.n_frees,
            mib(it.peak_bytes)
        );
        for p in &it.phases {
            let _ = writeln!(
                out,
                "      {:<15} {} .. {} ({})",
                p.phase,
                ms(p.start_ns),
                ms(p.end_ns),
                ms(p.end_ns.saturating_sub(p.start_ns))
            );
        }
    }
    let _ = writeln!(
        out,
        "blocks: {} ({} persistent, {} operator-internal, {} CPU-kernel scratch); frees of pre-profiling memory: {}",
        s.blocks,
        s.persistent_blocks,
        s.roles.op_internal_blocks,
        s.roles.cpu_scratch_blocks,
        s.unmatched_frees
    );
    let _ = writeln!(
        out,
        "parameters: {} tensors, {}",
        s.parameters.count,
        mib(s.parameters.bytes)
    );
    let _ = writeln!(
        out,
        "gradients: {} blocks, {}; optimizer state: {} blocks, {}; batches: {} blocks, {}",
        s.roles.gradient_blocks,
        mib(s.roles.gradient_bytes),
        s.roles.optimizer_state_blocks,
        mib(s.roles.optimizer_state_bytes),
        s.roles.batch_blocks,
        mib(s.roles.batch_bytes)
    );
    let _ = writeln!(
        out,
        "optimizer: {} ({} steps, foreach: {}, torch.optim: {})",
        s.optimizer.class_name.as_deref().unwrap_or("none found"),
        s.optimizer.n_steps,
        s.optimizer.uses_foreach,
        s.optimizer
            .torch_optim
            .map_or("unknown".to_owned(), |b| b.to_string())
    );
    let _ = writeln!(
        out,
        "zero_grad: {} calls, placement {}, set_to_none {}",
        s.zero_grad.n_calls,
        match s.zero_grad.placement {
            Some(ZeroGradPlacement::BeforeForward) => "pos1 (before forward)",
            Some(ZeroGradPlacement::BeforeBackward) => "pos0 (between forward and backward)",
            Some(ZeroGradPlacement::Elsewhere) => "after backward or unclear",
            None => "unknown",
        },
        s.zero_grad
            .set_to_none
            .map_or("unknown".to_owned(), |b| b.to_string())
    );
    let _ = writeln!(out, "device: recorded on CUDA: {}", s.recorded_on_cuda);
    let _ = writeln!(out, "allocated bytes by phase:");
    for p in &s.allocated_by_phase {
        let _ = writeln!(out, "  {:<15} {}", p.phase, mib(p.bytes));
    }
    let _ = writeln!(
        out,
        "peak of the trace's own allocations: {}",
        mib(s.peak_bytes)
    );
    let _ = writeln!(out, "top layers by live bytes at the peak:");
    for l in &s.top_layers {
        let _ = writeln!(
            out,
            "  {:>12} B  {:>5} blocks  {}",
            l.bytes, l.blocks, l.layer
        );
    }
    let _ = writeln!(out, "warnings: {}", s.warnings.len());
    for w in &s.warnings {
        let _ = writeln!(out, "  [{}] {}", w.code, w.message);
    }
    crate::write_stdout(&out);
}

pub fn run(args: &AnalyzeArgs) -> anyhow::Result<()> {
    let mut source = crate::source::FileSource::open(&args.trace)?;
    let parsed = trace::read(&mut source, &mut |_, _| {})
        .with_context(|| format!("cannot read the trace {:?}", args.trace))?;
    let analyzed = analyzer::analyze(&parsed.value, &AnalyzerConfig::standard())
        .with_context(|| format!("cannot analyze the trace {:?}", args.trace))?;
    let mut warnings = parsed.warnings;
    warnings.extend(analyzed.warnings);
    let summary = analyzer::summarize(&analyzed.value, warnings);
    if args.json {
        let mut text = serde_json::to_string_pretty(&summary)?;
        text.push('\n');
        crate::write_stdout(&text);
    } else {
        print_text(&summary);
    }
    Ok(())
}
