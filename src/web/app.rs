//! The page: input (drop zone, file picker, demo), the target GPU and the
//! GPUs to compare, progress and cancel, and the estimate: the answer first
//! (the target's verdict, the peak, where it fits), then its charts, tables
//! and permalink.
//!
//! Nothing the user gives is lost while the worker starts (or restarts after
//! a Cancel): a request made before the worker has said "ready" waits in a
//! one-place queue and is sent when it does; the status line says so.
//!
//! The verdict never passes for an answer to settings it was not computed
//! with: whenever the fields ask for something else (an edit not yet
//! applied, a Cancel, a refusal, a crashed worker, a shared link edited),
//! the verdict is greyed and says which settings it answers, with the fields'
//! values beside them. A worker that dies (WebAssembly out of memory, a bug)
//! is replaced by a fresh one, and the error says so.

use leptos::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Blob, File, Worker};

use super::autocast::{AutocastChoice, AutocastForm};
use super::bridge;
use super::controls::{Status, StatusLine, TraceInput, WhatIfSection};
use super::gpus::{Choice, GpuChooser};
use super::guide::CaptureGuide;
use super::params::{ParamFigures, ParamsForm, RunOptions, RunOptionsForm};
use super::results::{Results, Shown, Verdict};
use super::scale::{ScaleChoice, ScaleForm, TraceFacts};
use crate::permalink::{self, Shared};
use crate::pipeline::{Config, Settings};
use crate::protocol::{Request, Response, WorkStage};
use crate::whatif::{WhatIfKind, WhatIfResult};

/// The demo trace, a real fixture shipped with the site (`www/demo/`).
const DEMO_URL: &str = "./demo/resnet18_sgd_bs16_pos1.json.gz";
const DEMO_NAME: &str = "resnet18_sgd_bs16_pos1.json.gz";

/// The most traces of one job the page takes together (the CLI's limit).
const MAX_FILES: usize = 3;

/// The file the current estimate came from (or the files: one job traced at
/// different sequence lengths), kept to re-run after a cancel or with other
/// choices.
#[derive(Clone)]
struct Input {
    blobs: Vec<Blob>,
    /// One name per blob, in order.
    names: Vec<String>,
    /// Which files these are (`Request::Run`'s `files`): a number no other
    /// files given to this page have.
    serial: u32,
}

/// The last [`Input::serial`] given.
static LAST_SERIAL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Input {
    /// Files just given.
    fn new(blobs: Vec<Blob>, names: Vec<String>) -> Input {
        let serial = LAST_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        Input {
            blobs,
            names,
            serial,
        }
    }

    /// One file.
    fn one(blob: Blob, name: String) -> Input {
        Input::new(vec![blob], vec![name])
    }

    /// The names as the page shows them (and the permalink joins them).
    fn label(&self) -> String {
        self.names.join(" + ")
    }
}

/// A request made before the worker was ready.
#[derive(Clone)]
enum Queued {
    Run(Input),
    Resimulate,
    WhatIf(WhatIfKind),
}

impl Queued {
    /// What the status line says is waiting.
    fn label(&self) -> String {
        match self {
            Queued::Run(input) => input.label(),
            Queued::Resimulate => "the new settings".into(),
            Queued::WhatIf(_) => "the what-if".into(),
        }
    }

    /// A new request replaces the waiting one unless the waiting one is a
    /// file and the new one is not (settings are read when a request is
    /// sent, so a file run also applies them).
    fn merge(waiting: Option<Queued>, new: Queued) -> Queued {
        match (waiting, new) {
            (Some(Queued::Run(input)), Queued::Resimulate | Queued::WhatIf(_)) => {
                Queued::Run(input)
            }
            (_, new) => new,
        }
    }
}

/// Mounts the app on `<body>` and removes the static loading placeholder.
pub fn mount() {
    console_error_panic_hook::set_once();
    if let Some(loading) = document().get_element_by_id("loading") {
        loading.remove();
    }
    leptos::mount::mount_to_body(App);
}

/// The page's own address, without a fragment.
fn page_url() -> String {
    let href = window().location().href().unwrap_or_default();
    href.split_once('#')
        .map_or(href.as_str(), |(page, _)| page)
        .to_owned()
}

/// Puts `link` in the address bar without a navigation.
fn show_link(link: &str) {
    if let Ok(history) = window().history() {
        let _ = history.replace_state_with_url(&wasm_bindgen::JsValue::NULL, "", Some(link));
    }
}

