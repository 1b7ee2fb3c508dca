//! The Web Worker: runs the pipeline off the page's thread.
//!
//! It receives a [`Request`] with one `Blob` (or two or three: one job traced
//! at different sequence lengths) and streams each slice by slice into
//! [`crate::pipeline::prepare_many_from`] (fingerprinting each slice on the
//! way), so a file of hundreds of MB is never held whole, neither on the page
//! nor here;
//! then it runs [`crate::pipeline::estimate`] and posts [`Response`]s back as JSON
//! strings. It keeps the last prepared trace, so a change of GPUs or
//! allocator settings re-runs only the simulation, and small files parsed,
//! so a change of the job's settings (depth, length, parameter figures)
//! does not read them again. The job under CUDA autocast that the
//! mixed-precision what-if compares with is prepared when that what-if is
//! first asked for, not with every run.

use std::cell::RefCell;

use js_sys::{Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{Blob, DedicatedWorkerGlobalScope, FileReaderSync, MessageEvent};

use crate::permalink::{Fingerprint, TraceIdentity};
use crate::pipeline::{self, Config, Prepared, Progress};
use crate::protocol::{Request, Response, WorkStage};
use crate::trace::{TraceError, TraceReader, TraceSource};

use super::hasher::{self, Fingerprinted};
use super::{helper, sharing};

/// The trace the worker runs when it starts and nothing is asked of it (the
/// demo shipped with the site, relative to the worker's own script), so that
/// the browser has compiled the hot code with its optimizing tier before the
/// user's first file arrives: V8 starts WebAssembly in a baseline compiler
/// and optimizes a function only after it has run a while, which made a first
/// drop about 2.5 times slower than the next one. The warm-up gives way to
/// the user: it runs after the worker has said it is ready, a step at a
/// time (the parse a [`WARM_UP_PIECE`] at a time), and stops at the first
/// request (a file dropped while the page loads
/// no longer waits for the whole warm-up; the request's own run warms the
/// code it needs).
const WARM_UP_URL: &str = "./demo/resnet18_sgd_bs16_pos1.json.gz";

/// Bytes of the demo read between two turns of the warm-up: 16 KiB of its
/// gzip is about 290 KiB of JSON, and the reader parses the JSON a megabyte
/// at a time (every fourth turn or so: 20-60 ms before V8 has optimized the
/// parser, a few after). The whole demo, read in one turn, made a file
/// dropped as the page loads wait up to 0.35 s.
const WARM_UP_PIECE: usize = 16 << 10;

/// This worker's own loader, to start its nested workers from (relative
/// to the worker's script, so the site works from any sub-path).
const WORKER_URL: &str = "./worker_loader.js";

/// Starts a nested worker: this same script under `name` (which
/// [`register`] reads to take its part); `None` where the browser cannot.
pub(super) fn start_nested(name: &str) -> Option<web_sys::Worker> {
    let options = web_sys::WorkerOptions::new();
    options.set_name(name);
    web_sys::Worker::new_with_options(WORKER_URL, &options).ok()
}

/// Bytes read per slice of the blob.
const CHUNK_BYTES: u64 = 8 * 1024 * 1024;

/// The memory an estimate may take here (`Config::memory_budget`): the
/// wasm32 heap stops at 4 GiB, and the worker still holds the previous
/// job's prepared trace while it builds the next. A rebuilt job that needs
/// more is refused before it is built, naming the largest that fits.
const MEMORY_BUDGET: crate::units::Bytes = crate::units::Bytes(1536 * crate::units::Bytes::MIB);

/// `config` with the worker's memory budget.
fn within_heap(mut config: Config) -> Config {
    config.memory_budget = MEMORY_BUDGET;
    config
}

thread_local! {
    /// The last trace prepared, with its identity and its files.
    pub(super) static PREPARED: RefCell<Option<Kept>> = const { RefCell::new(None) };
    /// A result waiting for its file's fingerprint from the hasher.
    static WAITING: RefCell<Option<Waiting>> = const { RefCell::new(None) };
    /// How many requests the page has made: a warm-up stops at the next.
    static ASKED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Whether a warm-up's rebuilt job has run here ([`warm_scale`]).
    static SCALE_WARMED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The page's files a warm-up last tried to rebuild.
    static SCALE_TRIED: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// A prepared trace and its result, until the hasher's fingerprints arrive.
struct Waiting {
    job: u32,
    /// The files' names, in the order they were read.
    names: Vec<String>,
    loaded: Loaded,
    result: Result<Box<crate::report::Report>, String>,
}

/// The last trace prepared and its identity.
pub(super) struct Kept {
    pub(super) trace: TraceIdentity,
    pub(super) loaded: Loaded,
}

/// A prepared trace and its files: the page's number for them
/// (`Request::Run`'s `files`), their blobs (a blob is a handle) and, where
/// they are small, the traces parsed, so that a run of the same files with
/// other settings and the what-ifs that read the traces again do not read
/// them.
pub(super) struct Loaded {
    pub(super) prepared: Prepared,
    /// The settings `prepared` was prepared with.
    pub(super) prepared_with: Config,
    pub(super) files: u32,
    pub(super) blobs: Vec<Blob>,
    pub(super) parsed: Option<Parsed>,
    /// Whether `prepared` holds the job under CUDA autocast for the
    /// mixed-precision what-if (`AutocastConfig::what_if`), which only that
    /// what-if asks for.
    pub(super) what_if: bool,
}

/// Traces as read, with the reader's warnings.
pub(super) struct Parsed {
    pub(super) traces: Vec<crate::trace::Trace>,
    pub(super) warnings: Vec<crate::diag::Warning>,
}

/// The largest traces kept parsed between runs, in events: at
/// [`crate::scale::work::BYTES_PER_EVENT`] (what an event takes from the
/// trace read to the report, more than the parsed trace alone) an eighth
/// of [`MEMORY_BUDGET`].
const KEEP_PARSED_EVENTS: u64 = MEMORY_BUDGET.get() / 8 / crate::scale::work::BYTES_PER_EVENT;

/// Files larger than this are read as a stream (each slice dropped as it
/// is parsed, the traces dropped before a rebuilt job is analyzed) and
/// not kept parsed.
const KEEP_PARSED_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Installs the message handler and tells the page the worker is ready; the
/// hasher, started by this same script under [`hasher::NAME`], only hashes.
pub fn register() {
    let Ok(scope) = js_sys::global().dyn_into::<DedicatedWorkerGlobalScope>() else {
        return;
    };
    if scope.name() == hasher::NAME {
        hasher::register(&scope);
        return;
    }
    if scope.name() == helper::NAME {
        helper::register(&scope);
        return;
    }
    let post_scope = scope.clone();
    let on_message = Closure::<dyn Fn(MessageEvent)>::new(move |event: MessageEvent| {
        let post = |response: Response| post_to(&post_scope, response);
        handle(&event.data(), &post);
    });
    scope.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    hasher::start(&scope);
    helper::start(&scope);
    post_to(&scope, Response::Ready);
    wasm_bindgen_futures::spawn_local(warm_up(scope));
}

/// Posts a response to the page. A failed post means the page is gone;
/// there is nobody to tell.
pub(super) fn post_to(scope: &DedicatedWorkerGlobalScope, response: Response) {
    let _ = scope.post_message(&response.to_json().into());
}

/// The blobs under `files` in a message (a JS array of `Blob`s, in order);
/// `None` when there is none or anything else is there.
pub(super) fn attached_blobs(data: &JsValue) -> Option<Vec<Blob>> {
    let list = Reflect::get(data, &"files".into())
        .ok()?
        .dyn_into::<js_sys::Array>()
        .ok()?;
    let blobs = list
        .iter()
        .map(|value| value.dyn_into::<Blob>().ok())
        .collect::<Option<Vec<Blob>>>()?;
    (!blobs.is_empty()).then_some(blobs)
}

/// Fingerprints each blob in turn (without names).
pub(super) fn fingerprint_all(blobs: Vec<Blob>) -> Result<Vec<TraceIdentity>, String> {
    blobs.into_iter().map(fingerprint_blob).collect()
}

/// The identity the CLI gives the same files: each file's under its name,
/// joined when there are several ([`TraceIdentity::joined`]).
fn identity_of(mut identities: Vec<TraceIdentity>, names: &[String]) -> TraceIdentity {
    for (identity, name) in identities.iter_mut().zip(names) {
        identity.name.clone_from(name);
    }
    TraceIdentity::joined(&identities)
}

/// Reads a whole blob slice by slice and fingerprints it.
fn fingerprint_blob(blob: Blob) -> Result<TraceIdentity, String> {
    let mut source = BlobSource::new(blob, true)?;
    while source
        .next_chunk()
        .map_err(|err| err.to_string())?
        .is_some()
    {}
    Ok(source.fingerprint.take().unwrap_or_default().finish(""))
}

/// The job waiting for the hasher's answer, if any.
pub(super) fn waiting_job() -> Option<u32> {
    WAITING.with(|slot| slot.borrow().as_ref().map(|w| w.job))
}

/// The hasher's answer for a job: the waiting result goes out with it.
pub(super) fn fingerprinted(reply: Fingerprinted, post: &dyn Fn(Response)) {
    hasher::forget(reply.job);
    let waiting = WAITING.with(|slot| {
        let mut slot = slot.borrow_mut();
        match slot.as_ref() {
            Some(w) if w.job == reply.job => slot.take(),
            _ => None,
        }
    });
    let Some(waiting) = waiting else {
        // A job that failed or was replaced meanwhile.
        return;
    };
    let identities = match reply.identities {
        Ok(identities) if identities.len() == waiting.names.len() => identities,
        // The hasher could not: hash here.
        _ => match fingerprint_all(waiting.loaded.blobs.clone()) {
            Ok(identities) => identities,
            Err(message) => {
                post(Response::Failed {
                    job: waiting.job,
                    message,
                });
                return;
            }
        },
    };
    let kept = Kept {
        trace: identity_of(identities, &waiting.names),
        loaded: waiting.loaded,
    };
    finish(waiting.job, kept, waiting.result, post);
}

/// Keeps the prepared trace and posts its result.
fn finish(
    job: u32,
    kept: Kept,
    result: Result<Box<crate::report::Report>, String>,
    post: &dyn Fn(Response),
) {
    let trace = kept.trace.clone();
    // The previous trace is replaced only by one that prepared successfully.
    PREPARED.with(|slot| *slot.borrow_mut() = Some(kept));
    post_result(job, trace, result, post);
    if !SCALE_WARMED.with(std::cell::Cell::get) {
        if let Ok(scope) = js_sys::global().dyn_into::<DedicatedWorkerGlobalScope>() {
            let asked = ASKED.with(std::cell::Cell::get);
            wasm_bindgen_futures::spawn_local(warm_scale(scope, asked));
        }
    }
}

/// Posts an estimate of `trace`, or why there is none.
pub(super) fn post_result(
    job: u32,
    trace: TraceIdentity,
    result: Result<Box<crate::report::Report>, String>,
    post: &dyn Fn(Response),
) {
    match result {
        Ok(report) => post(Response::Done { job, trace, report }),
        Err(message) => post(Response::Failed { job, message }),
    }
}

/// Runs the pipeline on the demo trace, twice (the second pass runs what the
/// first one got optimized), and forgets the results; a step at a time (a
/// piece of the parse, the prepare, the estimate), each after the tasks
/// already waiting (a request from the page among
/// them), and not at all once the page has asked something. Any failure (a
/// site deployed without the demo) only ends the warm-up.
async fn warm_up(scope: DedicatedWorkerGlobalScope) {
    let Some(bytes) = fetch_bytes(&scope, WARM_UP_URL).await else {
        return;
    };
    for _ in 0..2 {
        if !give_way(&scope, 0).await {
            return;
        }
        // The same path as a dropped small file (the hasher fingerprints
        // it): read piece by piece, prepared, estimated. A turn after each
        // piece: a file dropped meanwhile waits for a piece, not the demo.
        let mut reader = TraceReader::new(crate::trace::MAX_DECOMPRESSED_BYTES);
        for piece in bytes.chunks(WARM_UP_PIECE) {
            if reader.push(piece).is_err() || !give_way(&scope, 0).await {
                return;
            }
        }
        let Ok(trace) = reader.finish() else {
            return;
        };
        if !give_way(&scope, 0).await {
            return;
        }
        let config = Config::standard();
        let traces = [trace.value];
        let Ok(prepared) = pipeline::prepare_parsed(&traces, trace.warnings, &config, &mut |_| {})
        else {
            return;
        };
        if !give_way(&scope, 0).await {
            return;
        }
        let _ = pipeline::estimate(&prepared, &config, &mut |_| {});
    }
}

/// How long a warm-up of a rebuild waits after a result before it starts
/// ([`warm_scale`]): the page draws the result meanwhile, and on two cores
/// a warm-up started at once made a result shown 0.15 s later.
const WARM_SCALE_AFTER_MS: i32 = 250;

/// The events a warm-up's rebuilt job may have, about ([`warm_scale`]):
/// llama-small's 2-block training trace (17,821 events) rebuilt to 32
/// blocks, 0.07 s natively.
const WARM_UP_EVENTS: u64 = 300_000;

/// Once per worker, after a result: the trace the worker keeps, rebuilt to
/// up to 16 times its blocks (within [`WARM_UP_EVENTS`]) and estimated, the
/// results forgotten, so that V8 has optimized the rebuild's code (the copy
/// engine, a deeper job's analysis and simulation) before the page asks for
/// a rebuilt job. The demo's warm-up (a CNN, never rebuilt) does not run it,
/// and a first rebuild ran about 2.4 times slower than the next
/// (llama-small's 2-block trace at 160 blocks: 325 ms, then 137 ms; 170 ms
/// after this warm-up; a warm-up to 8 blocks left it at 230 ms). A step at a
/// time (the rebuild, the estimate), each after the tasks already waiting,
/// and not at all once the page asks something else; a trace with no
/// repeated blocks, one not kept parsed, one too large to rebuild 2-fold
/// within the events, or one tried already ends it.
async fn warm_scale(scope: DedicatedWorkerGlobalScope, asked: u64) {
    if !give_way_after(&scope, asked, WARM_SCALE_AFTER_MS).await {
        return;
    }
    let mut config = within_heap(Config::standard());
    let prepared = PREPARED.with(|slot| {
        let slot = slot.borrow();
        let kept = slot.as_ref()?;
        if SCALE_TRIED.with(|tried| tried.replace(Some(kept.loaded.files)))
            == Some(kept.loaded.files)
        {
            return None;
        }
        let layers = kept.loaded.prepared.traced.layers?;
        let parsed = kept.loaded.parsed.as_ref()?;
        let events = parsed
            .traces
            .iter()
            .map(crate::scale::work::Counts::traced_of)
            .fold(0_u64, u64::saturating_add)
            .max(1);
        let times = u32::try_from((WARM_UP_EVENTS / events).min(16)).ok()?;
        if times < 2 {
            return None;
        }
        config.scale.layers = Some(layers.saturating_mul(times));
        pipeline::prepare_parsed(
            &parsed.traces,
            parsed.warnings.clone(),
            &config,
            &mut |_| {},
        )
        .ok()
    });
    let Some(prepared) = prepared else {
        return;
    };
    if !give_way(&scope, asked).await {
        return;
    }
    if pipeline::estimate(&prepared, &config, &mut |_| {}).is_ok() {
        SCALE_WARMED.with(|warmed| warmed.set(true));
    }
}

/// Lets the tasks already queued run first (a zero-delay timer's turn comes
/// after the messages that arrived before it was set); whether the warm-up
/// may go on (the page has asked nothing since its `asked`-th request).
async fn give_way(scope: &DedicatedWorkerGlobalScope, asked: u64) -> bool {
    give_way_after(scope, asked, 0).await
}

/// [`give_way`] after `ms` milliseconds at least.
async fn give_way_after(scope: &DedicatedWorkerGlobalScope, asked: u64, ms: i32) -> bool {
    let timer = js_sys::Promise::new(&mut |resolve, _| {
        if scope
            .set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms)
            .is_err()
        {
            let _ = resolve.call0(&JsValue::NULL);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(timer).await;
    ASKED.with(std::cell::Cell::get) == asked
}

/// A same-origin file, fetched without blocking the worker (a request from
/// the page is handled meanwhile).
async fn fetch_bytes(scope: &DedicatedWorkerGlobalScope, url: &str) -> Option<Vec<u8>> {
    use wasm_bindgen_futures::JsFuture;
    let response: web_sys::Response = JsFuture::from(scope.fetch_with_str(url))
        .await
        .ok()?
        .dyn_into()
        .ok()?;
    if !response.ok() {
        return None;
    }
    let buffer = JsFuture::from(response.array_buffer().ok()?).await.ok()?;
    Some(Uint8Array::new(&buffer).to_vec())
}

fn handle(data: &JsValue, post: &dyn Fn(Response)) {
    ASKED.with(|asked| asked.set(asked.get().saturating_add(1)));
    // An estimate waiting for the helper is dropped: the page asks another.
    sharing::drop_waiting();
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
        Request::Run {
            job,
            names,
            files,
            config,
        } => {
            let config = within_heap(config);
            if files != 0 && sharing::run_kept(job, files, &config, post) {
                return;
            }
            let blobs = attached_blobs(data).filter(|blobs| blobs.len() == names.len());
            let Some(blobs) = blobs else {
                post(Response::Failed {
                    job,
                    message: "no file came with the request; drop the file again".into(),
                });
                return;
            };
            // Hash on the hasher when there is one (once it is ready if it
            // is starting), here otherwise.
            let hashed_elsewhere = hasher::hand_over(job, &blobs);
            let sources = blobs
                .into_iter()
                .map(|blob| BlobSource::new(blob, !hashed_elsewhere))
                .collect::<Result<Vec<BlobSource>, String>>();
            match sources {
                Ok(mut sources) => run(job, &names, files, &mut sources, &config, post),
                Err(message) => post(Response::Failed { job, message }),
            }
        }
        Request::Resimulate { job, config } => resimulate(job, &within_heap(config), post),
        Request::WhatIf { job, what, config } => whatif(job, what, &within_heap(config), post),
    }
}

/// A blob read slice by slice, each slice fingerprinted as it passes unless
/// the hasher does it.
pub(super) struct BlobSource {
    blob: Blob,
    reader: FileReaderSync,
    total: u64,
    done: u64,
    slice: Vec<u8>,
    fingerprint: Option<Fingerprint>,
}

impl BlobSource {
    pub(super) fn new(blob: Blob, fingerprint: bool) -> Result<BlobSource, String> {
        let reader =
            FileReaderSync::new().map_err(|err| format!("cannot read the file: {err:?}"))?;
        Ok(BlobSource {
            total: blob.size() as u64,
            blob,
            reader,
            done: 0,
            slice: Vec::new(),
            fingerprint: fingerprint.then(Fingerprint::default),
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
        if let Some(fingerprint) = &mut self.fingerprint {
            fingerprint.update(&self.slice);
        }
        self.done = end;
        Ok(Some(&self.slice))
    }
}

/// Posts pipeline progress, at most once per percent of each stage.
pub(super) fn progress_poster(job: u32, post: &dyn Fn(Response)) -> impl FnMut(Progress) + '_ {
    progress_poster_sharing(job, post, None)
}

/// [`progress_poster`], the simulation shown as shared with the helper
/// once `shared` is set.
pub(super) fn progress_poster_sharing<'a>(
    job: u32,
    post: &'a dyn Fn(Response),
    shared: Option<&'a std::cell::Cell<bool>>,
) -> impl FnMut(Progress) + 'a {
    let mut last: Option<(WorkStage, u64)> = None;
    move |progress: Progress| {
        let percent = progress
            .done
            .saturating_mul(100)
            .checked_div(progress.total)
            .unwrap_or(0);
        let stage = match progress.stage {
            pipeline::Stage::Simulating if shared.is_some_and(std::cell::Cell::get) => {
                WorkStage::SimulatingShared
            }
            stage => WorkStage::Pipeline(stage),
        };
        if last != Some((stage, percent)) {
            last = Some((stage, percent));
            post(Response::Progress {
                job,
                stage,
                done: progress.done,
                total: progress.total,
            });
        }
    }
}

/// Prepares and estimates a trace (or one job from its traces at several
/// sequence lengths, read in turn); one that prepares replaces the worker's
/// current trace, once its fingerprint is known (at once when this worker
/// hashed the files, when the hasher answers otherwise). Small files are
/// read whole first and kept parsed; larger ones are read as a stream.
fn run(
    job: u32,
    names: &[String],
    files: u32,
    sources: &mut [BlobSource],
    config: &Config,
    post: &dyn Fn(Response),
) {
    let mut progress = progress_poster(job, post);
    let (prepared, parsed) = prepare_sources(sources, config, &mut progress);
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(err) => {
            // Nothing waits for these files' fingerprints.
            hasher::forget(job);
            post(Response::Failed {
                job,
                message: format!("{}: {err}", names.join(" + ")),
            });
            return;
        }
    };
    let result = estimated(&prepared, config, &mut progress);
    let hashed_here = sources
        .iter_mut()
        .map(|source| source.fingerprint.take().map(|f| f.finish("")))
        .collect::<Option<Vec<TraceIdentity>>>();
    let loaded = Loaded {
        prepared,
        prepared_with: config.clone(),
        files,
        blobs: sources.iter().map(|source| source.blob.clone()).collect(),
        parsed,
        what_if: false,
    };
    match hashed_here {
        Some(identities) => {
            let kept = Kept {
                trace: identity_of(identities, names),
                loaded,
            };
            finish(job, kept, result, post)
        }
        None => {
            let waiting = Waiting {
                job,
                names: names.to_vec(),
                loaded,
                result,
            };
            WAITING.with(|slot| *slot.borrow_mut() = Some(waiting));
            // The hasher has not been sent the files (it is not ready yet,
            // or it failed): hash them here now.
            if !hasher::sent(job) {
                let identities = Err("the hasher was not ready".to_owned());
                fingerprinted(Fingerprinted { job, identities }, post);
            }
        }
    }
}

/// A job prepared from `sources` with `config`: small files read whole
/// first and returned parsed where they are small enough to keep, larger
/// ones read as a stream.
pub(super) fn prepare_sources(
    sources: &mut [BlobSource],
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> (Result<Prepared, pipeline::Error>, Option<Parsed>) {
    let bytes = sources
        .iter()
        .map(|source| source.total)
        .fold(0u64, u64::saturating_add);
    if bytes <= KEEP_PARSED_FILE_BYTES {
        match read_all(sources, progress) {
            Ok(parsed) => {
                let prepared = pipeline::prepare_parsed(
                    &parsed.traces,
                    parsed.warnings.clone(),
                    config,
                    progress,
                );
                let events = parsed
                    .traces
                    .iter()
                    .map(crate::scale::work::Counts::traced_of)
                    .fold(0u64, u64::saturating_add);
                (prepared, (events <= KEEP_PARSED_EVENTS).then_some(parsed))
            }
            Err(err) => (Err(err), None),
        }
    } else {
        let mut dyns: Vec<&mut dyn TraceSource> = sources
            .iter_mut()
            .map(|source| source as &mut dyn TraceSource)
            .collect();
        (
            pipeline::prepare_many_from(&mut dyns, config, progress),
            None,
        )
    }
}

/// The estimate of `prepared`, as the page shows it or as it says why not.
pub(super) fn estimated(
    prepared: &Prepared,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> Result<Box<crate::report::Report>, String> {
    pipeline::estimate(prepared, config, progress)
        .map(|report| Box::new(report.value))
        .map_err(|err| err.to_string())
}

/// Each source read whole, in turn, with the reader's progress.
fn read_all(
    sources: &mut [BlobSource],
    progress: &mut dyn FnMut(Progress),
) -> Result<Parsed, pipeline::Error> {
    let mut parsed = Parsed {
        traces: Vec::with_capacity(sources.len()),
        warnings: Vec::new(),
    };
    for source in sources.iter_mut() {
        let trace = crate::trace::read(source, &mut |done, total| {
            progress(Progress {
                stage: pipeline::Stage::Parsing,
                done,
                total,
            });
        })?;
        parsed.warnings.extend(trace.warnings);
        parsed.traces.push(trace.value);
    }
    Ok(parsed)
}

fn resimulate(job: u32, config: &Config, post: &dyn Fn(Response)) {
    sharing::estimate_kept(job, config, post);
}

fn whatif(job: u32, what: crate::whatif::WhatIfKind, config: &Config, post: &dyn Fn(Response)) {
    use crate::whatif::WhatIfKind;
    post(Response::Progress {
        job,
        stage: WorkStage::Pipeline(pipeline::Stage::Simulating),
        done: 0,
        total: 1,
    });
    let outcome = PREPARED.with(|slot| {
        let mut slot = slot.borrow_mut();
        let loaded = &mut slot.as_mut()?.loaded;
        let mut answer = || -> Result<crate::whatif::WhatIfResult, String> {
            // The longest-generation what-if reads the traces; the
            // mixed-precision one needs the job under CUDA autocast too,
            // which a run does not prepare: it is prepared when first
            // asked for, from the same traces and settings.
            let needs_autocast = what == WhatIfKind::Precision && !loaded.what_if;
            let needs_traces = matches!(what, WhatIfKind::Context { .. }) || needs_autocast;
            let read;
            let parsed: Option<&Parsed> = match (&loaded.parsed, needs_traces) {
                (_, false) => None,
                (Some(parsed), true) => Some(parsed),
                (None, true) => {
                    read = read_traces(&loaded.blobs)?;
                    Some(&read)
                }
            };
            let traces = parsed.map_or(&[][..], |parsed| &parsed.traces);
            if needs_autocast {
                let mut with_what_if = config.clone();
                with_what_if.orchestrator.autocast.what_if = true;
                let warnings = parsed
                    .map(|parsed| parsed.warnings.clone())
                    .unwrap_or_default();
                loaded.prepared =
                    pipeline::prepare_parsed(traces, warnings, &with_what_if, &mut |_| {})
                        .map_err(|err| err.to_string())?;
                loaded.prepared_with = with_what_if;
                loaded.what_if = true;
            }
            crate::whatif::run_on_traces(&loaded.prepared, traces, what, config, &pipeline::InTurn)
                .map_err(|err| err.to_string())
        };
        Some(answer())
    });
    match outcome {
        None => post(Response::NeedTrace { job }),
        Some(Ok(result)) => post(Response::WhatIf {
            job,
            result: Box::new(result),
        }),
        Some(Err(message)) => post(Response::Failed { job, message }),
    }
}

/// The files of the prepared job, parsed again.
fn read_traces(blobs: &[Blob]) -> Result<Parsed, String> {
    let mut sources = blobs
        .iter()
        .map(|blob| BlobSource::new(blob.clone(), false))
        .collect::<Result<Vec<BlobSource>, String>>()?;
    read_all(&mut sources, &mut |_| {}).map_err(|err| err.to_string())
}
