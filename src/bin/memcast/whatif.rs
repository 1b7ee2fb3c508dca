//! `memcast whatif`: what-if analyses of one trace (allocator settings,
//! zero_grad placement, planned allocation), each re-simulating the
//! orchestrated sequence.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use memcast::whatif::{alloc_settings, distributed, planned, precision, zero_grad, WhatIfResult};
use memcast::{Bytes, Config, Prepared};

use crate::settings::{LinkArgs, SettingsArgs};

/// The what-if to run.
#[derive(Debug, clap::Subcommand)]
pub enum WhatIf {
    /// The job under several PYTORCH_CUDA_ALLOC_CONF settings; names the best.
    Alloc {
        #[command(flatten)]
        common: Common,
        /// Another PYTORCH_CUDA_ALLOC_CONF string to compare; repeat for several.
        #[arg(long = "conf", value_name = "STR")]
        confs: Vec<String>,
    },
    /// zero_grad at the other placement (pos0/pos1) and with set_to_none=False.
    ZeroGrad {
        #[command(flatten)]
        common: Common,
    },
    /// An offline, lifetime-aware allocation plan vs PyTorch's caching allocator.
    Plan {
        #[command(flatten)]
        common: Common,
    },
    /// Per-GPU memory under DDP, ZeRO-1/2/3 (FSDP) and 1-D tensor parallel.
    Distributed {
        #[command(flatten)]
        common: Common,
        /// GPUs the job is spread over.
        #[arg(long, value_name = "N", default_value_t = 8)]
        world_size: u32,
        /// NCCL memory per GPU outside the caching allocator, in MiB.
        #[arg(long, value_name = "MIB", default_value_t = 1024)]
        nccl_mib: u64,
    },
    /// The fp32 job under bf16/fp16 autocast (an approximation; rules listed).
    Precision {
        #[command(flatten)]
        common: Common,
    },
    /// The longest generation (prompt + new tokens) each GPU fits, from a
    /// generate() trace: each length simulated with --new-tokens.
    Context {
        #[command(flatten)]
        common: Common,
        /// New tokens simulated at most; a GPU that still fits there gets
        /// its limit extrapolated (and says so).
        #[arg(long, value_name = "N", default_value_t = memcast::whatif::context::DEFAULT_BUDGET)]
        budget: u32,
    },
}

/// Options every what-if takes.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// The trace written by `prof.export_chrome_trace` (`.json` or `.json.gz`).
    trace: PathBuf,
    #[command(flatten)]
    settings: SettingsArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    link: LinkArgs,
}

impl Common {
    /// The settings' config, with the mixed-precision what-if's job prepared too.
    fn config(&self) -> anyhow::Result<Config> {
        let mut config = self.settings.config()?;
        config.orchestrator.autocast.what_if = true;
        Ok(config)
    }

    fn prepare(&self) -> anyhow::Result<(Prepared, Config)> {
        let config = self.config()?;
        let mut source = crate::source::FileSource::open(&self.trace)?;
        let prepared = memcast::prepare_from(&mut source, &config, &mut |_| {})
            .with_context(|| format!("failed to prepare {:?}", self.trace))?;
        Ok((prepared, config))
    }

    /// Prints the result: the permalink of the estimate with it (`--link`),
    /// its JSON (`--json`), or its table.
    fn print(
        &self,
        out: &mut String,
        prepared: &Prepared,
        config: &Config,
        result: WhatIfResult,
    ) -> anyhow::Result<()> {
        if let Some(base) = &self.link.link {
            let report = memcast::estimate(prepared, config, &mut |_| {})
                .with_context(|| format!("failed to estimate {:?}", self.trace))?
                .value;
            let trace = crate::settings::identify(&self.trace)?;
            let settings = self.settings.settings();
            *out = crate::settings::link_line(base, trace, settings, &report, Some(result));
        } else if self.json {
            let _ = writeln!(out, "{}", result.to_json_pretty());
        } else {
            match &result {
                WhatIfResult::Alloc(r) => print_alloc(out, r),
                WhatIfResult::ZeroGrad(r) => print_zero_grad(out, r),
                WhatIfResult::Plan(r) => print_plan(out, r),
                WhatIfResult::Distributed(r) => print_distributed(out, r),
                WhatIfResult::Precision(r) => print_precision(out, r),
                WhatIfResult::Context(r) => print_context(out, r),
                // `memcast batch` prints its own.
                WhatIfResult::Batch(_) => {}
            }
        }
        Ok(())
    }
}

