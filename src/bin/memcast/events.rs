//! `memcast events`: the simulated allocation sequence, event by event, on
//! the target GPU without a memory limit — to set beside a real run's
//! allocations (`benches/gpu/align.py`).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;

use crate::settings::SettingsArgs;

/// Options of `memcast events`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace written by `prof.export_chrome_trace` (`.json` or `.json.gz`).
    trace: PathBuf,
    #[command(flatten)]
    settings: SettingsArgs,
    /// Print JSON (schema `memcast.events/1`: the GPU and its events) instead of tab-separated columns.
    #[arg(long)]
    json: bool,
}

/// Prepares the trace and prints its events with the allocator's state
/// after each.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let config = args.settings.config()?;
    let mut source = crate::source::FileSource::open(&args.trace)?;
    let prepared = memcast::prepare_from(&mut source, &config, &mut |_| {})
        .with_context(|| format!("failed to prepare {:?}", args.trace))?;
    let rows = memcast::pipeline::event_rows(&prepared, &config)
        .with_context(|| format!("failed to list the events of {:?}", args.trace))?;
    let mut out = String::new();
    if args.json {
        let json = serde_json::json!({
            "schema": "memcast.events/1",
            "gpu": config.reference.name,
            "events": rows,
        });
        let _ = writeln!(out, "{}", serde_json::to_string(&json)?);
    } else {
        let _ = writeln!(
            out,
            "# {} on {}, without a memory limit",
            args.trace.display(),
            config.reference.name
        );
        let _ = writeln!(
            out,
            "index\ttime_ns\tkind\tblock\tbytes\tcategory\titeration\tphase\top\tlayer\taddress\tallocated\treserved"
        );
        for row in &rows {
            let _ = writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                row.index,
                row.time.get(),
                label(&row.kind),
                row.block,
                row.bytes.get(),
                label(&row.category),
                row.iteration
                    .map_or_else(|| "setup".to_owned(), |i| i.to_string()),
                label(&row.phase),
                row.op.as_deref().unwrap_or("-"),
                row.layer.as_deref().unwrap_or("-"),
                row.address
                    .map_or_else(|| "-".to_owned(), |a| format!("{a:#x}")),
                row.allocated.get(),
                row.reserved.get(),
            );
        }
    }
    crate::write_stdout(&out);
    Ok(())
}

/// A unit enum's name as its JSON says it (`alloc`, `activation`, `forward`).
fn label<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}
