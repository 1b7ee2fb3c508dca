//! What an estimate answers, against what the user now asks: the choices
//! that differ, in the user's words, so that a shell never shows a verdict
//! for other settings than its fields without saying so (after a cancel, a
//! refusal, a crash, or while an edit waits to be applied).

use crate::pipeline::Settings;

/// One choice the estimate shown was not made with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// The choice, in the user's words ("layers").
    pub what: &'static str,
    /// What the fields ask for.
    pub asked: String,
    /// What the estimate shown answers.
    pub shown: String,
}

fn figure(value: Option<u32>) -> String {
    value.map_or_else(
        || "as traced".to_owned(),
        |v| super::thousands(u64::from(v)),
    )
}

fn text(value: Option<&str>, unset: &str) -> String {
    match value.map(str::trim) {
        None | Some("") => unset.to_owned(),
        Some(v) => v.to_owned(),
    }
}

fn flag(value: bool) -> String {
    if value { "on" } else { "off" }.to_owned()
}

/// The choices in which `asked` differs from `shown`, in a fixed order.
pub fn changed(shown: &Settings, asked: &Settings) -> Vec<Changed> {
    let mut out = Vec::new();
    let mut push = |what: &'static str, asked: String, shown: String| {
        if asked != shown {
            out.push(Changed { what, asked, shown });
        }
    };
    push("layers", figure(asked.layers), figure(shown.layers));
    push(
        "sequence length",
        figure(asked.seq_len),
        figure(shown.seq_len),
    );
    push(
        "new tokens",
        figure(asked.new_tokens),
        figure(shown.new_tokens),
    );
    push(
        "target GPU",
        asked.target().to_owned(),
        shown.target().to_owned(),
    );
    push(
        "GPUs compared",
        asked.gpu_specs().join(", "),
        shown.gpu_specs().join(", "),
    );
    push(
        "PYTORCH_CUDA_ALLOC_CONF",
        text(Some(&asked.alloc_conf), "default"),
        text(Some(&shown.alloc_conf), "default"),
    );
    push(
        "parameter bytes",
        text(asked.params.as_deref(), "from the trace"),
        text(shown.params.as_deref(), "from the trace"),
    );
    push(
        "frozen parameter bytes",
        text(asked.frozen_params.as_deref(), "from the trace"),
        text(shown.frozen_params.as_deref(), "from the trace"),
    );
    push(
        "CPU dtypes kept",
        flag(asked.keep_cpu_dtypes),
        flag(shown.keep_cpu_dtypes),
    );
    push(
        "autocast type",
        text(asked.autocast_dtype.as_deref(), "as traced"),
        text(shown.autocast_dtype.as_deref(), "as traced"),
    );
    push(
        "autocast policy",
        text(asked.autocast_policy.as_deref(), "newest"),
        text(shown.autocast_policy.as_deref(), "newest"),
    );
    push(
        "GradScaler",
        flag(asked.grad_scaler),
        flag(shown.grad_scaler),
    );
    push(
        "CUDA context",
        text(asked.context.as_deref(), "per GPU"),
        text(shown.context.as_deref(), "per GPU"),
    );
    push(
        "iterations",
        asked.iterations.to_string(),
        shown.iterations.to_string(),
    );
    push(
        "optimizer step as captured",
        flag(asked.captured_optimizer),
        flag(shown.captured_optimizer),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_settings_differ_in_nothing_and_each_change_is_named() {
        let shown = Settings::default();
        assert!(changed(&shown, &shown).is_empty());
        let asked = Settings {
            layers: Some(32),
            new_tokens: Some(4096),
            ..Settings::default()
        };
        let got = changed(&shown, &asked);
        assert_eq!(
            got,
            vec![
                Changed {
                    what: "layers",
                    asked: "32".into(),
                    shown: "as traced".into()
                },
                Changed {
                    what: "new tokens",
                    asked: "4,096".into(),
                    shown: "as traced".into()
                },
            ]
        );
        // The default GPUs written out are the default GPUs.
        let explicit = Settings {
            gpus: shown.gpu_specs(),
            ..Settings::default()
        };
        assert!(changed(&shown, &explicit).is_empty());
    }
}
