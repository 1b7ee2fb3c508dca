//! The page's controls: the trace input, the worker's status line and the
//! what-if buttons (the GPU and allocator choices are in `gpus.rs`). Each
//! is a component that owns its own transient state and reports what the
//! user did through a callback; the estimate's state lives in the page
//! (`app.rs`).

use leptos::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{File, HtmlInputElement};

use super::whatif::WhatIfPanel;
use crate::pipeline::Stage;
use crate::whatif::{WhatIfKind, WhatIfResult};

/// What the worker is doing, as the status line shows it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Status {
    /// The worker has not said "ready" yet; `waiting` names what runs as
    /// soon as it has.
    Starting { waiting: Option<String> },
    /// Waiting for input.
    Idle,
    /// The worker is busy: on `step` of the pipeline's stages
    /// ([`Stage::ALL`]; `None` for work outside them), `done` of `total`
    /// units of it (a `total` of 0 or 1: no finer measure).
    Working {
        label: String,
        step: Option<usize>,
        done: u64,
        total: u64,
    },
}

impl Status {
    /// The whole run's progress in percent: each stage an equal share of the
    /// bar, a stage's measured part of its share; never 100 while the worker
    /// works (the last stage starts at 83 %). `None`: no measure at all.
    pub(super) fn overall_percent(step: Option<usize>, done: u64, total: u64) -> Option<u64> {
        let step = u64::try_from(step?).ok()?;
        let stages = Stage::ALL.len() as u64;
        let part = if total > 1 {
            done.min(total).saturating_mul(100) / total
        } else {
            0
        };
        Some(((step * 100 + part) / stages).min(99))
    }
}

/// The files of a `FileList`, in order.
fn all_files(files: Option<web_sys::FileList>) -> Vec<File> {
    let Some(files) = files else {
        return Vec::new();
    };
    (0..files.length()).filter_map(|i| files.get(i)).collect()
}

/// The drop zone and file picker: hands the dropped or picked files on
/// (one trace, or two or three of one job at different sequence lengths).
#[component]
pub(super) fn TraceInput(
    /// Called with the files the user dropped or picked, in order.
    on_files: Callback<Vec<File>>,
) -> impl IntoView {
    let dragging = RwSignal::new(false);
    let on_pick = move |ev: leptos::ev::Event| {
        let Some(target) = ev
            .target()
            .and_then(|t| t.dyn_into::<HtmlInputElement>().ok())
        else {
            return;
        };
        let files = all_files(target.files());
        if !files.is_empty() {
            on_files.run(files);
        }
        // Let the same file be picked again.
        target.set_value("");
    };
    let on_drop = move |ev: leptos::ev::DragEvent| {
        ev.prevent_default();
        dragging.set(false);
        let files = all_files(ev.data_transfer().and_then(|transfer| transfer.files()));
        if !files.is_empty() {
            on_files.run(files);
        }
    };
    view! {
        <label
            id="drop-zone"
            class="drop-zone"
            class:dragging=move || dragging.get()
            on:dragover=move |ev: leptos::ev::DragEvent| {
                ev.prevent_default();
                dragging.set(true);
            }
            on:dragleave=move |_| dragging.set(false)
            on:drop=on_drop
        >
            <input id="file-input" type="file" multiple accept=".json,.gz,application/json,application/gzip" on:change=on_pick />
            <span>"Drop a " <code>".json"</code> " or " <code>".json.gz"</code> " trace here, or choose a file"</span>
            <span class="hint">"(or two or three traces of one job at different sequence lengths, together)"</span>
        </label>
    }
}

