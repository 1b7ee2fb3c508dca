//! Warnings that travel next to results.
//!
//! Broken or surprising input that still lets a stage produce a result becomes a
//! [`Warning`] instead of an error. Every stage appends to the same list, which
//! ends up in the report, so the user sees what was inferred or missing.
//!
//! Core messages speak the user's terms: when one asks for a value the user
//! can give, it names the [`Setting`] ("set the number of iterations"), and
//! each shell adds how to give it there (a command-line flag, a field).

use serde::{Deserialize, Serialize};

/// One non-fatal finding about the input or an inference a stage made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warning {
    /// A stable machine-readable code, e.g. `"free_of_unknown_block"`.
    pub code: String,
    /// One sentence for a person: what was found and what it means.
    pub message: String,
    /// The setting the message ends by asking for ([`Setting::request`]),
    /// for a shell to name its own control; absent from the JSON when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setting: Option<Setting>,
}

impl Warning {
    /// Creates a warning with a stable `code` and a human `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Warning {
        Warning {
            code: code.into(),
            message: message.into(),
            setting: None,
        }
    }

    /// A warning whose message (`body`) ends by asking for `setting`: the
    /// message is `body` followed by [`Setting::request`].
    pub fn asking(code: impl Into<String>, body: &str, setting: Setting) -> Warning {
        Warning {
            code: code.into(),
            message: format!("{body}{}", setting.request()),
            setting: Some(setting),
        }
    }

    /// The message with its closing request said the shell's way: `ask`
    /// turns the setting into the shell's words (e.g. `pass it with
    /// --context`). Messages that ask for nothing come back unchanged.
    pub fn message_with(&self, ask: impl Fn(Setting) -> String) -> String {
        match self.setting {
            Some(setting) => match self.message.strip_suffix(setting.request()) {
                Some(body) => format!("{body}{}", ask(setting)),
                None => self.message.clone(),
            },
            None => self.message.clone(),
        }
    }
}

/// A value the user can give to unblock or sharpen an estimate. The core
/// names it in the user's terms; each shell says how to give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Setting {
    /// How many training iterations to simulate.
    Iterations,
    /// The measured CUDA context size (memory outside the allocator).
    CudaContext,
    /// The batch size of each trace of a batch-size sweep.
    BatchSizes,
    /// A batch size to evaluate.
    TargetBatch,
    /// How many GPUs a distributed job runs on.
    WorldSize,
    /// The model's parameter bytes (all, and the frozen part), in place of
    /// what the trace shows.
    ParameterBytes,
    /// The sequence length of the job to estimate (several traces of one
    /// job at other lengths need it).
    SequenceLength,
    /// The memory an estimate may take (a rebuilt job larger than that is
    /// refused before it is built).
    MemoryBudget,
}

impl Setting {
    /// The setting in the user's terms.
    pub const fn in_user_terms(self) -> &'static str {
        match self {
            Setting::Iterations => "the number of iterations",
            Setting::CudaContext => "the CUDA context size",
            Setting::BatchSizes => "the batch size of each trace",
            Setting::TargetBatch => "the batch size to evaluate",
            Setting::WorldSize => "the number of GPUs",
            Setting::ParameterBytes => "the parameter bytes",
            Setting::SequenceLength => "the sequence length to estimate",
            Setting::MemoryBudget => "the memory budget",
        }
    }

    /// How a warning asking for the setting ends ([`Warning::asking`]).
    pub const fn request(self) -> &'static str {
        match self {
            Setting::Iterations => "set the number of iterations",
            Setting::CudaContext => "give it as the CUDA context size",
            Setting::BatchSizes => "give the batch size of each trace",
            Setting::TargetBatch => "set the batch size to evaluate",
            Setting::WorldSize => "set the number of GPUs",
            Setting::ParameterBytes => "give the parameter bytes yourself",
            Setting::SequenceLength => "set the sequence length to estimate",
            Setting::MemoryBudget => "raise the memory budget",
        }
    }
}

/// A value together with the warnings produced while computing it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Warned<T> {
    pub value: T,
    pub warnings: Vec<Warning>,
}

impl<T> Warned<T> {
    /// Wraps a value that produced no warning.
    pub fn clean(value: T) -> Warned<T> {
        Warned {
            value,
            warnings: Vec::new(),
        }
    }
}
