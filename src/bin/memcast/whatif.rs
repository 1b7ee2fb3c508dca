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
        /// New tokens simulated at most when the trace shows no position
        /// limit (with one, the search goes up to it); a GPU that still fits
        /// there fits at least that many.
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
            // The page's table, as text: the core lays both out.
            let figure = memcast::present::whatif::figure(&result);
            out.push_str(&memcast::present::whatif::text(&figure));
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
            let result = memcast::whatif::run_on_traces(
                &prepared,
                &traces,
                what,
                &config,
                &crate::source::Threads,
            )
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

/// Bytes as MiB with one decimal, without the unit.
pub(crate) fn mib(bytes: Bytes) -> String {
    memcast::present::mib_number(bytes)
}