/// The worker's state: starting (and what waits for it, which can be
/// cancelled), ready, or working with its progress and a cancel button.
#[component]
pub(super) fn StatusLine(
    /// What the worker is doing.
    status: RwSignal<Status>,
    /// Called when the user cancels the running job.
    on_cancel: Callback<()>,
) -> impl IntoView {
    let cancel = move |_| on_cancel.run(());
    view! {
        <div class="progress-line">
            // Outside the status's view, which is made again at every
            // progress message, and first on the line: the button stays the
            // same element, in the same place, while a job runs (the status
            // text beside it changes width), so a click lands on it.
            <Show when=move || matches!(status.get(), Status::Starting { waiting: Some(_) } | Status::Working { .. })>
                <button id="cancel" type="button" on:click=cancel>"Cancel"</button>
            </Show>
            {move || match status.get() {
                Status::Starting { waiting: None } => view! { <p id="status" class="status">"Starting the worker…"</p> }.into_any(),
                Status::Starting { waiting: Some(name) } => view! {
                    <p id="status" class="status">{format!("Starting the worker… {name} runs as soon as it is ready.")}</p>
                    <progress id="progress"></progress>
                }.into_any(),
                Status::Idle => view! { <p id="status" class="status">"Ready."</p> }.into_any(),
                Status::Working { label, step, done, total } => {
                    let overall = Status::overall_percent(step, done, total);
                    let of_stage = (total > 1 && done < total).then(|| done.saturating_mul(100) / total);
                    let text = match (step, of_stage) {
                        (Some(i), Some(p)) => format!("{label}… {p} % (step {} of {})", i + 1, Stage::ALL.len()),
                        (Some(i), None) => format!("{label}… (step {} of {})", i + 1, Stage::ALL.len()),
                        (None, _) => format!("{label}…"),
                    };
                    view! {
                        <p id="status" class="status">{text}</p>
                        {match overall {
                            Some(percent) => view! { <progress id="progress" max="100" value=percent.to_string()></progress> }.into_any(),
                            None => view! { <progress id="progress"></progress> }.into_any(),
                        }}
                    }.into_any()
                }
            }}
        </div>
    }
}

/// The what-if buttons (when the trace is in this browser) and the last
/// answer.
#[component]
pub(super) fn WhatIfSection(
    /// The last what-if answer, if any.
    result: RwSignal<Option<WhatIfResult>>,
    /// The target GPU, whose overheads every answer uses.
    target: String,
    /// Whether the buttons are offered (not for a shared estimate).
    can_ask: bool,
    /// Where a bad number of GPUs is reported.
    error: RwSignal<Option<String>>,
    /// Called with the what-if the user asked for.
    on_run: Callback<WhatIfKind>,
) -> impl IntoView {
    let world_size = RwSignal::new("8".to_string());
    let run_whatif = move |what: WhatIfKind| on_run.run(what);
    view! {
        <section id="whatifs" class="result">
            <h2>"What if…"</h2>
            <p class="hint">{format!("Each answer re-runs the orchestrated allocation sequence through the simulated allocator, with the target GPU's ({target}) CUDA context and cuBLAS workspaces.")}</p>
            {can_ask.then(|| view! {
            <div class="whatif-buttons">
                <button id="whatif-alloc" type="button" on:click=move |_| run_whatif(WhatIfKind::Alloc)>"Allocator settings"</button>
                <button id="whatif-zero-grad" type="button" on:click=move |_| run_whatif(WhatIfKind::ZeroGrad)>"zero_grad placement"</button>
                <button id="whatif-batch" type="button" on:click=move |_| run_whatif(WhatIfKind::Batch)>"Largest batch"</button>
                <button id="whatif-context" type="button" title="For a generate() trace: the most new tokens each GPU fits"
                    on:click=move |_| run_whatif(WhatIfKind::Context { budget: crate::whatif::context::DEFAULT_BUDGET })>"Longest generation"</button>
                <button id="whatif-plan" type="button" on:click=move |_| run_whatif(WhatIfKind::Plan)>"Planned allocation"</button>
                <button id="whatif-precision" type="button" on:click=move |_| run_whatif(WhatIfKind::Precision)>"Mixed precision"</button>
                <span class="distributed">
                    <button id="whatif-distributed" type="button" on:click=move |_| {
                        match world_size.get_untracked().trim().parse::<u32>() {
                            Ok(n) if n > 0 => run_whatif(WhatIfKind::Distributed { world_size: n }),
                            _ => error.set(Some("the number of GPUs must be a whole number of at least 1".into())),
                        }
                    }>"Distributed over"</button>
                    " "<input id="world-size" type="number" min="1" prop:value=move || world_size.get()
                        on:input=move |ev| world_size.set(event_target_value(&ev)) />" GPUs"
                </span>
            </div>
            })}
            {move || result.get().map(|result| view! { <WhatIfPanel result=result /> })}
        </section>
    }
}
