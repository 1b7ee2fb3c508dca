//! `memcast presets`: lists the GPU presets with their CUDA-visible bytes and
//! the device overheads assumed for each.

use std::fmt::Write as _;

use memcast::presets::{DeviceOverheads, OVERHEADS, PRESETS};
use memcast::Bytes;

/// Prints the preset table, or the presets as JSON with `json`.
pub fn run(json: bool) -> anyhow::Result<()> {
    let mut out = String::new();
    if json {
        let rows: Vec<serde_json::Value> = PRESETS
            .iter()
            .map(|preset| {
                let overheads = DeviceOverheads::for_arch(preset.arch);
                serde_json::json!({
                    "preset": preset.slug,
                    "name": preset.name,
                    "arch": preset.arch,
                    "compute_capability": format!("{}.{}", preset.compute_capability.0, preset.compute_capability.1),
                    "capacity_bytes": preset.cuda_visible,
                    "nvidia_smi_total_bytes": preset.nvidia_smi_total,
                    "context_bytes": overheads.context_bytes,
                    "cublas_workspace_bytes": overheads.cublas_workspace_bytes,
                    "cublas_workspaces": overheads.cublas_workspaces,
                    "source": preset.source,
                })
            })
            .collect();
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&rows)?);
        crate::write_stdout(&out);
        return Ok(());
    }
    let _ = writeln!(
        out,
        "{:<17} {:>10} {:>16}  {:<9} {:>4}  {:>11} {:>12}  name",
        "preset", "GiB", "bytes (CUDA)", "arch", "cc", "context MiB", "cuBLAS ws"
    );
    for preset in PRESETS {
        let overheads = DeviceOverheads::for_arch(preset.arch);
        let _ = writeln!(
            out,
            "{:<17} {:>10} {:>16}  {:<9} {:>4}  {:>11} {:>12}  {}",
            preset.slug,
            memcast::present::gib_number(preset.cuda_visible),
            preset.cuda_visible.get(),
            format!("{:?}", preset.arch).to_lowercase(),
            format!(
                "{}.{}",
                preset.compute_capability.0, preset.compute_capability.1
            ),
            overheads.context_bytes.get() / Bytes::MIB,
            overheads.cublas_workspace_bytes.get(),
            preset.name,
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Device overheads (per process; --context overrides the context):"
    );
    for row in OVERHEADS {
        let archs: Vec<String> = row
            .archs
            .iter()
            .map(|arch| format!("{arch:?}").to_lowercase())
            .collect();
        let _ = writeln!(
            out,
            "  {:>10} B  {} [{}]\n              source: {}",
            row.bytes.get(),
            row.item,
            archs.join(", "),
            row.source
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Capacities are CUDA-visible bytes (torch total_memory); they vary with driver, ECC, OS and displays.");
    let _ = writeln!(out, "Any capacity can be given instead of a preset: --gpu 24GiB, --gpu 80000MiB, --gpu 12884377600.");
    crate::write_stdout(&out);
    Ok(())
}
