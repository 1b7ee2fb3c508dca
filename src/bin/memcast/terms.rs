//! The CLI's words for the settings core messages ask for: the core says
//! "set the number of iterations", the CLI adds `--iterations`.
//!
//! The integration tests include this file too, to compare the library's
//! reports with what the CLI prints.

use memcast::diag::{Setting, Warning};
use memcast::report::Report;

/// The flag that gives a setting.
pub fn flag(setting: Setting) -> &'static str {
    match setting {
        Setting::Iterations => "--iterations",
        Setting::CudaContext => "--context",
        Setting::BatchSizes => "--batch",
        Setting::TargetBatch => "--at",
        Setting::WorldSize => "--world-size",
        Setting::ParameterBytes => "--params",
        Setting::SequenceLength => "--seq-len",
        Setting::MemoryBudget => "--memory-budget",
    }
}

/// A warning as the CLI prints it: its closing request names the flag.
pub fn warning(warning: &mut Warning) {
    warning.message = warning.message_with(|setting| format!("pass it with {}", flag(setting)));
    warning.setting = None;
}

/// A report as the CLI prints it.
pub fn report(report: &mut Report) {
    report.warnings.iter_mut().for_each(warning);
}

/// An error line as the CLI prints it: the flag of the setting the core
/// message asks for, after the message.
pub fn error_line(err: &anyhow::Error) -> String {
    let setting = err.chain().find_map(|cause| {
        cause
            .downcast_ref::<memcast::Error>()
            .and_then(memcast::Error::setting)
            .or_else(|| {
                cause
                    .downcast_ref::<memcast::whatif::WhatIfError>()
                    .and_then(memcast::whatif::WhatIfError::setting)
            })
    });
    match setting {
        Some(setting) => format!("{err:#} ({})", flag(setting)),
        None => format!("{err:#}"),
    }
}
