//! Warnings that travel next to results.
//!
//! Broken or surprising input that still lets a stage produce a result becomes a
//! [`Warning`] instead of an error. Every stage appends to the same list, which
//! ends up in the report, so the user sees what was inferred or missing.

use serde::{Deserialize, Serialize};

/// One non-fatal finding about the input or an inference a stage made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warning {
    /// A stable machine-readable code, e.g. `"free_of_unknown_block"`.
    pub code: String,
    /// One sentence for a person: what was found and what it means.
    pub message: String,
}

impl Warning {
    /// Creates a warning with a stable `code` and a human `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Warning {
        Warning {
            code: code.into(),
            message: message.into(),
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