/// Runs a what-if and prints it.
pub fn run(whatif: &WhatIf) -> anyhow::Result<()> {
    let mut out = String::new();
    match whatif {
        WhatIf::Alloc { common, confs } => {
            let (prepared, config) = common.prepare()?;
            let result = alloc_settings::compare(&prepared, &config, confs)
                .context("failed to compare allocator settings")?;
            common.print(&mut out, &prepared, &config, WhatIfResult::Alloc(result))?;
        }
        WhatIf::ZeroGrad { common } => {
            let (prepared, config) = common.prepare()?;
            let result = zero_grad::compare(&prepared, &config)
                .context("failed to compare zero_grad placements")?;
            common.print(&mut out, &prepared, &config, WhatIfResult::ZeroGrad(result))?;
        }
        WhatIf::Plan { common } => {
            let (prepared, config) = common.prepare()?;
            let result =
                planned::compare(&prepared, &config).context("failed to plan the allocation")?;
            common.print(&mut out, &prepared, &config, WhatIfResult::Plan(result))?;
        }
        WhatIf::Distributed {
            common,
            world_size,
            nccl_mib,
        } => {
            let (prepared, config) = common.prepare()?;
            let options = distributed::DistOptions {
                world_size: *world_size,
                nccl_bytes: Bytes(nccl_mib.saturating_mul(Bytes::MIB)),
            };
            let result = distributed::compare(&prepared, &config, options)
                .context("failed to model distributed training")?;
            common.print(
                &mut out,
                &prepared,
                &config,
                WhatIfResult::Distributed(result),
            )?;
        }
        WhatIf::Context { common, budget } => {
            // It estimates the job at other lengths: the trace is read once
            // and kept.
            let config = common.config()?;
            let mut source = crate::source::FileSource::open(&common.trace)?;
            let parsed = memcast::trace::read(&mut source, &mut |_, _| {})
                .with_context(|| format!("failed to read {:?}", common.trace))?;
            let traces = [parsed.value];
            let prepared = memcast::prepare_parsed(&traces, parsed.warnings, &config, &mut |_| {})
                .with_context(|| format!("failed to prepare {:?}", common.trace))?;
            let what = memcast::whatif::WhatIfKind::Context { budget: *budget };
            let result = memcast::whatif::run_on_traces(&prepared, &traces, what, &config)
                .with_context(|| {
                    format!(
                        "failed to find the longest generation of {:?}",
                        common.trace
                    )
                })?;
            common.print(&mut out, &prepared, &config, result)?;
        }
        WhatIf::Precision { common } => {
            let (prepared, config) = common.prepare()?;
            let result = precision::compare(&prepared, &config)
                .context("failed to model mixed precision")?;
            common.print(
                &mut out,
                &prepared,
                &config,
                WhatIfResult::Precision(result),
            )?;
        }
    }
    crate::write_stdout(&out);
    Ok(())
}

/// Bytes as MiB with one decimal.
pub(crate) fn mib(bytes: Bytes) -> String {
    let tenths =
        (u128::from(bytes.get()) * 10 + u128::from(Bytes::MIB) / 2) / u128::from(Bytes::MIB);
    format!("{}.{}", tenths / 10, tenths % 10)
}

fn signed_mib(delta: i64) -> String {
    let magnitude = mib(Bytes(delta.unsigned_abs()));
    if delta < 0 {
        format!("-{magnitude}")
    } else {
        format!("+{magnitude}")
    }
}

fn print_alloc(out: &mut String, result: &alloc_settings::AllocComparison) {
    let _ = writeln!(
        out,
        "allocator settings — peaks on {} (MiB)",
        result.reference_gpu
    );
    let _ = writeln!(
        out,
        "  {:<66} {:>8} {:>8} {:>8} {:>8} {:>5} {:>5}",
        "PYTORCH_CUDA_ALLOC_CONF", "total", "delta", "reserved", "frag", "segs", "fits"
    );
    for (index, row) in result.rows.iter().enumerate() {
        let conf = if row.conf.is_empty() {
            "(default)"
        } else {
            row.conf.as_str()
        };
        let fits = row.fits.iter().filter(|f| f.fits).count();
        let _ = writeln!(
            out,
            "{} {:<66} {:>8} {:>8} {:>8} {:>8} {:>5} {:>2}/{:<2}",
            if index == result.best { "*" } else { " " },
            conf,
            mib(row.peak.total_bytes),
            signed_mib(row.delta_total_bytes),
            mib(row.peak.reserved_bytes),
            mib(row.fragmentation_bytes),
            row.peak_segments,
            fits,
            row.fits.len()
        );
    }
    if result.recommended_conf.is_empty() {
        let _ = writeln!(
            out,
            "best: PyTorch's defaults; leave PYTORCH_CUDA_ALLOC_CONF unset"
        );
    } else {
        let _ = writeln!(
            out,
            "best: PYTORCH_CUDA_ALLOC_CONF={}",
            result.recommended_conf
        );
    }
    for note in &result.notes {
        let _ = writeln!(out, "note: {note}");
    }
}

