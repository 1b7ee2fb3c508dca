//! The capture helper's command line for a job the user describes (the
//! page's capture guide writes it; the README shows the same commands).

/// The job to capture, as the guide's form holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureAsk {
    /// A Hugging Face model id or a config.json path.
    pub model: String,
    /// `train`, `lora`, `qlora`, `inference` or `generate`.
    pub job: String,
    /// Training jobs: `adamw`, `adam`, `sgd`, `adafactor`, `rmsprop`, `adagrad`.
    pub optimizer: String,
    /// `fp32`, `bf16`, `bf16-mixed`, `fp16-mixed`.
    pub precision: String,
    pub batch: u32,
    /// The job's sequence length (a generation's prompt).
    pub seq_len: u32,
    /// A generation's new tokens.
    pub new_tokens: u32,
    pub checkpointing: bool,
    pub grad_accum: u32,
}

impl Default for CaptureAsk {
    fn default() -> CaptureAsk {
        CaptureAsk {
            model: "meta-llama/Llama-3.1-8B".into(),
            job: "train".into(),
            optimizer: "adamw".into(),
            precision: "bf16-mixed".into(),
            batch: 1,
            seq_len: 4096,
            new_tokens: 512,
            checkpointing: false,
            grad_accum: 1,
        }
    }
}

/// The file name the helper has on the site and in the repository.
pub const HELPER: &str = "memcast_capture.py";

fn training(job: &str) -> bool {
    matches!(job, "train" | "lora" | "qlora")
}

/// A word for a POSIX shell: as it is when it is plain, else single-quoted.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/:+-=@".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `python memcast_capture.py MODEL --job ...`: only the options that
/// differ from the helper's defaults, so the line reads as the job.
pub fn capture_command(ask: &CaptureAsk) -> String {
    let model = if ask.model.trim().is_empty() {
        "MODEL_ID_OR_CONFIG_JSON".to_owned()
    } else {
        shell_word(ask.model.trim())
    };
    let mut parts = vec![format!(
        "python {HELPER} {model} --job {}",
        shell_word(&ask.job)
    )];
    if training(&ask.job) && ask.optimizer != "adamw" {
        parts.push(format!("--optimizer {}", shell_word(&ask.optimizer)));
    }
    if ask.precision != "fp32" {
        parts.push(format!("--precision {}", shell_word(&ask.precision)));
    }
    if ask.batch != 1 {
        parts.push(format!("--batch {}", ask.batch));
    }
    parts.push(format!("--seq-len {}", ask.seq_len));
    if ask.job == "generate" {
        parts.push(format!("--new-tokens {}", ask.new_tokens));
    }
    if training(&ask.job) && ask.checkpointing {
        parts.push("--checkpointing".to_owned());
    }
    if training(&ask.job) && ask.grad_accum > 1 {
        parts.push(format!("--grad-accum {}", ask.grad_accum));
    }
    parts.join(" ")
}

/// The packages the job needs: `pip install torch transformers` and, for
/// adapters, peft (and bitsandbytes for QLoRA).
pub fn install_command(job: &str) -> String {
    let mut packages = vec!["torch", "transformers"];
    if matches!(job, "lora" | "qlora") {
        packages.push("peft");
    }
    if job == "qlora" {
        packages.push("bitsandbytes");
    }
    format!("pip install {}", packages.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_names_the_job_and_only_what_differs_from_the_defaults() {
        let ask = CaptureAsk::default();
        assert_eq!(
            capture_command(&ask),
            "python memcast_capture.py meta-llama/Llama-3.1-8B --job train --precision bf16-mixed --seq-len 4096"
        );
        let generate = CaptureAsk {
            model: "gpt2".into(),
            job: "generate".into(),
            precision: "fp32".into(),
            batch: 8,
            seq_len: 512,
            new_tokens: 1024,
            checkpointing: true,
            ..CaptureAsk::default()
        };
        assert_eq!(
            capture_command(&generate),
            "python memcast_capture.py gpt2 --job generate --batch 8 --seq-len 512 --new-tokens 1024"
        );
        let odd = CaptureAsk {
            model: "my model's dir/config.json".into(),
            job: "qlora".into(),
            optimizer: "sgd".into(),
            grad_accum: 4,
            checkpointing: true,
            ..CaptureAsk::default()
        };
        assert_eq!(
            capture_command(&odd),
            r"python memcast_capture.py 'my model'\''s dir/config.json' --job qlora --optimizer sgd --precision bf16-mixed --seq-len 4096 --checkpointing --grad-accum 4"
        );
        assert_eq!(
            install_command("qlora"),
            "pip install torch transformers peft bitsandbytes"
        );
        assert_eq!(
            install_command("inference"),
            "pip install torch transformers"
        );
    }
}
