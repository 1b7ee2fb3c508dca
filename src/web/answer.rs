//! The first screen's answer: whether the job fits the target GPU (with its
//! headroom or shortfall), the peak, and the GPUs it fits on, smallest
//! first — before the details. Display only: every number is the report's.

use leptos::prelude::*;

use super::format::{exact, gib, short};
use crate::report::{GpuVerdict, Report};

/// How many fitting GPUs the answer names before "and N more".
const FITS_SHOWN: usize = 6;

/// The verdict sentence for the target GPU.
fn verdict(target: Option<&GpuVerdict>, reference: &str) -> (String, &'static str) {
    match target {
        Some(gpu) if gpu.fits => (
            format!(
                "Fits on {} — {} free of {}",
                gpu.preset,
                short(gpu.headroom_bytes.unwrap_or_default()),
                short(gpu.capacity_bytes)
            ),
            "fits",
        ),
        Some(gpu) => (
            format!(
                "Out of memory on {} — needs {} more than its {}",
                gpu.preset,
                short(gpu.shortfall_bytes.unwrap_or_default()),
                short(gpu.capacity_bytes)
            ),
            "oom",
        ),
        None => (format!("Peak on {reference}"), ""),
    }
}

/// The GPUs the job fits on, smallest capacity first, by name (their
/// capacities are in the GPU table).
fn fits_on(report: &Report) -> String {
    let mut fitting: Vec<&GpuVerdict> = report.gpus.iter().filter(|g| g.fits).collect();
    if fitting.is_empty() {
        return "none of the GPUs chosen".into();
    }
    fitting.sort_by_key(|g| (g.capacity_bytes, g.preset.clone()));
    let mut names: Vec<String> = fitting
        .iter()
        .take(FITS_SHOWN)
        .map(|g| g.preset.clone())
        .collect();
    if fitting.len() > FITS_SHOWN {
        names.push(format!("and {} more", fitting.len() - FITS_SHOWN));
    }
    names.join(", ")
}

/// The answer card.
#[component]
pub fn Answer(
    /// The estimate shown.
    report: Report,
) -> impl IntoView {
    let target = report
        .gpus
        .iter()
        .find(|g| g.preset == report.reference_gpu);
    let (sentence, class) = verdict(target, &report.reference_gpu);
    let peak = report.peak.clone();
    let out_of_memory: Vec<String> = report
        .gpus
        .iter()
        .filter(|g| !g.fits)
        .map(|g| g.preset.clone())
        .collect();
    view! {
        <section id="answer" class=format!("answer {class}")>
            <p id="verdict" class="verdict">{sentence}</p>
            <p class="headline">
                <span class="label">"Peak GPU memory "</span>
                <span id="peak-total-gib" class="big">{gib(peak.total_bytes)}</span>
                " "<span id="peak-total-bytes" class="exact">{exact(peak.total_bytes)}</span>
                <span class="parts">{format!(" = reserved {} + CUDA context {}", short(peak.reserved_bytes), short(peak.context_bytes))}</span>
            </p>
            <p class="where"><span class="label">"Fits on: "</span><span id="fits-on">{fits_on(&report)}</span></p>
            {(!out_of_memory.is_empty()).then(|| view! {
                <p class="where"><span class="label">"Out of memory on: "</span><span id="oom-on">{out_of_memory.join(", ")}</span></p>
            })}
        </section>
    }
}
