//! A trace recorded by memcast's capture helper names the full job it stands
//! for ([`crate::trace::Capture`]): its layers, sequence length and new tokens,
//! and the mixed-precision choices a CPU cannot record (fp16 with a
//! GradScaler, traced in bf16). An estimate of such a trace answers for the
//! full job: every figure the user left as traced is taken from the trace.
//! One rule ([`figures`]) serves the pipeline (on the [`Config`] it runs) and
//! the shells (on the [`Settings`] a link carries, [`Settings::adopt_capture`]),
//! so the page, the CLI and the link agree.

use super::{Config, Settings};
use crate::autocast::Dtype;
use crate::trace::Capture;

/// What a capture asks for beyond the traced job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureFigures {
    pub layers: Option<u32>,
    pub seq_len: Option<u32>,
    pub new_tokens: Option<u32>,
    /// `bf16` or `fp16`.
    pub autocast_dtype: Option<&'static str>,
    pub grad_scaler: bool,
}

impl CaptureFigures {
    /// Whether the capture asks for anything.
    pub fn is_empty(&self) -> bool {
        *self == CaptureFigures::default()
    }
}

/// The full job's figures that differ from the traced ones: a figure equal to
/// what was traced (or given without it) rebuilds nothing.
pub fn figures(capture: &Capture) -> CaptureFigures {
    let differs = |full: Option<u32>, traced: Option<u32>| full.filter(|f| traced != Some(*f));
    CaptureFigures {
        layers: differs(capture.layers, capture.traced_layers),
        seq_len: differs(capture.seq_len, capture.traced_seq_len),
        new_tokens: differs(capture.new_tokens, capture.traced_new_tokens),
        autocast_dtype: match capture.autocast_dtype.as_deref() {
            Some("fp16") => Some("fp16"),
            Some("bf16") => Some("bf16"),
            _ => None,
        },
        grad_scaler: capture.grad_scaler,
    }
}

/// `config` with the capture's figures where the user left them as traced.
pub(super) fn apply(config: &Config, capture: Option<&Capture>) -> Config {
    let mut config = config.clone();
    let Some(capture) = capture else {
        return config;
    };
    let asked = figures(capture);
    let scale = &mut config.scale;
    scale.layers = scale.layers.or(asked.layers);
    scale.seq_len = scale.seq_len.or(asked.seq_len);
    scale.new_tokens = scale.new_tokens.or(asked.new_tokens);
    let autocast = &mut config.orchestrator.autocast;
    if autocast.dtype.is_none() {
        autocast.dtype = match asked.autocast_dtype {
            Some("fp16") => Some(Dtype::F16),
            Some("bf16") => Some(Dtype::Bf16),
            _ => None,
        };
    }
    autocast.grad_scaler |= asked.grad_scaler;
    config
}

impl Settings {
    /// Takes the trace's capture figures (the report's `summary.capture`)
    /// where these settings leave them as traced, as the estimate did: the
    /// settings then say what the estimate answers, and give the same
    /// estimate when run again (a link, the page's fields).
    pub fn adopt_capture(&mut self, capture: Option<&Capture>) {
        let Some(capture) = capture else {
            return;
        };
        let asked = figures(capture);
        self.layers = self.layers.or(asked.layers);
        self.seq_len = self.seq_len.or(asked.seq_len);
        self.new_tokens = self.new_tokens.or(asked.new_tokens);
        if self.autocast_dtype.as_deref().is_none_or(str::is_empty) {
            self.autocast_dtype = asked.autocast_dtype.map(str::to_owned);
        }
        self.grad_scaler |= asked.grad_scaler;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture() -> Capture {
        Capture {
            layers: Some(32),
            traced_layers: Some(2),
            seq_len: Some(128),
            traced_seq_len: Some(128),
            new_tokens: Some(512),
            traced_new_tokens: Some(8),
            autocast_dtype: Some("fp16".into()),
            grad_scaler: true,
            ..Capture::default()
        }
    }

    #[test]
    fn only_figures_that_differ_from_the_traced_ones_are_asked_for() {
        let asked = figures(&capture());
        assert_eq!(asked.layers, Some(32));
        assert_eq!(asked.seq_len, None);
        assert_eq!(asked.new_tokens, Some(512));
        assert!(figures(&Capture::default()).is_empty());
    }

    #[test]
    fn the_users_figures_win_and_settings_adopt_what_the_config_ran() {
        let settings = Settings {
            layers: Some(8),
            ..Settings::default()
        };
        let config = apply(&settings.config().unwrap(), Some(&capture()));
        assert_eq!(config.scale.layers, Some(8));
        assert_eq!(config.scale.new_tokens, Some(512));
        assert_eq!(config.orchestrator.autocast.dtype, Some(Dtype::F16));
        assert!(config.orchestrator.autocast.grad_scaler);
        let mut adopted = settings.clone();
        adopted.adopt_capture(Some(&capture()));
        assert_eq!(adopted.layers, Some(8));
        assert_eq!(adopted.new_tokens, Some(512));
        // The adopted settings run the same job without the capture.
        assert_eq!(adopted.config().unwrap(), config);
    }
}