/// Takes from `last` the choices its orchestration was made with (the
/// parameter figures, the autocast choices, and the depth and length its
/// trace was rebuilt for).
fn orchestrated_as(settings: &mut Settings, last: &Settings) {
    settings.params.clone_from(&last.params);
    settings.frozen_params.clone_from(&last.frozen_params);
    settings.keep_cpu_dtypes = last.keep_cpu_dtypes;
    settings.autocast_dtype.clone_from(&last.autocast_dtype);
    settings.autocast_policy.clone_from(&last.autocast_policy);
    settings.grad_scaler = last.grad_scaler;
    settings.layers = last.layers;
    settings.seq_len = last.seq_len;
    settings.new_tokens = last.new_tokens;
    settings.iterations = last.iterations;
    settings.captured_optimizer = last.captured_optimizer;
}

/// Crashes in a row (no "ready" between them) after which the page stops
/// starting workers: a worker that cannot start would crash forever.
const MAX_CRASHES: u32 = 3;

/// The root component.
#[component]
fn App() -> impl IntoView {
    let status = RwSignal::new(Status::Starting { waiting: None });
    let shown = RwSignal::new(None::<Shown>);
    let error = RwSignal::new(None::<String>);
    let choice = Choice::new();
    let figures = ParamFigures::new();
    let autocast = AutocastChoice::new();
    let scale = ScaleChoice::new();
    let options = RunOptions::new();
    // Crashes since the last worker said "ready".
    let crashes = StoredValue::new(0u32);
    // Files dropped together that wait for a sequence length (their names).
    let pending = RwSignal::new(None::<String>);
    // Settings the page has no control for (from a permalink made with
    // other options); the page's choices override the GPUs and allocator.
    let base = StoredValue::new(Settings::default());
    let whatif_result = RwSignal::new(None::<WhatIfResult>);
    let link = RwSignal::new(String::new());
    let job = StoredValue::new(0u32);
    // The settings the current job was sent with.
    let job_settings = StoredValue::new(Settings::default());
    let worker = StoredValue::new_local(None::<Worker>);
    let ready = StoredValue::new(false);
    let queued = StoredValue::new_local(None::<Queued>);
    let input = StoredValue::new_local(None::<Input>);

    // A permalink in the URL: show the shared estimate at once (no worker
    // needed) and restore the choices it was made with.
    let href = window().location().href().unwrap_or_default();
    if href.contains('#') && !href.ends_with('#') {
        match permalink::decode(&href) {
            Ok(shared) => {
                choice.restore(&shared.settings.gpus, &shared.settings.alloc_conf);
                figures.restore(
                    shared.settings.params.as_deref(),
                    shared.settings.frozen_params.as_deref(),
                );
                autocast.restore(&shared.settings);
                scale.restore(&shared.settings);
                options.restore(&shared.settings);
                base.set_value(shared.settings.clone());
                whatif_result.set(shared.whatif.clone());
                link.set(href.clone());
                shown.set(Some(Shown {
                    trace: shared.trace,
                    settings: shared.settings,
                    report: shared.report,
                    shared: true,
                }));
            }
            Err(err) => error.set(Some(err.to_string())),
        }
    }

    let settings = move || -> Result<Settings, String> {
        let (params, frozen_params) = figures.get();
        let mut settings = Settings {
            gpus: choice.gpus(),
            alloc_conf: choice.alloc_conf.get_untracked(),
            params,
            frozen_params,
            ..base.get_value()
        };
        autocast.apply_to(&mut settings);
        scale.apply_to(&mut settings)?;
        options.apply_to(&mut settings)?;
        Ok(settings)
    };
    // What the fields ask for, following every field.
    let asked = Memo::new(move |_| {
        choice.track();
        figures.track();
        autocast.track();
        scale.track();
        options.track();
        settings()
    });
    // The choices the estimate shown was not made with (empty: it answers
    // the fields).
    let mismatch = Signal::derive(move || {
        shown.with(|s| {
            let Some(s) = s else {
                return Ok(Vec::new());
            };
            asked.with(|a| match a {
                Ok(a) => Ok(crate::present::changed(&s.settings, a)),
                Err(message) => Err(message.clone()),
            })
        })
    });
    let restore_fields = Callback::new(move |()| {
        let Some(current) = shown.get_untracked() else {
            return;
        };
        let settings = &current.settings;
        choice.restore(&settings.gpu_specs(), &settings.alloc_conf);
        figures.restore(
            settings.params.as_deref(),
            settings.frozen_params.as_deref(),
        );
        autocast.restore(settings);
        scale.restore(settings);
        options.restore(settings);
        error.set(None);
    });
    let next_job = move || {
        let next = job.get_value().wrapping_add(1);
        job.set_value(next);
        next
    };
    let working = move |label: &str| {
        status.set(Status::Working {
            label: label.into(),
            step: None,
            done: 0,
            total: 0,
        })
    };
    // Builds a request from the current settings and posts it; says whether it
    // went out (a failure is shown as the page's error). Only a run of the
    // trace takes the forms' parameter figures, autocast choices, layers and
    // sequence length; a re-simulation or what-if reuses the trace's
    // orchestration, so it keeps the ones that made it (and its link carries
    // those).
    let post_request =
        move |build: &dyn Fn(u32, Config) -> Request, files: &[Blob], run: bool| -> bool {
            let sent = settings().and_then(|mut chosen| {
                if !run {
                    job_settings.with_value(|last| orchestrated_as(&mut chosen, last));
                }
                let config = chosen.config().map_err(|err| err.to_string())?;
                let request = build(next_job(), config);
                job_settings.set_value(chosen);
                worker.with_value(|worker| match worker {
                    Some(worker) => bridge::post(worker, &request, files),
                    None => Err("the worker is not running; reload the page".into()),
                })
            });
            match sent {
                Ok(()) => true,
                Err(message) => {
                    error.set(Some(message));
                    false
                }
            }
        };
    let dispatch = move |request: Queued| match request {
        Queued::Run(file) => {
            let build = |job, config| Request::Run {
                job,
                names: file.names.clone(),
                files: file.serial,
                config,
            };
            if post_request(&build, &file.blobs, true) {
                let several = file.blobs.len() > 1;
                input.set_value(Some(file));
                pending.set(None);
                working(if several {
                    "Sending the files"
                } else {
                    "Sending the file"
                });
            }
        }
        Queued::Resimulate => {
            if post_request(
                &|job, config| Request::Resimulate { job, config },
                &[],
                false,
            ) {
                working("Simulating");
            }
        }
        Queued::WhatIf(what) => {
            if post_request(
                &|job, config| Request::WhatIf { job, what, config },
                &[],
                false,
            ) {
                working("Simulating the what-if");
            }
        }
    };
    // Sends a request now, or keeps it until the worker is ready.
    let submit = move |request: Queued| {
        if ready.get_value() {
            dispatch(request);
            return;
        }
        let waiting = Queued::merge(queued.get_value(), request);
        status.set(Status::Starting {
            waiting: Some(waiting.label()),
        });
        queued.set_value(Some(waiting));
    };
    let resimulate = move || {
        if shown.with_untracked(|s| s.is_none()) {
            return;
        }
        submit(Queued::Resimulate);
    };
    let run_whatif = move |what: WhatIfKind| {
        if shown.with_untracked(|s| s.as_ref().is_none_or(|s| s.shared)) {
            error.set(Some(
                "what-ifs need the trace: drop it (or try the demo) first".into(),
            ));
            return;
        }
        submit(Queued::WhatIf(what));
    };
    // The permalink of what is on screen, in the address bar and the share box.
    let relink = move || {
        let Some(current) = shown.get_untracked() else {
            return;
        };
        let shared = Shared::new(current.trace, current.settings, &current.report)
            .with_whatif(whatif_result.get_untracked());
        let url = permalink::link(&page_url(), &shared);
        show_link(&url);
        link.set(url);
    };

    let on_response = move |response: Response| {
        let current = job.get_value();
        match response {
            Response::Ready => {
                ready.set_value(true);
                crashes.set_value(0);
                match queued.get_value() {
                    Some(request) => {
                        queued.set_value(None);
                        dispatch(request);
                    }
                    None => {
                        if matches!(status.get_untracked(), Status::Starting { .. }) {
                            status.set(Status::Idle);
                        }
                    }
                }
            }
            Response::Progress {
                job: of,
                stage,
                done,
                total,
            } if of == current => status.set(Status::Working {
                label: stage.label().into(),
                step: match stage {
                    WorkStage::Pipeline(stage) => Some(stage.index()),
                    WorkStage::SimulatingShared => Some(crate::pipeline::Stage::Simulating.index()),
                },
                done,
                total,
            }),
            Response::Done {
                job: of,
                trace,
                report,
            } if of == current => {
                status.set(Status::Idle);
                error.set(None);
                whatif_result.set(None);
                // A trace made by the capture helper answers for the full
                // job it names: the settings (and the fields left blank)
                // take the figures the estimate took.
                let mut answered = job_settings.get_value();
                answered.adopt_capture(report.summary.capture.as_deref());
                scale.fill_blank(&answered);
                if answered.autocast_dtype != job_settings.with_value(|s| s.autocast_dtype.clone())
                    || answered.grad_scaler != job_settings.with_value(|s| s.grad_scaler)
                {
                    autocast.restore(&answered);
                }
                job_settings.set_value(answered.clone());
                shown.set(Some(Shown {
                    trace,
                    settings: answered,
                    report: *report,
                    shared: false,
                }));
                relink();
            }
            Response::WhatIf { job: of, result } if of == current => {
                status.set(Status::Idle);
                error.set(None);
                whatif_result.set(Some(*result));
                relink();
            }
            Response::NeedTrace { job: of } if of == current => match input.get_value() {
                Some(file) => submit(Queued::Run(file)),
                None => {
                    status.set(Status::Idle);
                    error.set(Some(
                        "this is a shared estimate: drop its trace to compute it for other GPUs or settings"
                            .into(),
                    ));
                }
            },
            Response::Failed { job: of, message } if of == current || of == 0 => {
                if ready.get_value() {
                    status.set(Status::Idle);
                }
                error.set(Some(message));
            }
            // A stale answer to a cancelled job.
            _ => {}
        }
    };
    // Set once the crash handler below exists (it starts workers itself).
    let on_crash_slot = StoredValue::new_local(None::<std::rc::Rc<dyn Fn(String)>>);
    let start_worker = move || {
        ready.set_value(false);
        let on_crash = move |message: String| {
            on_crash_slot.with_value(|slot| {
                if let Some(handler) = slot {
                    handler(message);
                }
            });
        };
        match bridge::spawn(on_response, on_crash) {
            Ok(started) => worker.set_value(Some(started)),
            Err(message) => error.set(Some(message)),
        }
    };
    // A worker that died: say what was running, keep the estimate shown
    // (the banner says which settings it answers) and start a fresh one.
    let crashed = move |message: String| {
        let during = match status.get_untracked() {
            Status::Working { label, .. } => format!(" while {}", label.to_lowercase()),
            Status::Starting {
                waiting: Some(name),
            } => format!(" before {name} could run"),
            _ => String::new(),
        };
        worker.update_value(|worker| {
            if let Some(worker) = worker.take() {
                worker.terminate();
            }
        });
        queued.set_value(None);
        next_job();
        let count = crashes.get_value() + 1;
        crashes.set_value(count);
        let kept = if shown.with_untracked(Option::is_some) {
            "The estimate shown is the previous one."
        } else {
            "Nothing was estimated."
        };
        if count >= MAX_CRASHES {
            status.set(Status::Idle);
            error.set(Some(format!(
                "The worker stopped{during} ({message}) {count} times in a row: reload the page. {kept}"
            )));
            return;
        }
        error.set(Some(format!(
            "The worker stopped{during} ({message}): the browser most likely ran out of memory for this job. A fresh worker has started. {kept} Try fewer layers, a shorter length or fewer new tokens, or the CLI (memcast estimate), which has no such limit."
        )));
        status.set(Status::Starting { waiting: None });
        start_worker();
    };
    on_crash_slot.set_value(Some(std::rc::Rc::new(crashed)));
    start_worker();

    let cancel = move |()| {
        error.set(Some(
            if shown.with_untracked(Option::is_some) {
                "Cancelled: nothing new was estimated, and the estimate shown is the previous one."
            } else {
                "Cancelled: nothing was estimated."
            }
            .into(),
        ));
        if !ready.get_value() {
            // Nothing runs yet: forget what waits, let the worker start.
            queued.set_value(None);
            status.set(Status::Starting { waiting: None });
            return;
        }
        worker.update_value(|worker| {
            if let Some(worker) = worker.take() {
                worker.terminate();
            }
        });
        next_job();
        status.set(Status::Starting { waiting: None });
        start_worker();
    };

    // One file runs at once. Two or three are one job at different sequence
    // lengths: they run once a length to estimate is typed (kept until then,
    // and run by the form's Apply).
    let submit_files = move |files: Vec<File>| {
        if files.is_empty() {
            return;
        }
        if files.len() > MAX_FILES {
            error.set(Some(format!(
                "{} files were given: drop one trace, or two or three traces of one job at different sequence lengths",
                files.len()
            )));
            return;
        }
        let names = files.iter().map(File::name).collect();
        let blobs = files.into_iter().map(Blob::from).collect();
        let given = Input::new(blobs, names);
        pending.set(None);
        if given.blobs.len() > 1 && !scale.has_length() {
            error.set(None);
            pending.set(Some(given.label()));
            input.set_value(Some(given));
            return;
        }
        submit(Queued::Run(given));
    };
    let demo = move |_| {
        let starting = matches!(status.get_untracked(), Status::Starting { .. });
        if !starting {
            working("Loading the demo trace");
        }
        leptos::task::spawn_local(async move {
            match fetch_blob(DEMO_URL).await {
                Ok(blob) => {
                    pending.set(None);
                    submit(Queued::Run(Input::one(blob, DEMO_NAME.into())));
                }
                Err(message) => {
                    if ready.get_value() {
                        status.set(Status::Idle);
                    }
                    error.set(Some(message));
                }
            }
        });
    };
    let changed = Callback::new(move |()| resimulate());
    // Parameter figures, autocast choices, layers and sequence length change
    // the orchestrated schedule: run the trace again.
    let rerun = Callback::new(move |()| match input.get_value() {
        // Several traces are estimated at a length only.
        Some(files) if files.blobs.len() > 1 && !scale.has_length() => {
            pending.set(Some(files.label()));
        }
        Some(file) => submit(Queued::Run(file)),
        None if shown.with_untracked(Option::is_some) => error.set(Some(
            "these choices need the trace: drop it (or try the demo) again".into(),
        )),
        None => {}
    });
    let failed = Callback::new(move |message: String| error.set(Some(message)));
    let trace_facts = Signal::derive(move || {
        shown.with(|s| {
            s.as_ref().map(|s| TraceFacts {
                traced: s.report.summary.traced.clone(),
                scaled: s.report.summary.scaled.clone(),
            })
        })
    });

    view! {
        <header>
            <h1>"memcast"</h1>
            <p class="tagline">
                "How much GPU memory will your PyTorch job need — training, fine-tuning or inference? Drop a CPU profiler trace to find out — it never leaves your browser."
            </p>
        </header>
        <main>
            <section class="input" class:compact=move || shown.with(Option::is_some)>
                <TraceInput on_files=Callback::new(submit_files) />
                <div class="actions">
                    <button id="demo" type="button" on:click=demo>"Try the demo"</button>
                    <CaptureGuide />
                </div>
                <StatusLine status=status on_cancel=Callback::new(cancel) />
                {move || error.get().map(|message| view! { <p id="error" class="error" role="alert">{message}</p> })}
            </section>

            {move || shown.get().map(|shown| view! { <Verdict shown=shown mismatch=mismatch apply=rerun restore=restore_fields /> })}

            <ScaleForm choice=scale facts=trace_facts pending=pending apply=rerun />

            <GpuChooser choice=choice changed=changed failed=failed />
            <ParamsForm figures=figures apply=rerun />
            <AutocastForm choice=autocast apply=rerun />
            <RunOptionsForm options=options apply=rerun />

            {move || shown.get().map(|shown| view! { <Results shown=shown link=link /> })}

            {move || {
                let computed = shown.with(|s| s.as_ref().is_some_and(|s| !s.shared));
                let target = shown.with(|s| s.as_ref().map(|s| s.report.reference_gpu.clone()).unwrap_or_default());
                (computed || whatif_result.with(Option::is_some)).then(|| view! {
                    <WhatIfSection result=whatif_result target=target can_ask=computed error=error on_run=Callback::new(run_whatif) />
                })
            }}
        </main>
        <footer>
            <p>"memcast runs entirely in this page: your trace is read by a Web Worker on this device and never uploaded. A shared link carries only the estimate."</p>
        </footer>
    }
}

async fn fetch_blob(url: &str) -> Result<Blob, String> {
    let response = JsFuture::from(window().fetch_with_str(url))
        .await
        .map_err(|err| format!("cannot load the demo trace: {err:?}"))?;
    let response: web_sys::Response = response
        .dyn_into()
        .map_err(|_| "cannot load the demo trace: not a response".to_string())?;
    if !response.ok() {
        return Err(format!(
            "cannot load the demo trace: HTTP {}",
            response.status()
        ));
    }
    let blob = response
        .blob()
        .map_err(|err| format!("cannot load the demo trace: {err:?}"))?;
    JsFuture::from(blob)
        .await
        .map_err(|err| format!("cannot load the demo trace: {err:?}"))?
        .dyn_into::<Blob>()
        .map_err(|_| "cannot load the demo trace: not a file".to_string())
}
