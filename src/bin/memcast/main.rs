//! The `memcast` command line: a thin shell over the library.
// The binary is the place that prints; the core never does.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod replay;

/// Estimate the GPU memory of a PyTorch training job from a CPU profiler trace.
#[derive(Debug, Parser)]
#[command(name = "memcast", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay real GPU allocator data (memory snapshot or profiler trace) through the simulator.
    Replay(replay::ReplayArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Replay(args) => replay::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
