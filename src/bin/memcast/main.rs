//! The `memcast` command line: a thin shell over the library.

// The command line is the one place that prints (conventions, guideline 1).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod presets;

/// Estimate the GPU memory of a PyTorch training job from a CPU profiler trace.
#[derive(Debug, Parser)]
#[command(name = "memcast", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the GPU presets (CUDA-visible bytes, context and cuBLAS workspace).
    Presets {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Presets { json } => presets::run(json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
