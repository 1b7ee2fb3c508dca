//! The options every estimating command takes (GPUs, allocator settings,
//! run options) as one [`memcast::Settings`], and `--link`: the permalink the
//! page makes for the same estimate.

use std::io::Read as _;
use std::path::Path;

use anyhow::Context as _;
use memcast::permalink::{self, Fingerprint, Shared, TraceIdentity};
use memcast::report::Report;
use memcast::whatif::WhatIfResult;
use memcast::Settings;

/// GPUs, allocator settings and run options, as the page offers them.
#[derive(Debug, Clone, clap::Args)]
pub struct SettingsArgs {
    /// The GPU you plan to run on, then GPUs to compare it with: a preset
    /// (see `memcast presets`) or a capacity such as 24GiB, 80000MiB or
    /// 12884377600; repeat for several. The first is the target: its CUDA
    /// context and cuBLAS workspaces make the headline peak and every
    /// what-if. Default: a100-80gb, then every other preset.
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
    /// Every parameter's bytes (e.g. 500MiB), in place of what the trace
    /// shows: for weights the forward never reads, quantized storage, or a
    /// trace recorded without shapes.
    #[arg(long = "params", value_name = "SIZE")]
    params: Option<String>,
    /// The bytes of the parameters that get no gradient (frozen), in place
    /// of what the trace shows.
    #[arg(long = "frozen-params", value_name = "SIZE")]
    frozen_params: Option<String>,
    /// How a trace recorded under CPU autocast is estimated: `cuda` (as CUDA
    /// autocast runs it: its op policy and cast cache) or `as-traced` (the
    /// CPU's dtypes as they are).
    #[arg(long, value_name = "MODE", default_value = "cuda")]
    autocast: AutocastArg,
    /// The lower-precision type CUDA autocast runs in (`bf16` or `fp16`;
    /// same sizes). Default: the one the trace ran in.
    #[arg(long, value_name = "TYPE")]
    autocast_dtype: Option<DtypeArg>,
    /// The PyTorch version whose autocast policy applies (a name of the
    /// policy table, e.g. 2.12, 2.10, 2.9). Default: the newest.
    #[arg(long, value_name = "VERSION")]
    autocast_policy: Option<String>,
    /// Add `torch.amp.GradScaler` state (an fp16 run scaling its loss).
    #[arg(long)]
    grad_scaler: bool,
    /// Estimate the job with N repeated blocks (layers) per stack, from a
    /// trace of fewer (e.g. 2 traced, 32 estimated): the repeated block is
    /// found from its module frames and copied, and the whole job simulated.
    #[arg(long, value_name = "N")]
    layers: Option<u32>,
    /// Estimate the job at sequence length L: from one trace (its recorded
    /// shapes say which sizes grow with the length) or from two or three
    /// traces of the job at shorter lengths (each size fitted across them).
    #[arg(long = "seq-len", value_name = "L")]
    seq_len: Option<u32>,
    /// Estimate a generate() run to N new tokens, from a trace of fewer
    /// (at least 2): its last decode step is copied, each copy one cached
    /// position longer, and the whole generation simulated.
    #[arg(long = "new-tokens", value_name = "N")]
    new_tokens: Option<u32>,
    /// Build a rebuilt job whole as a trace instead of streaming it (the
    /// path before streaming, kept to compare the two).
    #[arg(long, hide = true)]
    pub materialize: bool,
    /// The memory an estimate may take (e.g. 8GiB): a job rebuilt with
    /// --layers or --new-tokens that would need more is refused at once,
    /// with the largest request that fits, instead of running out of
    /// memory. Default: 8 GiB, or half the machine's memory or of the
    /// process's address-space limit (ulimit -v) where that is less.
    #[arg(long = "memory-budget", value_name = "SIZE")]
    memory_budget: Option<String>,
}

/// `--memory-budget` at most, by default.
const DEFAULT_MEMORY_BUDGET: u64 = 8 << 30;

