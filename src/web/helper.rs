//! The simulation helper: a nested worker (this same script, started under
//! [`NAME`]) that simulates some compared GPUs' runs at capacity on another
//! core while the worker simulates the others, as the CLI's threads do
//! ([`crate::pipeline::estimate_split`]); and the worker's side of it.
//!
//! The helper prepares the worker's job itself, from the same files and the
//! same settings (it cannot share the worker's memory): when the worker
//! starts a rebuilt job (whose simulations outweigh its preparation), it
//! asks the helper to prepare it too, beside its own preparation and its
//! unlimited runs; once those are done the worker hands the helper the GPUs
//! [`crate::pipeline::share_with_one`] picks, and finishes the report when
//! their runs come back. Runs are the same wherever they are simulated, so
//! the report is too.

use std::cell::{Cell, RefCell};

use js_sys::Reflect;
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{Blob, DedicatedWorkerGlobalScope, MessageEvent, Worker};

use super::worker;
use crate::pipeline::{self, Config, Prepared, Progress};
use crate::report::SimulatedRun;

/// The name of the helper worker.
pub(super) const NAME: &str = "memcast-simulator";

/// What the helper posts once its handler is installed.
const READY: &str = "simulator-ready";

/// Events the runs left to simulate must come to before the helper takes
/// some: about a second of the worker's simulating (0.1-0.3 µs an event),
/// more than the messages and the helper's own start cost.
pub(super) const MIN_SHARED_EVENTS: u64 = 1 << 23;

/// What the worker asks of the helper, as JSON beside the job's files.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Ask {
    pub(super) job: u32,
    /// The page's number for the files.
    pub(super) files: u32,
    /// The settings the worker prepared its job with.
    pub(super) prepared_with: Config,
    /// The settings it simulates with.
    pub(super) config: Config,
    /// The compared GPUs (indices in `config`) whose runs at capacity to
    /// simulate; `None`: only prepare the job.
    pub(super) gpus: Option<Vec<usize>>,
}

/// What the helper answers.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Answer {
    /// Of the events its runs take, `done` of `total` are simulated.
    Progress { job: u32, done: u64, total: u64 },
    /// The runs asked for, by GPU index, or why not.
    Runs {
        job: u32,
        runs: Result<Vec<(usize, SimulatedRun)>, String>,
    },
}

thread_local! {
    /// The helper, from its start until it fails.
    static HELPER: RefCell<Option<Helper>> = const { RefCell::new(None) };
    /// The job whose runs the helper has been handed (its answers to
    /// others are stale).
    static HANDED: Cell<Option<u32>> = const { Cell::new(None) };
    /// The helper's side: the job it prepared last, and the files it read.
    static KEPT: RefCell<Option<HelperKept>> = const { RefCell::new(None) };
}

/// The helper and whether it has said it is ready.
struct Helper {
    worker: Worker,
    ready: bool,
}

/// The helper's job: prepared from the page's files `files` with the
/// settings `with` (as JSON), and those files parsed where they are small.
struct HelperKept {
    files: u32,
    with: String,
    prepared: Option<Prepared>,
    parsed: Option<worker::Parsed>,
}

/// Whether the helper is there and ready.
pub(super) fn ready() -> bool {
    HELPER.with(|slot| slot.borrow().as_ref().is_some_and(|h| h.ready))
}

/// Sends the helper `ask` with the job's files; whether it was sent.
pub(super) fn ask(ask: &Ask, blobs: &[Blob]) -> bool {
    let Ok(text) = serde_json::to_string(ask) else {
        return false;
    };
    let sent = HELPER.with(|slot| {
        let slot = slot.borrow();
        let Some(helper) = slot.as_ref().filter(|h| h.ready) else {
            return false;
        };
        let message = js_sys::Object::new();
        let list: js_sys::Array = blobs.iter().collect();
        Reflect::set(&message, &"request".into(), &text.into()).is_ok()
            && Reflect::set(&message, &"files".into(), &list).is_ok()
            && helper.worker.post_message(&message).is_ok()
    });
    if sent && ask.gpus.is_some() {
        HANDED.set(Some(ask.job));
    }
    sent
}

/// The helper is still simulating runs nobody waits for (the page asked
/// something else): it is replaced by a new one, which starts idle.
pub(super) fn drop_handed(scope: &DedicatedWorkerGlobalScope) {
    if HANDED.take().is_none() {
        return;
    }
    if let Some(helper) = HELPER.with(|slot| slot.borrow_mut().take()) {
        helper.worker.terminate();
    }
    start(scope);
}

