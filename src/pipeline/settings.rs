//! What the user chose for an estimate, as every shell takes it: the GPUs
//! (the target first), the allocator settings and the run options. The CLI
//! reads them from its flags, the page from its form, a permalink carries
//! them; [`Settings::config`] is the one rule that makes a [`Config`] of them,
//! so the same choices give the same report in every shell.
//!
//! The first GPU is the **target**: the one the user plans to run on. Its
//! CUDA context and cuBLAS workspaces make the headline peak and drive every
//! what-if; the others are compared with it (each gets a verdict at its own
//! capacity, target included).
//!
//! Invariants: plain serde data; every field has a default (`#[serde(default)]`)
//! and options at their default are not serialized, so a field added later
//! neither breaks old permalinks nor changes their bytes.

use serde::{Deserialize, Serialize};

use super::{Config, Error, DEFAULT_TARGET};
use crate::autocast::{Dtype, VERSIONS};
use crate::orchestrator::{AutocastConfig, AutocastMode, OptimizerPath};
use crate::presets::{self, PRESETS};
use crate::units::Bytes;

/// The user's choices for an estimate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// GPU presets or capacities (`NAME|SIZE`), in order; the first is the
    /// target. Empty: [`DEFAULT_TARGET`], then every other preset.
    pub gpus: Vec<String>,
    /// A `PYTORCH_CUDA_ALLOC_CONF` string; empty for PyTorch's defaults.
    pub alloc_conf: String,
    /// The CUDA context to assume on every GPU (a size such as `1GiB`, or
    /// `0`) instead of the sourced per-architecture figure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Training iterations to simulate.
    pub iterations: u32,
    /// Simulate the optimizer step as captured instead of CUDA's default
    /// `foreach` implementation.
    #[serde(skip_serializing_if = "is_false")]
    pub captured_optimizer: bool,
    /// Every parameter's bytes (a size such as `500MiB`) in place of what
    /// the trace shows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<String>,
    /// The bytes of the parameters that get no gradient, in place of what
    /// the trace shows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen_params: Option<String>,
    /// Estimate a trace recorded under CPU autocast with the CPU's dtypes as
    /// they are, instead of as CUDA autocast runs it.
    #[serde(skip_serializing_if = "is_false")]
    pub keep_cpu_dtypes: bool,
    /// The lower-precision type CUDA autocast runs in (`bf16` or `fp16`)
    /// instead of the one the trace ran in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autocast_dtype: Option<String>,
    /// The PyTorch version whose autocast policy applies (a name of
    /// [`crate::autocast::VERSIONS`]) instead of the newest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autocast_policy: Option<String>,
    /// Add `torch.amp.GradScaler`'s state (an fp16 run scaling its loss).
    #[serde(skip_serializing_if = "is_false")]
    pub grad_scaler: bool,
    /// The number of repeated blocks (layers) of the job to estimate, when
    /// the trace has fewer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// The sequence length of the job to estimate, when the trace's differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<u32>,
    /// The new tokens a `generate()` job makes, when the trace made fewer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_tokens: Option<u32>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            gpus: Vec::new(),
            alloc_conf: String::new(),
            context: None,
            iterations: 3,
            captured_optimizer: false,
            params: None,
            frozen_params: None,
            keep_cpu_dtypes: false,
            autocast_dtype: None,
            autocast_policy: None,
            grad_scaler: false,
            layers: None,
            seq_len: None,
            new_tokens: None,
        }
    }
}

impl Settings {
    /// The target GPU's spec.
    pub fn target(&self) -> &str {
        self.gpus.first().map_or(DEFAULT_TARGET, String::as_str)
    }

    /// The GPU specs an estimate runs on: the ones chosen, or the default
    /// target followed by every other preset.
    pub fn gpu_specs(&self) -> Vec<String> {
        if !self.gpus.is_empty() {
            return self.gpus.clone();
        }
        std::iter::once(DEFAULT_TARGET)
            .chain(
                PRESETS
                    .iter()
                    .map(|p| p.slug)
                    .filter(|s| *s != DEFAULT_TARGET),
            )
            .map(str::to_owned)
            .collect()
    }

    /// The estimate's [`Config`]: the target GPU as the reference, a
    /// verdict for every GPU in order, the allocator settings and options.
    pub fn config(&self) -> Result<Config, Error> {
        let mut config = Config::for_gpus(self.target(), &self.gpu_specs())?;
        if let Some(context) = &self.context {
            let bytes = if context.trim() == "0" {
                Bytes::ZERO
            } else {
                presets::parse_size(context)?
            };
            config = config.with_context(bytes);
        }
        config.alloc_conf = self.alloc_conf.clone();
        config.orchestrator.iterations = self.iterations;
        if self.captured_optimizer {
            config.orchestrator.optimizer_path = OptimizerPath::Captured;
        }
        let size = |text: &Option<String>| -> Result<Option<Bytes>, Error> {
            text.as_deref()
                .map(|t| presets::parse_size(t).map_err(|_| Error::ParameterBytes(t.to_owned())))
                .transpose()
        };
        config.orchestrator.parameters.total = size(&self.params)?;
        config.orchestrator.parameters.frozen = size(&self.frozen_params)?;
        self.autocast(&mut config.orchestrator.autocast)?;
        config.scale = crate::scale::Target {
            layers: self.layers,
            seq_len: self.seq_len,
            new_tokens: self.new_tokens,
        };
        Ok(config)
    }

