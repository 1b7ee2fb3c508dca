//! The figures memcast's capture helper (`www/memcast_capture.py`) writes
//! into the trace it records, under the top-level key `memcast` (through
//! `torch.profiler`'s `add_metadata_json`): the job the trace is of, the full
//! job it stands for (layers, sequence length, new tokens) and what was
//! shrunk to trace it. A trace that carries them is estimated for the full
//! job without flags (`pipeline` fills the figures the user left as traced).
//!
//! Read tolerantly: a key of an unexpected type reads as missing, unknown keys
//! are skipped, and a `memcast` value that is not an object is no capture.
//! Strings are kept only when short and printable, so a hand-edited file
//! cannot put anything odd on the page.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::loose::{drain_seq, LooseInt, LooseStr};

/// The schema tag the helper writes.
pub const CAPTURE_SCHEMA: &str = "memcast.capture/1";

/// The longest text field kept.
const MAX_TEXT: usize = 200;

/// What the capture helper recorded and the full job the trace stands for.
/// Every field is optional: an older or hand-written capture may give less.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capture {
    /// `memcast.capture/1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// The model (a Hugging Face id or a config file's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The job kind: `train`, `lora`, `qlora`, `inference` or `generate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The optimizer class asked for (training jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<String>,
    /// `fp32`, `bf16`, `bf16-mixed`, `fp16-mixed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
    /// `nf4` or `int8` (bitsandbytes), when the weights are quantized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<String>,
    /// Samples per batch (traced at full size: memcast does not rebuild it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// The full job's repeated blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// The full job's sequence length (a generation's prompt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<u32>,
    /// The full job's new tokens (a generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_tokens: Option<u32>,
    /// The blocks recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced_layers: Option<u32>,
    /// The sequence length recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced_seq_len: Option<u32>,
    /// The new tokens recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced_new_tokens: Option<u32>,
    /// The model's position limit (`max_position_embeddings` of its config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_positions: Option<u32>,
    /// CUDA autocast type of the full job when it differs from the CPU
    /// trace's (`fp16`: recorded in bf16 on the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autocast_dtype: Option<String>,
    /// The full job scales its loss with a GradScaler.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grad_scaler: bool,
    /// Activation checkpointing was on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpointing: bool,
    /// Micro-batches per optimizer step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_accum: Option<u32>,
    /// The helper's name and version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
}

impl Capture {
    /// What was shrunk to trace the job, as "32 → 2 layers, 4096 → 128
    /// tokens"; empty when nothing was.
    pub fn shrunk(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut pair = |full: Option<u32>, traced: Option<u32>, what: &str| {
            if let (Some(full), Some(traced)) = (full, traced) {
                if full != traced {
                    out.push(format!("{full} → {traced} {what}"));
                }
            }
        };
        pair(self.layers, self.traced_layers, "layers");
        pair(self.seq_len, self.traced_seq_len, "tokens");
        pair(self.new_tokens, self.traced_new_tokens, "new tokens");
        out
    }
}

/// A short printable text, or nothing.
fn clean(text: Option<Cow<'_, str>>) -> Option<String> {
    let text = text?;
    let text = text.trim();
    (!text.is_empty()
        && text.len() <= MAX_TEXT
        && text.chars().all(|c| !c.is_control() && c != '\u{fffd}'))
    .then(|| text.to_owned())
}

/// A count from 1 to `u32::MAX`, or nothing.
fn count(value: Option<i64>) -> Option<u32> {
    value.and_then(|v| u32::try_from(v).ok()).filter(|&v| v > 0)
}

/// The `memcast` header value: a [`Capture`] when it is an object, `None`
/// for any other JSON type.
#[derive(Default)]
pub(super) struct LooseCapture(pub(super) Option<Capture>);

impl<'de> de::Deserialize<'de> for LooseCapture {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LooseCapture;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut c = Capture::default();
                while let Some(key) = map.next_key::<LooseStr<'de>>()? {
                    let text = |map: &mut A| -> Result<Option<String>, A::Error> {
                        Ok(clean(map.next_value::<LooseStr<'de>>()?.0))
                    };
                    let number = |map: &mut A| -> Result<Option<u32>, A::Error> {
                        Ok(count(map.next_value::<LooseInt>()?.0))
                    };
                    match key.0.as_deref() {
                        Some("schema") => c.schema = text(&mut map)?,
                        Some("model") => c.model = text(&mut map)?,
                        Some("job") => c.job = text(&mut map)?,
                        Some("optimizer") => c.optimizer = text(&mut map)?,
                        Some("precision") => c.precision = text(&mut map)?,
                        Some("quantization") => c.quantization = text(&mut map)?,
                        Some("autocast_dtype") => c.autocast_dtype = text(&mut map)?,
                        Some("tool") => c.tool = text(&mut map)?,
                        Some("batch") => c.batch = number(&mut map)?,
                        Some("layers") => c.layers = number(&mut map)?,
                        Some("seq_len") => c.seq_len = number(&mut map)?,
                        Some("new_tokens") => c.new_tokens = number(&mut map)?,
                        Some("traced_layers") => c.traced_layers = number(&mut map)?,
                        Some("traced_seq_len") => c.traced_seq_len = number(&mut map)?,
                        Some("traced_new_tokens") => c.traced_new_tokens = number(&mut map)?,
                        Some("max_positions") => c.max_positions = number(&mut map)?,
                        Some("grad_accum") => c.grad_accum = number(&mut map)?,
                        Some("grad_scaler") => {
                            c.grad_scaler = map.next_value::<LooseInt>()?.0.is_some_and(|v| v != 0)
                        }
                        Some("checkpointing") => {
                            c.checkpointing =
                                map.next_value::<LooseInt>()?.0.is_some_and(|v| v != 0)
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(LooseCapture(Some(c)))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(LooseCapture(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(LooseCapture(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq)?;
                Ok(LooseCapture(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(LooseCapture(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(LooseCapture(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(LooseCapture(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(LooseCapture(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> Option<Capture> {
        serde_json::from_str::<LooseCapture>(json).unwrap().0
    }

    #[test]
    fn the_helpers_figures_are_read() {
        let c = read(
            r#"{"schema": "memcast.capture/1", "model": "meta-llama/Llama-3.1-8B", "job": "train",
                "layers": 32, "seq_len": 4096, "traced_layers": 2, "traced_seq_len": 128,
                "batch": 4, "grad_scaler": 1, "checkpointing": true, "extra": {"a": [1]}}"#,
        )
        .unwrap();
        assert_eq!(c.schema.as_deref(), Some(CAPTURE_SCHEMA));
        assert_eq!(c.model.as_deref(), Some("meta-llama/Llama-3.1-8B"));
        assert_eq!(
            (c.layers, c.seq_len, c.new_tokens),
            (Some(32), Some(4096), None)
        );
        assert_eq!(c.batch, Some(4));
        assert!(c.grad_scaler && c.checkpointing);
        assert_eq!(c.shrunk(), vec!["32 → 2 layers", "4096 → 128 tokens"]);
    }

    #[test]
    fn odd_values_read_as_missing() {
        let c = read(
            r#"{"layers": -3, "seq_len": "lots", "new_tokens": 0, "model": "a\u0007b",
                "job": 5, "batch": 1e30}"#,
        )
        .unwrap();
        assert_eq!(c, Capture::default());
        assert_eq!(read("[1, 2]"), None);
        assert_eq!(read("\"memcast\""), None);
        assert_eq!(read("null"), None);
    }
}