fn print_zero_grad(out: &mut String, result: &zero_grad::ZeroGradComparison) {
    let _ = writeln!(out, "zero_grad — peaks (MiB)");
    let _ = writeln!(
        out,
        "  {:<44} {:>8} {:>8} {:>8} {:>9}",
        "variant", "total", "delta", "reserved", "allocated"
    );
    for row in &result.rows {
        let placement = match row.placement {
            Some(zero_grad::Placement::StartOfIteration) => "start of iteration (pos1)",
            Some(zero_grad::Placement::BeforeBackward) => "before backward (pos0)",
            None => "any placement",
        };
        let label = format!(
            "{placement}{}",
            if row.set_to_none {
                ""
            } else {
                ", set_to_none=False"
            }
        );
        let _ = writeln!(
            out,
            "{} {:<44} {:>8} {:>8} {:>8} {:>9}",
            if row.captured { "=" } else { " " },
            label,
            mib(row.peak.total_bytes),
            signed_mib(row.delta_total_bytes),
            mib(row.peak.reserved_bytes),
            mib(row.peak.allocated_bytes),
        );
    }
    let _ = writeln!(out, "(= marks the captured job)");
    for note in &result.notes {
        let _ = writeln!(out, "note: {note}");
    }
}

/// `part / whole` as a percentage with one decimal (display only).
fn percent(part: Bytes, whole: Bytes) -> String {
    if whole.get() == 0 {
        return "-".to_owned();
    }
    let tenths =
        (u128::from(part.get()) * 1000 + u128::from(whole.get()) / 2) / u128::from(whole.get());
    format!("{}.{}%", tenths / 10, tenths % 10)
}

/// Prints the planned-allocation what-if: the lower bound, both planners'
/// plans, PyTorch's allocated and reserved, and the kept plan's groups.
fn print_plan(out: &mut String, result: &planned::PlanResult) {
    let _ = writeln!(
        out,
        "planned allocation — {} requests in {} sizes, reference GPU {} (without the {} MiB context)",
        result.requests,
        result.size_groups,
        result.reference_gpu,
        mib(result.context_bytes)
    );
    let winner = |planner: planned::Planner| {
        if result.winner == planner {
            "*"
        } else {
            " "
        }
    };
    let _ = writeln!(
        out,
        "  {:<34} {:>10} {:>14} {:>12}",
        "", "MiB", "bytes", "vs bound"
    );
    for (mark, label, bytes) in [
        (
            " ",
            "live lower bound (peak allocated)",
            result.live_lower_bound_bytes,
        ),
        (
            winner(planned::Planner::Stweaver),
            "STWeaver plan",
            result.stweaver_bytes,
        ),
        (
            winner(planned::Planner::BestFit),
            "best-fit plan",
            result.best_fit_bytes,
        ),
        (
            " ",
            "pytorch allocated (whole blocks)",
            result.pytorch_allocated_bytes,
        ),
        (" ", "pytorch reserved", result.pytorch_reserved_bytes),
    ] {
        let _ = writeln!(
            out,
            "{mark} {label:<34} {:>10} {:>14} {:>12}",
            mib(bytes),
            bytes.get(),
            percent(bytes, result.live_lower_bound_bytes)
        );
    }
    let winner_name = match result.winner {
        planned::Planner::Stweaver => "STWeaver",
        planned::Planner::BestFit => "best fit",
    };
    let _ = writeln!(
        out,
        "offline plan: {} MiB ({winner_name}, marked *); STWeaver: {} HomoPhase groups, {} after fusion, {} memory layers",
        mib(result.planned_bytes),
        result.phase_groups,
        result.fused_groups,
        result.memory_layers
    );
    let _ = writeln!(
        out,
        "pytorch reserved is {} of the plan; the plan is {} of the lower bound",
        permille(result.reserved_per_planned_permille),
        permille(result.planned_per_lower_bound_permille)
    );
    for note in &result.notes {
        let _ = writeln!(out, "note: {note}");
    }
}

/// Thousandths as a percentage with one decimal.
fn permille(value: u64) -> String {
    format!("{}.{}%", value / 10, value % 10)
}