    /// The autocast choices: mode, type, policy version, GradScaler.
    fn autocast(&self, autocast: &mut AutocastConfig) -> Result<(), Error> {
        if self.keep_cpu_dtypes {
            autocast.mode = AutocastMode::Off;
        }
        autocast.dtype = match self.autocast_dtype.as_deref().map(str::trim) {
            None | Some("") => None,
            Some("bf16") => Some(Dtype::Bf16),
            Some("fp16") => Some(Dtype::F16),
            Some(other) => return Err(Error::AutocastDtype(other.to_owned())),
        };
        if let Some(version) = self.autocast_policy.as_deref().map(str::trim) {
            if !VERSIONS.iter().any(|v| v.name == version) {
                return Err(Error::AutocastPolicy {
                    given: version.to_owned(),
                    known: VERSIONS
                        .iter()
                        .map(|v| v.name)
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            version.clone_into(&mut autocast.version);
        }
        autocast.grad_scaler = self.grad_scaler;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_gpu_is_the_target_and_the_reference() {
        let settings = Settings {
            gpus: vec!["t4".into(), "h100-80gb".into(), "24GiB".into()],
            ..Settings::default()
        };
        let config = settings.config().unwrap();
        assert_eq!(settings.target(), "t4");
        assert_eq!(config.reference.name, "t4");
        let names: Vec<&str> = config.gpus.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["t4", "h100-80gb", "24GiB"]);
        // The reference's overheads are the target's, not the A100's.
        assert_eq!(config.reference, config.gpus[0]);
    }

    #[test]
    fn no_gpus_means_the_default_target_then_every_other_preset() {
        let config = Settings::default().config().unwrap();
        assert_eq!(config.reference.name, DEFAULT_TARGET);
        assert_eq!(config.gpus.len(), PRESETS.len());
        assert_eq!(config.gpus[0].name, DEFAULT_TARGET);
        let rest: Vec<&str> = config.gpus[1..].iter().map(|g| g.name.as_str()).collect();
        let expected: Vec<&str> = PRESETS
            .iter()
            .map(|p| p.slug)
            .filter(|s| *s != DEFAULT_TARGET)
            .collect();
        assert_eq!(rest, expected);
    }

    #[test]
    fn options_reach_the_config() {
        let settings = Settings {
            gpus: vec!["l4".into()],
            alloc_conf: "expandable_segments:True".into(),
            context: Some("1GiB".into()),
            iterations: 5,
            captured_optimizer: true,
            params: Some("500MiB".into()),
            frozen_params: Some("100MiB".into()),
            keep_cpu_dtypes: true,
            autocast_dtype: Some("fp16".into()),
            autocast_policy: Some(VERSIONS[VERSIONS.len() - 1].name.into()),
            grad_scaler: true,
            layers: Some(32),
            seq_len: Some(4096),
            new_tokens: Some(64),
        };
        let config = settings.config().unwrap();
        assert_eq!(config.scale.layers, Some(32));
        assert_eq!(config.scale.seq_len, Some(4096));
        assert_eq!(config.scale.new_tokens, Some(64));
        let autocast = &config.orchestrator.autocast;
        assert_eq!(autocast.mode, AutocastMode::Off);
        assert_eq!(autocast.dtype, Some(Dtype::F16));
        assert_eq!(autocast.version, VERSIONS[VERSIONS.len() - 1].name);
        assert!(autocast.grad_scaler);
        let defaults = Settings::default().config().unwrap();
        assert_eq!(defaults.orchestrator.autocast, AutocastConfig::default());
        assert_eq!(
            config.orchestrator.parameters.total,
            Some(Bytes(500 * Bytes::MIB))
        );
        assert_eq!(
            config.orchestrator.parameters.frozen,
            Some(Bytes(100 * Bytes::MIB))
        );
        assert_eq!(config.alloc_conf, "expandable_segments:True");
        assert_eq!(config.reference.overheads.context_bytes, Bytes(Bytes::GIB));
        assert_eq!(config.orchestrator.iterations, 5);
        assert_eq!(config.orchestrator.optimizer_path, OptimizerPath::Captured);
        let zero = Settings {
            context: Some("0".into()),
            ..Settings::default()
        };
        assert!(zero
            .config()
            .unwrap()
            .gpus
            .iter()
            .all(|g| g.overheads.context_bytes == Bytes::ZERO));
    }

    #[test]
    fn bad_choices_say_what_was_wrong() {
        let unknown = Settings {
            gpus: vec!["a100".into()],
            ..Settings::default()
        };
        assert!(matches!(unknown.config(), Err(Error::Gpu(_))));
        let context = Settings {
            context: Some("lots".into()),
            ..Settings::default()
        };
        assert!(matches!(context.config(), Err(Error::Gpu(_))));
        let params = Settings {
            params: Some("many".into()),
            ..Settings::default()
        };
        assert!(matches!(params.config(), Err(Error::ParameterBytes(_))));
        let dtype = Settings {
            autocast_dtype: Some("fp8".into()),
            ..Settings::default()
        };
        assert!(matches!(dtype.config(), Err(Error::AutocastDtype(_))));
        let policy = Settings {
            autocast_policy: Some("1.0".into()),
            ..Settings::default()
        };
        let message = policy.config().unwrap_err().to_string();
        assert!(
            message.contains("\"1.0\"") && message.contains(VERSIONS[0].name),
            "{message}"
        );
    }
}
