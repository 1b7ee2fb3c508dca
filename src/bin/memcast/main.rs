//! The `memcast` command line: a thin shell over the library.
// The binary is the place that prints; the core never does.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod analyze;
mod batch;
mod estimate;
mod events;
mod presets;
mod replay;
mod settings;
mod source;
mod terms;
mod whatif;

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Estimate the GPU memory of a PyTorch job (training, fine-tuning or inference) from a CPU profiler trace.
#[derive(Debug, Parser)]
#[command(name = "memcast", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Read a trace and show iterations, phases, blocks, parameters and layers.
    Analyze(analyze::AnalyzeArgs),
    /// Estimate the peak GPU memory of the profiled job.
    Estimate(estimate::Args),
    /// The simulated allocation sequence on the target GPU, event by event, with the allocator's state after each.
    Events(events::Args),
    /// List the GPU presets (CUDA-visible bytes, context and cuBLAS workspace).
    Presets {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Replay real GPU allocator data (memory snapshot or profiler trace) through the simulator.
    Replay(replay::ReplayArgs),
    /// Peak memory vs batch size from two or more traces, and the largest batch per GPU.
    Batch(batch::Args),
    /// What-if analyses of one trace: allocator settings, zero_grad placement.
    #[command(subcommand)]
    Whatif(whatif::WhatIf),
}

/// Writes command output; a closed pipe is not an error.
pub(crate) fn write_stdout(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Analyze(args) => analyze::run(args),
        Command::Estimate(args) => estimate::run(args),
        Command::Events(args) => events::run(args),
        Command::Presets { json } => presets::run(*json),
        Command::Replay(args) => replay::run(args),
        Command::Whatif(whatif) => whatif::run(whatif),
        Command::Batch(args) => batch::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let _ = writeln!(
                std::io::stderr().lock(),
                "error: {}",
                terms::error_line(&err)
            );
            ExitCode::FAILURE
        }
    }
}
