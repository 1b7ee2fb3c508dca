//! The `memcast` command line: a thin shell over the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Estimate the GPU memory of a PyTorch training job from a CPU profiler trace.
#[derive(Debug, Parser)]
#[command(name = "memcast", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {}
}
