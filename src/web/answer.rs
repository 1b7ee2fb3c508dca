//! The first screen's answer: whether the job fits the target GPU (with its
//! headroom or shortfall), the peak, and the GPUs it fits on, smallest
//! first — before the details. Display only: every number is the report's.

use leptos::prelude::*;

use super::format::{exact, gib, short};
use crate::present::{margin_note, target_verdict};
use crate::report::{GpuVerdict, Margin, Report};

/// How many fitting GPUs the answer names before "and N more".
const FITS_SHOWN: usize = 6;

/// The GPUs the job fits on, smallest capacity first, by name (their
/// capacities are in the GPU table); a thin fit is marked.
fn fits_on(report: &Report) -> String {
    let mut fitting: Vec<&GpuVerdict> = report.gpus.iter().filter(|g| g.fits).collect();
    if fitting.is_empty() {
        return "none of the GPUs chosen".into();
    }
    fitting.sort_by_key(|g| (g.capacity_bytes, g.preset.clone()));
    let mut names: Vec<String> = fitting
        .iter()
        .take(FITS_SHOWN)
        .map(|g| {
            if g.margin == Margin::Thin {
                format!("{} (thin margin)", g.preset)
            } else {
                g.preset.clone()
            }
        })
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
    let (sentence, class) = target_verdict(&report)
        .unwrap_or_else(|| (format!("Peak on {}", report.reference_gpu), ""));
    let thin = report.gpus.iter().any(|g| g.margin == Margin::Thin);
    let note = report.error_band.as_ref().map(margin_note);
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
            {note.map(|note| view! { <p id="margin-note" class="margin-note" class:thin=thin>{note}</p> })}
            {(!out_of_memory.is_empty()).then(|| view! {
                <p class="where"><span class="label">"Out of memory on: "</span><span id="oom-on">{out_of_memory.join(", ")}</span></p>
            })}
        </section>
    }
}
