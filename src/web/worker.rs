//! The Web Worker: runs the pipeline off the page's thread.
//!
//! It receives a [`Request`] with a `Blob` and streams the blob slice by slice
//! into [`crate::prepare_from`] (fingerprinting each slice on the way), so a
//! file of hundreds of MB is never held whole, neither on the page nor here;
//! then it runs [`crate::estimate`] and posts [`Response`]s back as JSON
//! strings. It keeps the last prepared trace, so a change of GPUs or
//! allocator settings re-runs only the simulation.

use std::cell::RefCell;

use js_sys::{Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{
    Blob, DedicatedWorkerGlobalScope, FileReaderSync, MessageEvent, XmlHttpRequest,
    XmlHttpRequestResponseType,
};

use crate::permalink::{Fingerprint, TraceIdentity};
use crate::protocol::{Request, Response, WorkStage};
use crate::trace::{TraceError, TraceSource};
use crate::{Config, Prepared, Progress};

/// The trace the worker runs once when it starts (the demo shipped with the
/// site, relative to the worker's own script), so that the browser has
/// compiled the hot code with its optimizing tier before the user's first
/// file arrives: V8 starts WebAssembly in a baseline compiler and optimizes a
/// function only after it has run a while, which made a first drop about
/// 2.5 times slower than the next one.
const WARM_UP_URL: &str = "./demo/resnet18_sgd_bs16_pos1.json.gz";

/// Bytes read per slice of the blob.
const CHUNK_BYTES: u64 = 8 * 1024 * 1024;

thread_local! {
    /// The last trace prepared, with its identity.
    static PREPARED: RefCell<Option<(TraceIdentity, Prepared)>> = const { RefCell::new(None) };
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
    warm_up();
    let _ = scope.post_message(&Response::Ready.to_json().into());
}

/// Runs the pipeline once on the demo trace and forgets the result. Any
/// failure (a site deployed without the demo) only skips the warm-up.
fn warm_up() {
    let Some(bytes) = fetch_sync(WARM_UP_URL) else {
        return;
    };
    // The same path as a dropped file: its fingerprint, then the pipeline;
    // twice, as the second pass runs what the first one got optimized.
    for _ in 0..2 {
        let _ = TraceIdentity::of(WARM_UP_URL, &bytes);
        let config = Config::standard();
        if let Ok(prepared) = crate::prepare(&bytes, &config, &mut |_| {}) {
            let _ = crate::estimate(&prepared, &config, &mut |_| {});
        }
    }
}

/// A same-origin file by synchronous request (allowed in workers).
fn fetch_sync(url: &str) -> Option<Vec<u8>> {
    let request = XmlHttpRequest::new().ok()?;
    request.open_with_async("GET", url, false).ok()?;
    request.set_response_type(XmlHttpRequestResponseType::Arraybuffer);
    request.send().ok()?;
    if request.status().ok()? != 200 {
        return None;
    }
    Some(Uint8Array::new(&request.response().ok()?).to_vec())
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
            match BlobSource::new(blob) {
                Ok(mut source) => run(job, &name, &mut source, &config, post),
                Err(message) => post(Response::Failed { job, message }),
            }
        }
        Request::Resimulate { job, config } => resimulate(job, &config, post),
        Request::WhatIf { job, what, config } => whatif(job, what, &config, post),
    }
}

/// A blob read slice by slice, each slice fingerprinted as it passes.
struct BlobSource {
    blob: Blob,
    reader: FileReaderSync,
    total: u64,
    done: u64,
    slice: Vec<u8>,
    fingerprint: Fingerprint,
}

impl BlobSource {
    fn new(blob: Blob) -> Result<BlobSource, String> {
        let reader =
            FileReaderSync::new().map_err(|err| format!("cannot read the file: {err:?}"))?;
        Ok(BlobSource {
            total: blob.size() as u64,
            blob,
            reader,
            done: 0,
            slice: Vec::new(),
            fingerprint: Fingerprint::default(),
        })
    }
}

impl TraceSource for BlobSource {
    fn size_hint(&self) -> Option<u64> {
        Some(self.total)
    }

    fn next_chunk(&mut self) -> Result<Option<&[u8]>, TraceError> {
        if self.done >= self.total {
            return Ok(None);
        }
        let end = (self.done + CHUNK_BYTES).min(self.total);
        let buffer = self
            .blob
            .slice_with_f64_and_f64(self.done as f64, end as f64)
            .and_then(|slice| self.reader.read_as_array_buffer(&slice))
            .map_err(|err| TraceError::Read(format!("{err:?}")))?;
        let view = Uint8Array::new(&buffer);
        self.slice.resize(view.length() as usize, 0);
        view.copy_to(&mut self.slice);
        self.fingerprint.update(&self.slice);
        self.done = end;
        Ok(Some(&self.slice))
    }
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

/// Prepares and estimates a trace; one that prepares replaces the worker's
/// current trace.
fn run(job: u32, name: &str, source: &mut BlobSource, config: &Config, post: &dyn Fn(Response)) {
    let mut progress = progress_poster(job, post);
    let prepared = match crate::prepare_from(source, config, &mut progress) {
        Ok(prepared) => prepared,
        Err(err) => {
            post(Response::Failed {
                job,
                message: format!("{name}: {err}"),
            });
            return;
        }
    };
    let trace = std::mem::take(&mut source.fingerprint).finish(name);
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
    let outcome = PREPARED.with(|slot| {
        slot.borrow()
            .as_ref()
            .map(|(_, prepared)| crate::whatif::run(prepared, what, config))
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
