//! The page's side of the worker protocol: spawning the worker, waiting for its
//! "ready" message, and posting requests with the files attached.

use js_sys::{Array, Object, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{Blob, ErrorEvent, MessageEvent, Worker};

use crate::protocol::{Request, Response};

/// The loader script Trunk emits for the `worker` bin (`data-loader-shim`),
/// resolved against the page's base URL so the site works from any sub-path.
const WORKER_URL: &str = "./worker_loader.js";

/// Starts the worker and routes every decoded [`Response`] to `on_response`.
///
/// Messages that are not valid responses are reported as `Failed` with job 0,
/// so a broken worker shows up as an error instead of a silent spinner. An
/// error the worker did not handle (WebAssembly trapping on a bug or when the
/// browser gives it no more memory: `RuntimeError: unreachable`, a script that
/// failed to load) goes to `on_crash` with the browser's words: such a worker
/// may hold a half-done job and is never used again.
pub fn spawn(
    on_response: impl Fn(Response) + 'static,
    on_crash: impl Fn(String) + 'static,
) -> Result<Worker, String> {
    let worker =
        Worker::new(WORKER_URL).map_err(|err| format!("cannot start the worker: {err:?}"))?;
    let on_message = Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
        let response = match event.data().as_string() {
            Some(text) => Response::from_json(&text).unwrap_or_else(|err| Response::Failed {
                job: 0,
                message: format!("the worker sent a message the page cannot read: {err}"),
            }),
            None => Response::Failed {
                job: 0,
                message: "the worker sent a message that is not text".into(),
            },
        };
        on_response(response);
    });
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let on_error = Closure::<dyn Fn(JsValue)>::new(move |event: JsValue| {
        let message = event
            .dyn_ref::<ErrorEvent>()
            .map(ErrorEvent::message)
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "the worker could not run".to_owned());
        on_crash(message);
    });
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    Ok(worker)
}

/// Posts `request`, with `files` attached (a JS array under `files`, in the
/// order of the request's names) when there are any; each is shared with the
/// worker by structured clone (a `Blob` handle, not a copy of its bytes).
pub fn post(worker: &Worker, request: &Request, files: &[Blob]) -> Result<(), String> {
    let message = Object::new();
    Reflect::set(&message, &"request".into(), &request.to_json().into())
        .and_then(|_| {
            if files.is_empty() {
                return Ok(true);
            }
            let list: Array = files.iter().collect();
            Reflect::set(&message, &"files".into(), &list)
        })
        .map_err(|err| format!("cannot build the worker message: {err:?}"))?;
    worker
        .post_message(&message)
        .map_err(|err| format!("cannot send the file to the worker: {err:?}"))
}
