//! `memcast batch`: peak memory as a function of the batch size, fitted on
//! two or more traces of the same job, and the largest batch per GPU.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use memcast::whatif::batch::{self, BatchInput, BatchSweep};
use memcast::Prepared;

use crate::settings::{LinkArgs, SettingsArgs};
use crate::whatif::mib;

/// Options of `memcast batch`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Two or more traces of the same job at different batch sizes (one
    /// trace gives a less certain, assumed model).
    #[arg(required = true, num_args = 1..)]
    traces: Vec<PathBuf>,
    /// A batch size to simulate; repeat for several. Default: powers of two
    /// up to four times the largest input batch, and on up to the largest
    /// batch that fits any of the GPUs (as the page's chart).
    #[arg(long = "at", value_name = "N")]
    at: Vec<u32>,
    /// The batch size of each trace, in order; default: read from the data
    /// loader's collate op in each trace.
    #[arg(long = "batch", value_name = "N")]
    batches: Vec<u32>,
    #[command(flatten)]
    settings: SettingsArgs,
    /// Print JSON (schema `memcast.batch/1`).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    link: LinkArgs,
}

/// Runs the batch what-if and prints it.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if !args.batches.is_empty() && args.batches.len() != args.traces.len() {
        anyhow::bail!(
            "--batch must be given once per trace: pass {} batch sizes, got {:?}",
            args.traces.len(),
            args.batches
        );
    }
    if args.link.link.is_some() && args.traces.len() != 1 {
        anyhow::bail!(
            "a link shows one trace's estimate and its batch curve: pass one trace with --link, got {}",
            args.traces.len()
        );
    }
    let settings = args.settings.settings();
    let config = args.settings.config()?;
    let mut prepared: Vec<Prepared> = Vec::with_capacity(args.traces.len());
    let mut known: Vec<Option<u32>> = Vec::with_capacity(args.traces.len());
    for (index, path) in args.traces.iter().enumerate() {
        let mut source = crate::source::FileSource::open(path)?;
        let trace = memcast::prepare_from(&mut source, &config, &mut |_| {})
            .with_context(|| format!("failed to prepare {path:?}"))?;
        known.push(args.batches.get(index).copied().or(trace.batch_size));
        prepared.push(trace);
    }
    let names: Vec<String> = args
        .traces
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let refs: Vec<&Prepared> = prepared.iter().collect();
    let batches = batch::complete_batch_sizes(&known, &refs, &names)?;
    let prepared: Vec<(u32, Prepared)> = batches.into_iter().zip(prepared).collect();
    let inputs: Vec<BatchInput<'_>> = prepared
        .iter()
        .map(|(batch, prepared)| BatchInput {
            batch: *batch,
            prepared,
        })
        .collect();
    let result = if args.at.is_empty() {
        batch::sweep_to_capacity(&inputs, &config)
    } else {
        batch::sweep(&inputs, &args.at, &config)
    }
    .context("failed to model the batch size")?;
    let mut out = String::new();
    if let (Some(base), [path], [(_, prepared)]) =
        (&args.link.link, args.traces.as_slice(), prepared.as_slice())
    {
        let report = memcast::estimate(prepared, &config, &mut |_| {})?.value;
        let trace = crate::settings::identify(path)?;
        let whatif = Some(memcast::whatif::WhatIfResult::Batch(result));
        out = crate::settings::link_line(base, trace, settings, &report, whatif);
    } else if args.json {
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&result)?);
    } else {
        print_table(&mut out, &result);
    }
    crate::write_stdout(&out);
    Ok(())
}

fn print_table(out: &mut String, result: &BatchSweep) {
    let m = &result.model;
    let _ = writeln!(
        out,
        "batch model ({}) — {} blocks: {} fixed, {} proportional, {} approximate, {} assumed; inputs at batch {}",
        result.certainty,
        m.blocks,
        m.fixed,
        m.proportional,
        m.approximate,
        m.assumed,
        result
            .inputs
            .iter()
            .map(|p| p.batch.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(out, "peaks on {} (MiB)", result.reference_gpu);
    let _ = writeln!(
        out,
        "  {:>8} {:>10} {:>10} {:>10}",
        "batch", "total", "reserved", "allocated"
    );
    for p in &result.points {
        let _ = writeln!(
            out,
            "  {:>8} {:>10} {:>10} {:>10}",
            p.batch,
            mib(p.peak_total_bytes),
            mib(p.peak_reserved_bytes),
            mib(p.peak_allocated_bytes)
        );
    }
    let _ = writeln!(out, "largest batch that fits");
    for max in &result.max_batch {
        let _ = writeln!(
            out,
            "  {:<17} {:>10} MiB  batch {:>8}  (peak {} MiB)",
            max.preset,
            mib(max.capacity_bytes),
            max.batch,
            mib(max.peak_total_bytes)
        );
    }
    for note in &result.notes {
        let _ = writeln!(out, "note: {note}");
    }
}