/// `--memory-budget` by default: [`DEFAULT_MEMORY_BUDGET`], or half the
/// machine's memory (`MemTotal`) or of the address-space limit where less
/// (read from /proc where there is one; the core reads no environment).
fn default_memory_budget() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let mem_total = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib.saturating_mul(1024));
    let address_space = read("/proc/self/limits")
        .lines()
        .find_map(|l| l.strip_prefix("Max address space"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok());
    [mem_total, address_space]
        .into_iter()
        .flatten()
        .map(|bytes| bytes / 2)
        .fold(DEFAULT_MEMORY_BUDGET, u64::min)
}

/// `--autocast`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AutocastArg {
    Cuda,
    AsTraced,
}

/// `--autocast-dtype`, named as [`Settings::autocast_dtype`] names it.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DtypeArg {
    Bf16,
    Fp16,
}

impl SettingsArgs {
    /// The choices as the core takes them, the GPU list written out (the
    /// default target, then every other preset, when none was given), as
    /// the page writes it.
    pub fn settings(&self) -> Settings {
        let mut settings = Settings {
            gpus: self.gpus.clone(),
            alloc_conf: self.alloc_conf.clone(),
            context: self.context.clone(),
            iterations: self.iterations,
            captured_optimizer: self.captured_optimizer,
            params: self.params.clone(),
            frozen_params: self.frozen_params.clone(),
            keep_cpu_dtypes: self.autocast == AutocastArg::AsTraced,
            autocast_dtype: self.autocast_dtype.map(|d| {
                match d {
                    DtypeArg::Bf16 => "bf16",
                    DtypeArg::Fp16 => "fp16",
                }
                .to_owned()
            }),
            autocast_policy: self.autocast_policy.clone(),
            grad_scaler: self.grad_scaler,
            layers: self.layers,
            seq_len: self.seq_len,
            new_tokens: self.new_tokens,
        };
        settings.gpus = settings.gpu_specs();
        settings
    }

    /// The estimate's config: the settings' ([`Settings::config`]) with the
    /// CLI's memory budget and the hidden choices.
    pub fn config(&self) -> anyhow::Result<memcast::Config> {
        let mut config = self.settings().config()?;
        config.materialize = self.materialize;
        config.memory_budget = match &self.memory_budget {
            None => memcast::Bytes(default_memory_budget()),
            Some(text) => memcast::presets::parse_size(text).map_err(|_| {
                anyhow::anyhow!(
                    "--memory-budget takes a size such as 8GiB, 4096MiB or 2000000000, got {text:?}"
                )
            })?,
        };
        Ok(config)
    }
}

/// `--link BASE_URL`.
#[derive(Debug, Clone, clap::Args)]
pub struct LinkArgs {
    /// Print only the permalink the page at BASE_URL makes for this result
    /// (the page's address, e.g. https://example.org/memcast/), to share it
    /// from a terminal or a CI job; the link carries the numbers, never the
    /// trace.
    #[arg(long, value_name = "BASE_URL", conflicts_with = "json")]
    pub link: Option<String>,
}

/// The identity the page gives a file: its name and the SHA-256 of its bytes.
pub fn identify(path: &Path) -> anyhow::Result<TraceIdentity> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("failed to read trace {path:?}"))?;
    let mut fingerprint = Fingerprint::default();
    let mut buffer = vec![0_u8; 4 << 20];
    loop {
        let n = file
            .read(&mut buffer)
            .with_context(|| format!("failed to read trace {path:?}"))?;
        if n == 0 {
            break;
        }
        fingerprint.update(buffer.get(..n).unwrap_or_default());
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(fingerprint.finish(&name))
}

/// The identity of one trace, or of several given together (their names
/// joined with ` + `, their sizes added, the hash of their hashes).
pub fn identify_all(paths: &[std::path::PathBuf]) -> anyhow::Result<TraceIdentity> {
    let ids = paths
        .iter()
        .map(|p| identify(p))
        .collect::<anyhow::Result<Vec<TraceIdentity>>>()?;
    Ok(permalink::TraceIdentity::joined(&ids))
}

/// The permalink line for a result.
pub fn link_line(
    base: &str,
    trace: TraceIdentity,
    settings: Settings,
    report: &Report,
    whatif: Option<WhatIfResult>,
) -> String {
    let shared = Shared::new(trace, settings, report).with_whatif(whatif);
    format!("{}\n", permalink::link(base, &shared))
}
