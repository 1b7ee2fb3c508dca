//! The `memcast` command line: a thin shell over the library.

mod analyze;

use std::io::Write as _;
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
enum Command {
    /// Read a trace and show iterations, phases, blocks, parameters and layers.
    Analyze(analyze::AnalyzeArgs),
}

/// Writes command output; a closed pipe is not an error.
pub(crate) fn write_stdout(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Analyze(args) => analyze::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let _ = writeln!(std::io::stderr().lock(), "error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
