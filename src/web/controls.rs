//! The page's controls: the trace input, the worker's status line, the GPU
//! and allocator settings, and the what-if buttons. Each is a component that
//! owns its own transient state and reports what the user did through a
//! callback; the estimate's state lives in the page (`app.rs`).

use leptos::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{File, HtmlInputElement};

use super::whatif::WhatIfPanel;
use crate::presets::{self, PRESETS};
use crate::whatif::{WhatIfKind, WhatIfResult};

/// What the worker is doing, as the status line shows it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Status {
    /// The worker has not said "ready" yet.
    Starting,
    /// Waiting for input.
    Idle,
    /// The worker is busy.
    Working {
        label: String,
        done: u64,
        total: u64,
    },
}

/// The drop zone and file picker: hands the dropped or picked file on.
#[component]
pub(super) fn TraceInput(
    /// Called with the file the user dropped or picked.
    on_file: Callback<File>,
) -> impl IntoView {
    let dragging = RwSignal::new(false);
    let on_pick = move |ev: leptos::ev::Event| {
        let Some(target) = ev
            .target()
            .and_then(|t| t.dyn_into::<HtmlInputElement>().ok())
        else {
            return;
        };
        if let Some(file) = target.files().and_then(|files| files.get(0)) {
            on_file.run(file);
        }
        // Let the same file be picked again.
        target.set_value("");
    };
    let on_drop = move |ev: leptos::ev::DragEvent| {
        ev.prevent_default();
        dragging.set(false);
        if let Some(file) = ev
            .data_transfer()
            .and_then(|transfer| transfer.files())
            .and_then(|files| files.get(0))
        {
            on_file.run(file);
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
            <input id="file-input" type="file" accept=".json,.gz,application/json,application/gzip" on:change=on_pick />
            <span>"Drop a " <code>".json"</code> " or " <code>".json.gz"</code> " trace here, or choose a file"</span>
        </label>
    }
}

/// The worker's state: starting, ready, or working with its progress and a
/// cancel button.
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
            {move || match status.get() {
                Status::Starting => view! { <p id="status" class="status">"Starting the worker…"</p> }.into_any(),
                Status::Idle => view! { <p id="status" class="status">"Ready."</p> }.into_any(),
                Status::Working { label, done, total } => {
                    let percent = done.saturating_mul(100).checked_div(total).unwrap_or(0);
                    view! {
                        <p id="status" class="status">{format!("{label}… {percent}%")}</p>
                        <progress id="progress" max="100" value=percent.to_string()></progress>
                        <button id="cancel" type="button" on:click=cancel>"Cancel"</button>
                    }.into_any()
                }
            }}
        </div>
    }
}

/// The GPUs to compare (presets and custom capacities) and the allocator
/// settings; a change re-runs the simulation.
#[component]
pub(super) fn GpuSettings(
    /// The selected GPU specs (preset slugs or capacities), in order.
    selected: RwSignal<Vec<String>>,
    /// The `PYTORCH_CUDA_ALLOC_CONF` string.
    alloc_conf: RwSignal<String>,
    /// Where a bad custom capacity is reported.
    error: RwSignal<Option<String>>,
    /// Called after the GPUs or the allocator settings changed.
    on_change: Callback<()>,
) -> impl IntoView {
    let resimulate = move || on_change.run(());
    let toggle_gpu = move |slug: String, on: bool| {
        selected.update(|list| {
            list.retain(|s| s != &slug);
            if on {
                list.push(slug);
            }
        });
        resimulate();
    };
    let custom = RwSignal::new(String::new());
    let add_custom = move || {
        let text = custom.get_untracked().trim().to_string();
        if text.is_empty() {
            return;
        }
        match presets::parse_gpu(&text) {
            Ok(_) => {
                selected.update(|list| {
                    if !list.contains(&text) {
                        list.push(text.clone());
                    }
                });
                custom.set(String::new());
                resimulate();
            }
            Err(err) => error.set(Some(err.to_string())),
        }
    };
    view! {
    <section class="settings">
        <h2>"GPUs"</h2>
        <div id="gpu-list" class="gpu-list">
            {PRESETS.iter().map(|preset| {
                let slug = preset.slug.to_string();
                let checked_slug = slug.clone();
                let toggled_slug = slug.clone();
                view! {
                    <label class="gpu">
                        <input type="checkbox" value=slug.clone()
                            prop:checked=move || selected.with(|list| list.contains(&checked_slug))
                            on:change=move |ev| toggle_gpu(toggled_slug.clone(), event_target_checked(&ev)) />
                        {format!("{} ({:.1} GiB)", preset.slug, preset.cuda_visible.get() as f64 / crate::Bytes::GIB as f64)}
                    </label>
                }
            }).collect_view()}
            {move || selected.get().into_iter().filter(|spec| presets::find(spec).is_none()).map(|spec| {
                let toggled = spec.clone();
                view! {
                    <label class="gpu custom">
                        <input type="checkbox" checked=true on:change=move |ev| toggle_gpu(toggled.clone(), event_target_checked(&ev)) />
                        {spec}
                    </label>
                }
            }).collect_view()}
        </div>
        <form class="custom-gpu" on:submit=move |ev| { ev.prevent_default(); add_custom(); }>
            <label>"Custom capacity "
                <input id="custom-gpu" type="text" placeholder="e.g. 24GiB or 12884377600" prop:value=move || custom.get()
                    on:input=move |ev| custom.set(event_target_value(&ev)) />
            </label>
            <button type="submit">"Add"</button>
        </form>
        <form class="alloc-conf" on:submit=move |ev| { ev.prevent_default(); resimulate(); }>
            <label><code>"PYTORCH_CUDA_ALLOC_CONF"</code>" "
                <input id="alloc-conf" type="text" placeholder="default" prop:value=move || alloc_conf.get()
                    on:input=move |ev| alloc_conf.set(event_target_value(&ev)) />
            </label>
            <button type="submit">"Apply"</button>
        </form>
    </section>
    }
}

/// The what-if buttons and the last answer.
#[component]
pub(super) fn WhatIfSection(
    /// The last what-if answer, if any.
    result: RwSignal<Option<WhatIfResult>>,
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
            <p class="hint">"Each answer re-runs the orchestrated allocation sequence through the simulated allocator, on the first selected GPU's overheads."</p>
            <div class="whatif-buttons">
                <button id="whatif-alloc" type="button" on:click=move |_| run_whatif(WhatIfKind::Alloc)>"Allocator settings"</button>
                <button id="whatif-zero-grad" type="button" on:click=move |_| run_whatif(WhatIfKind::ZeroGrad)>"zero_grad placement"</button>
                <button id="whatif-batch" type="button" on:click=move |_| run_whatif(WhatIfKind::Batch)>"Largest batch"</button>
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
            {move || result.get().map(|result| view! { <WhatIfPanel result=result /> })}
        </section>
    }
}