/// Starts the helper and routes its answers. Until it says it is ready, or
/// without one (a browser without nested workers, a helper that failed),
/// the worker simulates every run itself.
pub(super) fn start(scope: &DedicatedWorkerGlobalScope) {
    let Some(helper) = worker::start_nested(NAME) else {
        return;
    };
    let post_scope = scope.clone();
    let on_message = Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
        let post = |response| worker::post_to(&post_scope, response);
        let Some(text) = event.data().as_string() else {
            return;
        };
        if text == READY {
            HELPER.with(|slot| {
                if let Some(helper) = slot.borrow_mut().as_mut() {
                    helper.ready = true;
                }
            });
            return;
        }
        match serde_json::from_str::<Answer>(&text) {
            Ok(Answer::Progress { job, done, total }) if HANDED.get() == Some(job) => {
                super::sharing::helper_progress(job, done, total, &post);
            }
            Ok(Answer::Runs { job, runs }) if HANDED.get() == Some(job) => {
                HANDED.set(None);
                super::sharing::helper_runs(job, runs, &post);
            }
            _ => {}
        }
    });
    helper.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    // A helper that fails is dropped: a job waiting for it gets the runs
    // simulated here instead.
    let post_scope = scope.clone();
    let on_error = Closure::<dyn Fn(JsValue)>::new(move |_| {
        HELPER.with(|slot| *slot.borrow_mut() = None);
        if let Some(job) = HANDED.take() {
            let post = |response| worker::post_to(&post_scope, response);
            super::sharing::helper_runs(
                job,
                Err("the simulation helper stopped".to_owned()),
                &post,
            );
        }
    });
    helper.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    HELPER.with(|slot| {
        *slot.borrow_mut() = Some(Helper {
            worker: helper,
            ready: false,
        });
    });
}

/// The helper: prepares each job it is sent (unless it holds it already)
/// and simulates the runs asked for, in order.
pub(super) fn register(scope: &DedicatedWorkerGlobalScope) {
    let post_scope = scope.clone();
    let on_message = Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
        let data = event.data();
        let post = |answer: &Answer| {
            if let Ok(text) = serde_json::to_string(answer) {
                let _ = post_scope.post_message(&text.into());
            }
        };
        let ask = Reflect::get(&data, &"request".into())
            .ok()
            .and_then(|value| value.as_string())
            .and_then(|text| serde_json::from_str::<Ask>(&text).ok());
        let Some(ask) = ask else {
            return;
        };
        let blobs = worker::attached_blobs(&data).unwrap_or_default();
        let runs = serve(&ask, &blobs, &post);
        if let Some(runs) = runs {
            post(&Answer::Runs { job: ask.job, runs });
        }
    });
    scope.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let _ = scope.post_message(&READY.into());
}

/// Prepares `ask`'s job where the helper does not hold it, then simulates
/// the runs asked for (`None`: none were).
fn serve(
    ask: &Ask,
    blobs: &[Blob],
    post: &dyn Fn(&Answer),
) -> Option<Result<Vec<(usize, SimulatedRun)>, String>> {
    let with = serde_json::to_string(&ask.prepared_with).unwrap_or_default();
    let held = KEPT.with(|slot| {
        slot.borrow().as_ref().is_some_and(|kept| {
            kept.files == ask.files && kept.with == with && kept.prepared.is_some()
        })
    });
    if !held {
        let parsed = KEPT.with(|slot| {
            let mut slot = slot.borrow_mut();
            slot.take()
                .filter(|kept| kept.files == ask.files)
                .and_then(|kept| kept.parsed)
        });
        let prepared = prepare_files(blobs, parsed, &ask.prepared_with);
        let (prepared, parsed, error) = match prepared {
            Ok((prepared, parsed)) => (Some(prepared), parsed, None),
            Err(message) => (None, None, Some(message)),
        };
        KEPT.with(|slot| {
            *slot.borrow_mut() = Some(HelperKept {
                files: ask.files,
                with,
                prepared,
                parsed,
            });
        });
        if let (Some(message), Some(_)) = (error, &ask.gpus) {
            return Some(Err(message));
        }
    }
    let gpus = ask.gpus.as_ref()?;
    let job = ask.job;
    let mut last = 0u64;
    let mut progress = |p: Progress| {
        let percent = p.done.saturating_mul(100).checked_div(p.total).unwrap_or(0);
        if percent != last {
            last = percent;
            post(&Answer::Progress {
                job,
                done: p.done,
                total: p.total,
            });
        }
    };
    Some(KEPT.with(|slot| {
        let slot = slot.borrow();
        let prepared = slot
            .as_ref()
            .and_then(|kept| kept.prepared.as_ref())
            .ok_or_else(|| "the simulation helper holds no job".to_owned())?;
        pipeline::runs_at_capacity(
            prepared,
            &ask.config,
            gpus,
            &mut progress,
            &pipeline::InTurn,
        )
        .map_err(|err| err.to_string())
    }))
}

/// A job prepared from `blobs` with `config` (for the simulation helper):
/// from `parsed` where they are given, else read as the worker reads them
/// ([`worker::prepare_sources`]); returned with the traces parsed where
/// they are small enough to keep.
fn prepare_files(
    blobs: &[Blob],
    parsed: Option<worker::Parsed>,
    config: &Config,
) -> Result<(Prepared, Option<worker::Parsed>), String> {
    if let Some(parsed) = parsed {
        let prepared =
            pipeline::prepare_parsed(&parsed.traces, parsed.warnings.clone(), config, &mut |_| {})
                .map_err(|err| err.to_string())?;
        return Ok((prepared, Some(parsed)));
    }
    let mut sources = blobs
        .iter()
        .map(|blob| worker::BlobSource::new(blob.clone(), false))
        .collect::<Result<Vec<worker::BlobSource>, String>>()?;
    let (prepared, parsed) = worker::prepare_sources(&mut sources, config, &mut |_| {});
    Ok((prepared.map_err(|err| err.to_string())?, parsed))
}