fn print_distributed(out: &mut String, result: &distributed::DistributedComparison) {
    let _ = writeln!(
        out,
        "distributed — per GPU over {} GPUs, overheads of {} (MiB)",
        result.world_size, result.reference_gpu
    );
    let _ = writeln!(
        out,
        "  {:<16} {:>10} {:>10} {:>10} {:>8} {:>9} {:>5}",
        "strategy", "total", "reserved", "allocated", "nccl", "added", "fits"
    );
    for row in &result.rows {
        let name = match row.strategy {
            distributed::Strategy::Single => "single gpu",
            distributed::Strategy::Ddp => "ddp",
            distributed::Strategy::Zero1 => "zero-1",
            distributed::Strategy::Zero2 => "zero-2",
            distributed::Strategy::Zero3 => "zero-3 / fsdp",
            distributed::Strategy::TensorParallel => "tensor parallel",
        };
        let fits = row.fits.iter().filter(|f| f.fits).count();
        let _ = writeln!(
            out,
            "  {:<16} {:>10} {:>10} {:>10} {:>8} {:>9} {:>2}/{:<2}",
            name,
            mib(row.peak.total_bytes),
            mib(row.peak.reserved_bytes),
            mib(row.peak.allocated_bytes),
            mib(row.nccl_bytes),
            mib(row.added_bytes),
            fits,
            row.fits.len()
        );
    }
    for assumption in &result.assumptions {
        let _ = writeln!(out, "assumption: {assumption}");
    }
}

fn print_precision(out: &mut String, result: &precision::PrecisionComparison) {
    let _ = writeln!(
        out,
        "mixed precision — the forward under CUDA autocast (bf16; fp16 has the same sizes), PyTorch {} policy — peaks (MiB)",
        result.policy
    );
    let _ = writeln!(
        out,
        "  {:<22} {:>10} {:>10} {:>10}",
        "variant", "total", "reserved", "allocated"
    );
    for (label, peak) in [
        ("fp32 (captured)", &result.fp32),
        ("bf16/fp16 autocast", &result.autocast_16bit),
    ] {
        let _ = writeln!(
            out,
            "  {label:<22} {:>10} {:>10} {:>10}",
            mib(peak.total_bytes),
            mib(peak.reserved_bytes),
            mib(peak.allocated_bytes)
        );
    }
    let _ = writeln!(
        out,
        "delta {} MiB (fp16 with a GradScaler: at most {} bytes more)",
        signed_mib(result.delta_total_bytes),
        precision::GRAD_SCALER_BYTES.get()
    );
    let _ = writeln!(out, "what changed (per captured iterations, MiB) and why:");
    for change in &result.changes {
        let _ = writeln!(
            out,
            "  {:<24} {:>6} blocks {:>10} MiB  {}",
            change.rule.name(),
            change.blocks,
            signed_mib(change.bytes),
            change.reason
        );
    }
}

fn print_context(out: &mut String, sweep: &memcast::whatif::context::ContextSweep) {
    use memcast::whatif::context::Found;
    let prompt = sweep
        .prompt_tokens
        .map_or_else(|| "?".to_owned(), |p| p.to_string());
    let _ = writeln!(
        out,
        "longest generation — a {prompt}-token prompt, {} new tokens traced, up to {} simulated (peaks on {})",
        sweep.traced_new_tokens, sweep.budget_new_tokens, sweep.reference_gpu
    );
    for warning in sweep
        .warnings
        .iter()
        .filter(|w| w.code == "context_memory_budget")
    {
        let mut warning = warning.clone();
        crate::terms::warning(&mut warning);
        let _ = writeln!(out, "  note: {}", warning.message);
    }
    let _ = writeln!(
        out,
        "  {:>10} {:>10} {:>12}",
        "new tokens", "positions", "total MiB"
    );
    for p in &sweep.points {
        let _ = writeln!(
            out,
            "  {:>10} {:>10} {:>12}",
            p.new_tokens,
            p.positions
                .map_or_else(|| "-".to_owned(), |x| x.to_string()),
            mib(p.peak.total_bytes)
        );
    }
    let _ = writeln!(
        out,
        "  {:<14} {:>14} {:>14}  how",
        "gpu", "new tokens", "context"
    );
    for g in &sweep.gpus {
        let num = |x: Option<u64>| x.map_or_else(|| "-".to_owned(), |x| x.to_string());
        let how = match g.found {
            Found::Simulated => "simulated",
            Found::Extrapolated => "extrapolated past the budget",
            Found::DoesNotFit => "the traced generation does not fit",
            Found::NoGrowth => "no growth seen: no limit found",
        };
        let _ = writeln!(
            out,
            "  {:<14} {:>14} {:>14}  {how}",
            g.preset,
            num(g.max_new_tokens),
            num(g.max_context_tokens)
        );
    }
}
