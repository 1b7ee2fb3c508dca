//! The page: a drop zone and a file picker that hand the file to the worker,
//! and the worker's answer.

use leptos::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{Blob, File, HtmlInputElement, Worker};

use super::bridge;
use crate::protocol::{Request, Response};

/// What the page shows, as plain values.
#[derive(Debug, Clone, PartialEq)]
enum Status {
    /// The worker has not said "ready" yet.
    Starting,
    /// Waiting for a file.
    Idle,
    /// The worker is reading a file.
    Working {
        stage: String,
        done_bytes: u64,
        total_bytes: u64,
    },
}

/// Mounts the app on `<body>` and removes the static loading placeholder.
pub fn mount() {
    console_error_panic_hook::set_once();
    if let Some(loading) = document().get_element_by_id("loading") {
        loading.remove();
    }
    leptos::mount::mount_to_body(App);
}

/// The root component.
#[component]
fn App() -> impl IntoView {
    let status = RwSignal::new(Status::Starting);
    let file_info = RwSignal::new(None::<(String, u64, bool)>);
    let error = RwSignal::new(None::<String>);
    let job = StoredValue::new(0u32);

    let on_response = move |response: Response| match response {
        Response::Ready => status.set(Status::Idle),
        Response::Progress {
            stage,
            done_bytes,
            total_bytes,
            ..
        } => status.set(Status::Working {
            stage,
            done_bytes,
            total_bytes,
        }),
        Response::FileInfo {
            name,
            size_bytes,
            gzip,
            ..
        } => {
            status.set(Status::Idle);
            error.set(None);
            file_info.set(Some((name, size_bytes, gzip)));
        }
        Response::Failed { message, .. } => {
            status.set(Status::Idle);
            error.set(Some(message));
        }
    };
    let worker = match bridge::spawn(on_response) {
        Ok(worker) => Some(worker),
        Err(message) => {
            error.set(Some(message));
            None
        }
    };
    let worker = StoredValue::new_local(worker);

    let submit = move |file: File| {
        if status.get_untracked() == Status::Starting {
            error.set(Some(
                "the worker is still loading; try again in a moment".into(),
            ));
            return;
        }
        let next = job.get_value().wrapping_add(1);
        job.set_value(next);
        let blob: &Blob = file.as_ref();
        let sent = worker.with_value(|worker: &Option<Worker>| match worker {
            Some(worker) => bridge::post(worker, &Request::Inspect { job: next }, blob),
            None => Err("the worker could not start; reload the page".into()),
        });
        match sent {
            Ok(()) => status.set(Status::Working {
                stage: "sending".into(),
                done_bytes: 0,
                total_bytes: file.size() as u64,
            }),
            Err(message) => error.set(Some(message)),
        }
    };

    let on_pick = move |ev: leptos::ev::Event| {
        let Some(input) = ev
            .target()
            .and_then(|t| t.dyn_into::<HtmlInputElement>().ok())
        else {
            return;
        };
        if let Some(file) = input.files().and_then(|files| files.get(0)) {
            submit(file);
        }
        // Let the same file be picked again.
        input.set_value("");
    };
    let dragging = RwSignal::new(false);
    let on_drop = move |ev: leptos::ev::DragEvent| {
        ev.prevent_default();
        dragging.set(false);
        if let Some(file) = ev
            .data_transfer()
            .and_then(|transfer| transfer.files())
            .and_then(|files| files.get(0))
        {
            submit(file);
        }
    };

    view! {
        <header>
            <h1>"memcast"</h1>
            <p class="tagline">
                "How much GPU memory will your PyTorch training job need? Drop a CPU profiler trace to find out."
            </p>
        </header>
        <main>
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
            <p id="status" class="status">
                {move || match status.get() {
                    Status::Starting => "Starting the worker…".to_string(),
                    Status::Idle => "Ready.".to_string(),
                    Status::Working { stage, done_bytes, total_bytes } => {
                        format!("{stage}: {done_bytes} of {total_bytes} bytes")
                    }
                }}
            </p>
            {move || error.get().map(|message| view! { <p id="error" class="error" role="alert">{message}</p> })}
            {move || file_info.get().map(|(name, size_bytes, gzip)| view! {
                <section id="file-info" class="result">
                    <h2>"File"</h2>
                    <dl>
                        <dt>"Name"</dt><dd id="file-name">{name}</dd>
                        <dt>"Size"</dt><dd id="file-size">{format!("{size_bytes} bytes")}</dd>
                        <dt>"Compression"</dt><dd id="file-gzip">{if gzip { "gzip" } else { "none" }}</dd>
                    </dl>
                </section>
            })}
        </main>
    }
}
