//! The Web Worker: runs the pipeline off the page's thread.
//!
//! It receives a [`Request`] with a `Blob`, reads the blob in slices (so a file
//! of hundreds of MB is never copied whole on the main thread), runs
//! [`crate::prepare`] and [`crate::estimate`], and posts [`Response`]s back as
//! JSON strings. It keeps the last prepared trace, so a change of GPUs or
//! allocator settings re-runs only the simulation.

use std::cell::RefCell;

use js_sys::{Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{Blob, DedicatedWorkerGlobalScope, FileReaderSync, MessageEvent};

use crate::permalink::TraceIdentity;
use crate::protocol::{Request, Response, WorkStage};
use crate::{Config, Prepared, Progress};

/// Bytes read per slice of the blob.
const CHUNK_BYTES: u64 = 8 * 1024 * 1024;

thread_local! {
    /// The last trace prepared, with its identity.
    static PREPARED: RefCell<Option<(TraceIdentity, Prepared)>> = const { RefCell::new(None) };
    /// The file of the last trace prepared (a handle, not a copy of its bytes),
    /// read again only if a what-if needs the batch size, and that batch size
    /// once known.
    static SOURCE: RefCell<Option<(Blob, Option<Option<u32>>)>> = const { RefCell::new(None) };
}

/// Installs the message handler and tells the page the worker is ready.
pub fn register() {
    let Ok(scope) = js_sys::global().dyn_into::<DedicatedWorkerGlobalScope>() else {
        return;
    };
    let post_scope = scope.clone();
    let on_message = Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
        let post = |response: Response| {
            // A failed post means the page is gone; there is nobody to tell.
            let _ = post_scope.post_message(&response.to_json().into());
        };
        handle(&event.data(), &post);
    });
    scope.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let _ = scope.post_message(&Response::Ready.to_json().into());
}

fn handle(data: &JsValue, post: &dyn Fn(Response)) {
    let request = Reflect::get(data, &"request".into())
        .ok()
        .and_then(|value| value.as_string())
        .map(|text| Request::from_json(&text));
    let Some(Ok(request)) = request else {
        post(Response::Failed {
            job: 0,
            message: "the page sent a request the worker cannot read; reload the page".into(),
        });
        return;
    };
    match request {
        Request::Run { job, name, config } => {
            let blob = Reflect::get(data, &"file".into())
                .ok()
                .and_then(|value| value.dyn_into::<Blob>().ok());
            let Some(blob) = blob else {
                post(Response::Failed {
                    job,
                    message: "no file came with the request; drop the file again".into(),
                });
                return;
            };
            match read_blob(job, &blob, post) {
                Ok(bytes) => {
                    if run(job, &name, &bytes, &config, post) {
                        SOURCE.with(|slot| *slot.borrow_mut() = Some((blob, None)));
                    }
                }
                Err(message) => post(Response::Failed { job, message }),
            }
        }
        Request::Resimulate { job, config } => resimulate(job, &config, post),
        Request::WhatIf { job, what, config } => whatif(job, what, &config, post),
    }
}

/// Reads the whole blob slice by slice, reporting progress.
fn read_blob(job: u32, blob: &Blob, post: &dyn Fn(Response)) -> Result<Vec<u8>, String> {
    let total = blob.size() as u64;
    let reader = FileReaderSync::new().map_err(|err| format!("cannot read the file: {err:?}"))?;
    let mut bytes = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    let mut done = 0u64;
    while done < total {
        let end = (done + CHUNK_BYTES).min(total);
        let chunk = blob
            .slice_with_f64_and_f64(done as f64, end as f64)
            .and_then(|slice| reader.read_as_array_buffer(&slice))
            .map_err(|err| format!("cannot read the file: {err:?}"))?;
        let view = Uint8Array::new(&chunk);
        let start = bytes.len();
        bytes.resize(start + view.length() as usize, 0);
        view.copy_to(&mut bytes[start..]);
        done = end;
        post(Response::Progress {
            job,
            stage: WorkStage::Reading,
            done,
            total,
        });
    }
    Ok(bytes)
}

