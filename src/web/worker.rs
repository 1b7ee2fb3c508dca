//! The Web Worker: receives a request with a `Blob`, reads the blob in chunks
//! (so a file of hundreds of MB is never copied whole on the main thread), and
//! posts [`Response`]s back as JSON strings.

use js_sys::{Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{Blob, DedicatedWorkerGlobalScope, File, FileReaderSync, MessageEvent};

use crate::protocol::{Request, Response};

/// Bytes read per chunk from the blob.
const CHUNK_BYTES: u64 = 8 * 1024 * 1024;

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
    let Request::Inspect { job } = request;
    let Some(blob) = Reflect::get(data, &"file".into())
        .ok()
        .and_then(|value| value.dyn_into::<Blob>().ok())
    else {
        post(Response::Failed {
            job,
            message: "no file came with the request; drop the file again".into(),
        });
        return;
    };
    match inspect(job, &blob, post) {
        Ok(response) => post(response),
        Err(message) => post(Response::Failed { job, message }),
    }
}

/// Reads the whole blob chunk by chunk, reporting progress, and describes it.
fn inspect(job: u32, blob: &Blob, post: &dyn Fn(Response)) -> Result<Response, String> {
    let name = blob
        .dyn_ref::<File>()
        .map(File::name)
        .unwrap_or_else(|| "unnamed".into());
    let total_bytes = blob.size() as u64;
    let reader = FileReaderSync::new().map_err(|err| format!("cannot read the file: {err:?}"))?;
    let mut head = [0u8; 2];
    let mut n_head = 0usize;
    let mut done_bytes = 0u64;
    while done_bytes < total_bytes {
        let end = (done_bytes + CHUNK_BYTES).min(total_bytes);
        let chunk = blob
            .slice_with_f64_and_f64(done_bytes as f64, end as f64)
            .and_then(|slice| reader.read_as_array_buffer(&slice))
            .map_err(|err| format!("cannot read the file {name:?}: {err:?}"))?;
        let bytes = Uint8Array::new(&chunk);
        while n_head < head.len() && (n_head as u32) < bytes.length() {
            head[n_head] = bytes.get_index(n_head as u32);
            n_head += 1;
        }
        done_bytes = end;
        post(Response::Progress {
            job,
            stage: "reading".into(),
            done_bytes,
            total_bytes,
        });
    }
    Ok(Response::FileInfo {
        job,
        name,
        size_bytes: total_bytes,
        gzip: n_head == 2 && head == [0x1f, 0x8b],
    })
}
