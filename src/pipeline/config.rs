//! The settings of a whole estimate.

use serde::{Deserialize, Serialize};

use super::Error;
use crate::analyzer::AnalyzerConfig;
use crate::diag::{Setting, Warning};
use crate::orchestrator::OrchestratorConfig;
use crate::presets::{self, GpuTarget, PresetError};
use crate::report;
use crate::simulator::{AllocatorConfig, ConfigError, RuleVersion};
use crate::units::Bytes;

/// The GPU the headline peak is computed for when the user names none.
pub const DEFAULT_TARGET: &str = "a100-80gb";

/// Settings of a whole estimate. Both shells build one with
/// [`Config::for_gpus`]; [`Config::standard`] is the same with every preset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub analyzer: AnalyzerConfig,
    pub orchestrator: OrchestratorConfig,
    /// A `PYTORCH_CUDA_ALLOC_CONF` string; empty for PyTorch's defaults.
    pub alloc_conf: String,
    /// The GPU whose overheads the headline peak uses (the target).
    pub reference: GpuTarget,
    /// The GPUs to give a verdict for, in this order.
    pub gpus: Vec<GpuTarget>,
    /// Points the report's timeline keeps at most.
    pub max_timeline_points: usize,
    /// The job to estimate when it is larger than the traced one.
    #[serde(default)]
    pub scale: crate::scale::Target,
    /// Build a rebuilt job whole as a trace (the path before programs),
    /// instead of streaming it as a program: for comparing the two.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub materialize: bool,
    /// The memory an estimate may take: a rebuilt job that would need more
    /// is refused before it is built (`scale::work`). A setting of the
    /// shell (the CLI's is generous, the page's below the wasm32 heap);
    /// [`DEFAULT_MEMORY_BUDGET`] otherwise.
    #[serde(default = "default_memory_budget")]
    pub memory_budget: Bytes,
}

/// The memory budget of [`Config::standard`]: what a 32-bit WebAssembly
/// heap (4 GiB) holds with room to spare, so that the library's default
/// runs everywhere. The CLI and the page set their own.
pub const DEFAULT_MEMORY_BUDGET: Bytes = Bytes(2 * Bytes::GIB);

fn default_memory_budget() -> Bytes {
    DEFAULT_MEMORY_BUDGET
}

impl Config {
    /// The standard estimate: three iterations, the CUDA default optimizer
    /// path, default allocator settings, [`DEFAULT_TARGET`] as the target
    /// and a verdict for every preset.
    pub fn standard() -> Config {
        let gpus: Vec<GpuTarget> = presets::PRESETS
            .iter()
            .map(GpuTarget::from_preset)
            .collect();
        let reference = presets::find(DEFAULT_TARGET)
            .map(GpuTarget::from_preset)
            .or_else(|| gpus.first().cloned())
            .unwrap_or_else(|| GpuTarget {
                name: "unlimited".to_owned(),
                is_preset: false,
                arch: None,
                sm: None,
                multiprocessors: None,
                capacity: Bytes(u64::MAX),
                overheads: presets::DeviceOverheads::for_unknown_arch(),
            });
        Config {
            analyzer: AnalyzerConfig::standard(),
            orchestrator: OrchestratorConfig::standard(),
            alloc_conf: String::new(),
            reference,
            gpus,
            max_timeline_points: report::DEFAULT_MAX_POINTS,
            scale: crate::scale::Target::default(),
            materialize: false,
            memory_budget: DEFAULT_MEMORY_BUDGET,
        }
    }

    /// The standard estimate for the GPU `target` with a verdict for each of
    /// `gpus`, in order (every preset when `gpus` is empty). Each is a preset
    /// name or a size (`NAME|SIZE`, see [`presets::parse_gpu`]). The CLI
    /// passes its first `--gpu` as the target, the page its target choice.
    pub fn for_gpus(target: &str, gpus: &[String]) -> Result<Config, Error> {
        let mut config = Config::standard();
        config.reference = presets::parse_gpu(target)?;
        if !gpus.is_empty() {
            config.gpus = gpus
                .iter()
                .map(|spec| presets::parse_gpu(spec))
                .collect::<Result<Vec<GpuTarget>, PresetError>>()?;
        }
        Ok(config)
    }

    /// Assumes `context` bytes of CUDA context on every GPU instead of the
    /// per-architecture figures of [`presets::OVERHEADS`].
    pub fn with_context(mut self, context: Bytes) -> Config {
        self.reference.overheads.context_bytes = context;
        for gpu in &mut self.gpus {
            gpu.overheads.context_bytes = context;
        }
        self
    }

    /// What a rebuilt job may take: [`Config::memory_budget`], for a job
    /// prepared with the mixed-precision what-if's or without.
    pub fn work_budget(&self) -> crate::scale::work::Budget {
        crate::scale::work::Budget {
            bytes: self.memory_budget,
            what_if: self.orchestrator.autocast.what_if,
        }
    }

    /// The allocator settings of [`Config::alloc_conf`].
    pub fn allocator(&self) -> Result<AllocatorConfig, ConfigError> {
        if self.alloc_conf.trim().is_empty() {
            Ok(AllocatorConfig::pytorch_defaults())
        } else {
            AllocatorConfig::parse(&self.alloc_conf, RuleVersion::New)
        }
    }

    /// The advice to measure the CUDA context, when the target's is the
    /// assumed figure of its architecture rather than one the user gave.
    pub(super) fn context_advice(&self) -> Option<Warning> {
        let context = self.reference.overheads.context_bytes;
        let sourced = presets::DeviceOverheads::for_arch(
            self.reference.arch.unwrap_or(presets::Arch::Ampere),
        )
        .context_bytes;
        (context == sourced).then(|| {
            Warning::asking(
                "context_assumed",
                &format!(
                    "the CUDA context outside the allocator is assumed to be {} MiB on {} (a bare context with lazy module loading); a training process that has loaded cuBLAS and cuDNN kernels can hold a few hundred MiB more, so measure nvidia-smi used minus torch.cuda.memory_reserved() after one step and ",
                    context.get() / Bytes::MIB,
                    self.reference.name
                ),
                Setting::CudaContext,
            )
        })
    }
}
