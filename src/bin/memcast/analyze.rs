//! `memcast analyze TRACE [--json]`: read a trace and describe what the
//! analyzer found.

use std::path::PathBuf;

use anyhow::Context;
use memcast::analyzer::{self, Analysis, AnalyzerConfig, BlockRole, Phase, ZeroGradPlacement};
use memcast::{trace, Warning};
use serde::Serialize;

/// The version tag of the `--json` output.
const SCHEMA: &str = "memcast.analyze/1";

/// How many layers the text and JSON outputs list.
const TOP_LAYERS: usize = 10;

#[derive(Debug, clap::Args)]
pub struct AnalyzeArgs {
    /// The trace written by `prof.export_chrome_trace` (`.json` or `.json.gz`).
    trace: PathBuf,
    /// Print machine-readable JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Summary {
    schema: &'static str,
    iterations: usize,
    blocks: usize,
    persistent_blocks: usize,
    unmatched_frees: usize,
    parameters: Parameters,
    recorded_on_cuda: bool,
    peak_bytes: u64,
    allocated_by_phase: Vec<PhaseBytes>,
    iteration_details: Vec<IterationSummary>,
    zero_grad: analyzer::ZeroGradFacts,
    optimizer: analyzer::OptimizerFacts,
    roles: Roles,
    top_layers: Vec<LayerSummary>,
    warnings: Vec<Warning>,
}

#[derive(Debug, Serialize)]
struct Parameters {
    count: usize,
    bytes: u64,
}

#[derive(Debug, Serialize)]
struct PhaseBytes {
    phase: &'static str,
    bytes: u64,
}

#[derive(Debug, Serialize)]
struct PhaseTime {
    phase: &'static str,
    start_ns: i64,
    end_ns: i64,
}

#[derive(Debug, Serialize)]
struct IterationSummary {
    label: Option<String>,
    start_ns: i64,
    end_ns: i64,
    n_allocs: usize,
    n_frees: usize,
    peak_bytes: u64,
    phases: Vec<PhaseTime>,
    allocated_by_phase: Vec<PhaseBytes>,
}

#[derive(Debug, Serialize, Default)]
struct Roles {
    gradient_blocks: usize,
    gradient_bytes: u64,
    optimizer_state_blocks: usize,
    optimizer_state_bytes: u64,
    batch_blocks: usize,
    batch_bytes: u64,
    op_internal_blocks: usize,
    cpu_scratch_blocks: usize,
}

#[derive(Debug, Serialize)]
struct LayerSummary {
    layer: String,
    bytes: u64,
    blocks: usize,
}

fn phase_bytes(map: &std::collections::BTreeMap<Phase, memcast::Bytes>) -> Vec<PhaseBytes> {
    map.iter()
        .map(|(phase, bytes)| PhaseBytes {
            phase: phase.label(),
            bytes: bytes.get(),
        })
        .collect()
}

fn summarize(analysis: &Analysis, warnings: Vec<Warning>) -> Summary {
    let mut roles = Roles::default();
    for block in &analysis.blocks {
        let size = block.size.get();
        match block.role {
            BlockRole::Gradient { .. } => {
                roles.gradient_blocks += 1;
                roles.gradient_bytes += size;
            }
            BlockRole::OptimizerState => {
                roles.optimizer_state_blocks += 1;
                roles.optimizer_state_bytes += size;
            }
            BlockRole::Batch => {
                roles.batch_blocks += 1;
                roles.batch_bytes += size;
            }
            BlockRole::Other => {}
        }
        roles.op_internal_blocks += usize::from(block.op_internal);
        roles.cpu_scratch_blocks += usize::from(block.cpu_scratch);
    }
    Summary {
        schema: SCHEMA,
        iterations: analysis.iterations.len(),
        blocks: analysis.blocks.len(),
        persistent_blocks: analysis.persistent_blocks().count(),
        unmatched_frees: analysis.unmatched_frees.len(),
        parameters: Parameters {
            count: analysis.parameter_totals.count,
            bytes: analysis.parameter_totals.bytes.get(),
        },
        recorded_on_cuda: analysis.devices.recorded_on_cuda,
        peak_bytes: analysis.peak.bytes.get(),
        allocated_by_phase: phase_bytes(&analysis.allocated_by_phase()),
        iteration_details: analysis
            .iterations
            .iter()
            .map(|it| IterationSummary {
                label: it.label.clone(),
                start_ns: it.start.get(),
                end_ns: it.end.get(),
                n_allocs: it.n_allocs,
                n_frees: it.n_frees,
                peak_bytes: it.peak.get(),
                phases: it
                    .phases
                    .iter()
                    .map(|p| PhaseTime {
                        phase: p.phase.label(),
                        start_ns: p.start.get(),
                        end_ns: p.end.get(),
                    })
                    .collect(),
                allocated_by_phase: phase_bytes(&it.allocated_by_phase),
            })
            .collect(),
        zero_grad: analysis.zero_grad.clone(),
        optimizer: analysis.optimizer.clone(),
        roles,
        top_layers: analysis
            .layers_at_peak
            .iter()
            .take(TOP_LAYERS)
            .map(|l| LayerSummary {
                layer: l
                    .layer
                    .map_or("(no layer)".to_owned(), |id| analysis.name(id).to_owned()),
                bytes: l.bytes.get(),
                blocks: l.n_blocks,
            })
            .collect(),
        warnings,
    }
}

fn ms(ns: i64) -> String {
    format!("{}.{:03} ms", ns / 1_000_000, (ns % 1_000_000).abs() / 1000)
}

fn mib(bytes: u64) -> String {
    format!(
        "{bytes} B ({}.{:02} MiB)",
        bytes >> 20,
        ((bytes % (1 << 20)) * 100) >> 20
    )
}

fn print_text(s: &Summary) {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "iterations: {}", s.iterations);
    for (i, it) in s.iteration_details.iter().enumerate() {
        let label = it.label.as_deref().unwrap_or("(inferred)");
        let _ = writeln!(
            out,
            "  #{i} {label}: {} .. {}, {} allocs, {} frees, peak {}",
            ms(it.start_ns),
            ms(it.end_ns),
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
                ms(p.end_ns - p.start_ns)
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
    let summary = summarize(&analyzed.value, warnings);
    if args.json {
        let mut text = serde_json::to_string_pretty(&summary)?;
        text.push('\n');
        crate::write_stdout(&text);
    } else {
        print_text(&summary);
    }
    Ok(())
}