/// Posts pipeline progress, at most once per percent of each stage.
fn progress_poster(job: u32, post: &dyn Fn(Response)) -> impl FnMut(Progress) + '_ {
    let mut last: Option<(crate::Stage, u64)> = None;
    move |progress: Progress| {
        let percent = progress
            .done
            .saturating_mul(100)
            .checked_div(progress.total)
            .unwrap_or(0);
        if last != Some((progress.stage, percent)) {
            last = Some((progress.stage, percent));
            post(Response::Progress {
                job,
                stage: WorkStage::Pipeline(progress.stage),
                done: progress.done,
                total: progress.total,
            });
        }
    }
}

/// Prepares and estimates a trace; returns whether it was prepared (and so
/// replaced the worker's current trace).
fn run(job: u32, name: &str, bytes: &[u8], config: &Config, post: &dyn Fn(Response)) -> bool {
    let trace = TraceIdentity::of(name, bytes);
    let mut progress = progress_poster(job, post);
    let prepared = match crate::prepare(bytes, config, &mut progress) {
        Ok(prepared) => prepared,
        Err(err) => {
            post(Response::Failed {
                job,
                message: format!("{name}: {err}"),
            });
            return false;
        }
    };
    let result = crate::estimate(&prepared, config, &mut progress);
    // The previous trace is replaced only by one that prepared successfully.
    PREPARED.with(|slot| *slot.borrow_mut() = Some((trace.clone(), prepared)));
    match result {
        Ok(report) => post(Response::Done {
            job,
            trace,
            report: Box::new(report.value),
        }),
        Err(err) => post(Response::Failed {
            job,
            message: err.to_string(),
        }),
    }
    true
}

fn resimulate(job: u32, config: &Config, post: &dyn Fn(Response)) {
    let mut progress = progress_poster(job, post);
    let outcome = PREPARED.with(|slot| {
        slot.borrow().as_ref().map(|(trace, prepared)| {
            (
                trace.clone(),
                crate::estimate(prepared, config, &mut progress),
            )
        })
    });
    match outcome {
        None => post(Response::NeedTrace { job }),
        Some((trace, Ok(report))) => post(Response::Done {
            job,
            trace,
            report: Box::new(report.value),
        }),
        Some((_, Err(err))) => post(Response::Failed {
            job,
            message: err.to_string(),
        }),
    }
}

fn whatif(job: u32, what: crate::whatif::WhatIfKind, config: &Config, post: &dyn Fn(Response)) {
    post(Response::Progress {
        job,
        stage: WorkStage::Pipeline(crate::Stage::Simulating),
        done: 0,
        total: 1,
    });
    let batch_size = match what {
        crate::whatif::WhatIfKind::Batch => source_batch_size(job, post),
        _ => None,
    };
    let outcome = PREPARED.with(|slot| {
        slot.borrow()
            .as_ref()
            .map(|(_, prepared)| crate::whatif::run(prepared, batch_size, what, config))
    });
    match outcome {
        None => post(Response::NeedTrace { job }),
        Some(Ok(result)) => post(Response::WhatIf {
            job,
            result: Box::new(result),
        }),
        Some(Err(err)) => post(Response::Failed {
            job,
            message: err.to_string(),
        }),
    }
}

/// The batch size of the current trace, read from its file the first time.
fn source_batch_size(job: u32, post: &dyn Fn(Response)) -> Option<u32> {
    let source = SOURCE.with(|slot| slot.borrow().clone());
    let (blob, known) = source?;
    if let Some(known) = known {
        return known;
    }
    let found = read_blob(job, &blob, post)
        .ok()
        .and_then(|bytes| crate::whatif::batch::batch_size_of_trace(&bytes));
    SOURCE.with(|slot| {
        if let Some((_, known)) = slot.borrow_mut().as_mut() {
            *known = Some(found);
        }
    });
    found
}
