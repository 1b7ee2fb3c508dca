//! The hasher: a nested worker (this same script, started under [`NAME`])
//! that fingerprints (SHA-256) each job's files on the other core while the
//! worker runs the pipeline, and the worker's side of it: which job's files
//! it was handed, or is kept for it until it says it is ready.

use std::cell::RefCell;

use js_sys::Reflect;
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{Blob, DedicatedWorkerGlobalScope, MessageEvent, Worker};

use super::worker;
use crate::permalink::TraceIdentity;
use crate::protocol::Response;

/// The name of the helper worker that fingerprints (SHA-256) each file on
/// another core while this one runs the pipeline: hashing in turn took about
/// a third of the time on a large plain JSON file.
pub(super) const NAME: &str = "memcast-hasher";

/// What the hasher posts once its handler is installed.
const READY: &str = "hasher-ready";

thread_local! {
    /// The hasher, from its start until it fails.
    static HASHER: RefCell<Option<Hasher>> = const { RefCell::new(None) };
    /// The files of the job being run, when the hasher fingerprints them.
    static HASHING: RefCell<Option<Hashing>> = const { RefCell::new(None) };
}

/// The hasher and whether it has said it is ready: a message sent to a
/// worker before its handler is installed is lost.
struct Hasher {
    worker: Worker,
    ready: bool,
}

/// A job's files handed to the hasher, or kept for it until it is ready: a
/// file dropped while the page loads is read here at once, not hashed here
/// on the way (the hasher, started at the same time, is ready long before
/// the pipeline ends; hashing here made the pipeline wait).
struct Hashing {
    job: u32,
    blobs: Vec<Blob>,
    /// Whether the hasher has been sent them.
    posted: bool,
}

/// What the hasher sends back for a job.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Fingerprinted {
    pub(super) job: u32,
    /// The identity of each file in order (their names are filled in by the
    /// receiver), or why not.
    pub(super) identities: Result<Vec<TraceIdentity>, String>,
}

/// Hands `job`'s files to the hasher: at once when it is ready, when it
/// says so while it starts. Whether the hasher fingerprints them (not:
/// there is none, the worker hashes them as it reads them).
pub(super) fn hand_over(job: u32, blobs: &[Blob]) -> bool {
    let (posted, handed) = HASHER.with(|slot| match slot.borrow().as_ref() {
        Some(hasher) if hasher.ready => {
            let posted = post_to_hasher(&hasher.worker, job, blobs);
            (posted, posted)
        }
        // Kept until it is ready.
        Some(_) => (false, true),
        None => (false, false),
    });
    HASHING.with(|slot| {
        *slot.borrow_mut() = handed.then(|| Hashing {
            job,
            blobs: blobs.to_vec(),
            posted,
        });
    });
    handed
}

/// Whether the hasher has been sent `job`'s files (its answer will come).
pub(super) fn sent(job: u32) -> bool {
    HASHING.with(|slot| {
        slot.borrow()
            .as_ref()
            .is_some_and(|hashing| hashing.job == job && hashing.posted)
    })
}

/// Forgets `job`'s files: answered, hashed elsewhere, or nothing waits for them.
pub(super) fn forget(job: u32) {
    HASHING.with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot.as_ref().is_some_and(|hashing| hashing.job == job) {
            *slot = None;
        }
    });
}

/// Starts the hasher and routes its answers. Until it has said it is ready,
/// or without one (a browser without nested workers, a hasher that failed),
/// this worker hashes each file itself.
pub(super) fn start(scope: &DedicatedWorkerGlobalScope) {
    let Some(hasher) = worker::start_nested(NAME) else {
        return;
    };
    let post_scope = scope.clone();
    let hasher_handle = hasher.clone();
    let on_message = Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
        let post = |response: Response| worker::post_to(&post_scope, response);
        let Some(text) = event.data().as_string() else {
            return;
        };
        if text == READY {
            HASHER.with(|slot| {
                *slot.borrow_mut() = Some(Hasher {
                    worker: hasher_handle.clone(),
                    ready: true,
                });
            });
            // The files of a job that came before the hasher was ready.
            HASHING.with(|slot| {
                if let Some(hashing) = slot.borrow_mut().as_mut().filter(|h| !h.posted) {
                    hashing.posted = post_to_hasher(&hasher_handle, hashing.job, &hashing.blobs);
                }
            });
        } else if let Ok(reply) = serde_json::from_str::<Fingerprinted>(&text) {
            worker::fingerprinted(reply, &post);
        }
    });
    hasher.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    // A hasher that fails is dropped: the waiting job and the next ones are
    // hashed here.
    let post_scope = scope.clone();
    let on_error = Closure::<dyn Fn(JsValue)>::new(move |_| {
        HASHER.with(|slot| *slot.borrow_mut() = None);
        HASHING.with(|slot| *slot.borrow_mut() = None);
        let post = |response: Response| worker::post_to(&post_scope, response);
        if let Some(job) = worker::waiting_job() {
            let identities = Err("the hasher stopped".to_owned());
            worker::fingerprinted(Fingerprinted { job, identities }, &post);
        }
    });
    hasher.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    HASHER.with(|slot| {
        *slot.borrow_mut() = Some(Hasher {
            worker: hasher,
            ready: false,
        });
    });
}

/// The hasher: fingerprints the blobs of each job it is sent, in order.
pub(super) fn register(scope: &DedicatedWorkerGlobalScope) {
    let post_scope = scope.clone();
    let on_message = Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
        let data = event.data();
        let job = Reflect::get(&data, &"job".into())
            .ok()
            .and_then(|v| v.as_f64())
            .map_or(0, |v| v as u32);
        let identities = worker::attached_blobs(&data)
            .ok_or_else(|| "no file to fingerprint".to_owned())
            .and_then(worker::fingerprint_all);
        let reply = Fingerprinted { job, identities };
        if let Ok(text) = serde_json::to_string(&reply) {
            let _ = post_scope.post_message(&text.into());
        }
    });
    scope.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    // Get the hash function optimized before the first file: enough input
    // for V8 to pick it for its optimizing tier, little enough not to hold
    // a core while the page loads (4 MiB took 150 ms there).
    let _ = TraceIdentity::of("", &vec![0_u8; 256 << 10]);
    let _ = scope.post_message(&READY.into());
}

/// Asks the hasher to fingerprint `blobs` for `job`; whether it was asked.
fn post_to_hasher(hasher: &Worker, job: u32, blobs: &[Blob]) -> bool {
    let message = js_sys::Object::new();
    let list: js_sys::Array = blobs.iter().collect();
    Reflect::set(&message, &"job".into(), &JsValue::from(job)).is_ok()
        && Reflect::set(&message, &"files".into(), &list).is_ok()
        && hasher.post_message(&message).is_ok()
}
