//! The worker's side of sharing an estimate with the simulation helper
//! ([`super::helper`]): a run of the kept job (other settings, other GPUs)
//! estimated with some compared GPUs' runs at capacity handed to the helper
//! where [`pipeline::share_with_one`] says it pays, and finished when their
//! runs come back (or simulated here where the helper could not).

use std::cell::RefCell;

use wasm_bindgen::JsCast;
use web_sys::DedicatedWorkerGlobalScope;

use super::helper;
use super::worker::{estimated, post_result, progress_poster, progress_poster_sharing, PREPARED};
use crate::permalink::TraceIdentity;
use crate::pipeline::{self, Config, Progress};
use crate::protocol::{Response, WorkStage};

thread_local! {
    /// An estimate waiting for the runs it handed the simulation helper.
    static WAITING_RUNS: RefCell<Option<WaitingRuns>> = const { RefCell::new(None) };
}

/// An estimate of the kept job whose runs at capacity for some GPUs the
/// simulation helper makes ([`helper`]).
struct WaitingRuns {
    job: u32,
    trace: TraceIdentity,
    config: Config,
    pending: Box<pipeline::Pending>,
    /// The progress this worker had reached, of the whole estimate's.
    progress: Progress,
}

/// Drops an estimate waiting for the helper (the page asks another), and
/// the helper's work on it.
pub(super) fn drop_waiting() {
    if WAITING_RUNS.with(|slot| slot.borrow_mut().take()).is_some() {
        if let Ok(scope) = js_sys::global().dyn_into::<DedicatedWorkerGlobalScope>() {
            helper::drop_handed(&scope);
        }
    }
}

/// Runs the files the worker keeps parsed again, with `config`, if they
/// are the page's files number `files`; whether it did (not: they must be
/// read). The kept trace is replaced only by one that prepares. A rebuilt
/// job is prepared by the simulation helper too, meanwhile, in case it
/// takes some runs ([`estimate_kept`]).
pub(super) fn run_kept(job: u32, files: u32, config: &Config, post: &dyn Fn(Response)) -> bool {
    let mut progress = progress_poster(job, post);
    let outcome = PREPARED.with(|slot| {
        let slot = slot.borrow();
        let kept = slot.as_ref().filter(|kept| kept.loaded.files == files)?;
        let parsed = kept.loaded.parsed.as_ref()?;
        if config.gpus.len() > 1 && helper::ready() && large_rebuild(parsed, config) {
            let ask = helper::Ask {
                job,
                files,
                prepared_with: config.clone(),
                config: config.clone(),
                gpus: None,
            };
            helper::ask(&ask, &kept.loaded.blobs);
        }
        let prepared = pipeline::prepare_parsed(
            &parsed.traces,
            parsed.warnings.clone(),
            config,
            &mut progress,
        );
        Some((kept.trace.clone(), prepared))
    });
    let Some((trace, prepared)) = outcome else {
        return false;
    };
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(err) => {
            post(Response::Failed {
                job,
                message: format!("{}: {err}", trace.name),
            });
            return true;
        }
    };
    PREPARED.with(|slot| {
        if let Some(kept) = slot.borrow_mut().as_mut() {
            kept.loaded.prepared = prepared;
            kept.loaded.prepared_with = config.clone();
            kept.loaded.what_if = false;
        }
    });
    estimate_kept(job, config, post);
    true
}

/// Whether the job `config` rebuilds from `parsed` is large enough that the
/// helper may take some of its runs ([`helper::MIN_SHARED_EVENTS`], counted
/// in the rebuilt trace's events, of which its `[memory]` events are a
/// part): then the helper prepares it beside the worker, speculatively (on
/// two cores, a small rebuild ran 0.05 s slower for it).
fn large_rebuild(parsed: &super::worker::Parsed, config: &Config) -> bool {
    use crate::scale::work;
    let target = config.scale;
    if target.is_identity() {
        return false;
    }
    let events = parsed
        .traces
        .iter()
        .map(|trace| {
            let counts = work::Counts::of(trace);
            let layers = target.layers.unwrap_or(counts.layers);
            let tokens = target.new_tokens.unwrap_or(counts.tokens);
            work::estimate(&counts, layers, tokens, work::Budget::UNLIMITED).events
        })
        .fold(0u64, u64::saturating_add);
    events >= helper::MIN_SHARED_EVENTS
}

/// Estimates the kept job with `config` and posts the result: at once, or,
/// where the simulation helper takes some GPUs' runs at capacity, when they
/// come back ([`helper_runs`]).
pub(super) fn estimate_kept(job: u32, config: &Config, post: &dyn Fn(Response)) {
    let last = std::cell::Cell::new(Progress {
        stage: pipeline::Stage::Simulating,
        done: 0,
        total: 1,
    });
    let shared = std::cell::Cell::new(false);
    let mut poster = progress_poster_sharing(job, post, Some(&shared));
    let mut progress = |p: Progress| {
        last.set(p);
        poster(p);
    };
    let outcome = PREPARED.with(|slot| {
        let slot = slot.borrow();
        let kept = slot.as_ref()?;
        let loaded = &kept.loaded;
        if config.gpus.len() < 2 || !helper::ready() {
            let result = estimated(&loaded.prepared, config, &mut progress);
            return Some((kept.trace.clone(), Estimated::Now(result)));
        }
        let ask = |gpus: &[usize]| {
            let ask = helper::Ask {
                job,
                files: loaded.files,
                prepared_with: loaded.prepared_with.clone(),
                config: config.clone(),
                gpus: Some(gpus.to_vec()),
            };
            let sent = helper::ask(&ask, &loaded.blobs);
            if sent {
                shared.set(true);
            }
            sent
        };
        // A long job: the GPUs with the least room go to the helper before
        // any simulation; otherwise those the unlimited runs show are worth
        // it, once they are done.
        let events = loaded.prepared.job().n_events();
        let rooms: Vec<Option<u64>> = config
            .gpus
            .iter()
            .map(|target| {
                crate::simulator::GpuMemory::new(target.capacity, target.overheads.context_bytes)
                    .available_to_allocator()
            })
            .collect();
        let mut early = pipeline::share_early(&rooms, events, helper::MIN_SHARED_EVENTS);
        if !early.is_empty() && !ask(&early) {
            early.clear();
        }
        let mut hand = |partings: &[pipeline::Parting], events: u64| {
            if !early.is_empty() {
                return Vec::new();
            }
            let gpus = pipeline::share_with_one(partings, events, helper::MIN_SHARED_EVENTS);
            if gpus.is_empty() || !ask(&gpus) {
                return Vec::new();
            }
            gpus
        };
        let split = pipeline::estimate_split(
            &loaded.prepared,
            config,
            &mut progress,
            &pipeline::InTurn,
            &early,
            &mut hand,
        );
        let result = match split {
            Ok(pending) if !pending.elsewhere().is_empty() => Estimated::Waiting(Box::new(pending)),
            Ok(pending) => Estimated::Now(
                pending
                    .finish(&loaded.prepared, config, Vec::new(), &mut progress)
                    .map(|report| Box::new(report.value))
                    .map_err(|err| err.to_string()),
            ),
            Err(err) => Estimated::Now(Err(err.to_string())),
        };
        Some((kept.trace.clone(), result))
    });
    match outcome {
        None => post(Response::NeedTrace { job }),
        Some((trace, Estimated::Now(result))) => {
            // Runs handed early that turned out to be the unlimited run's:
            // the helper's work on them is not needed.
            if shared.get() {
                if let Ok(scope) = js_sys::global().dyn_into::<DedicatedWorkerGlobalScope>() {
                    helper::drop_handed(&scope);
                }
            }
            post_result(job, trace, result, post)
        }
        Some((trace, Estimated::Waiting(pending))) => {
            let waiting = WaitingRuns {
                job,
                trace,
                config: config.clone(),
                pending,
                progress: last.get(),
            };
            WAITING_RUNS.with(|slot| *slot.borrow_mut() = Some(waiting));
            helper_progress(job, 0, 1, post);
        }
    }
}

/// An estimate made, or waiting for the runs the helper makes.
enum Estimated {
    Now(Result<Box<crate::report::Report>, String>),
    Waiting(Box<pipeline::Pending>),
}

/// The simulation helper's progress on `job`'s runs (`done` of its `total`
/// events), shown as the estimate's.
pub(super) fn helper_progress(job: u32, done: u64, total: u64, post: &dyn Fn(Response)) {
    let here = WAITING_RUNS.with(|slot| {
        slot.borrow()
            .as_ref()
            .filter(|w| w.job == job)
            .map(|w| w.progress)
    });
    let Some(here) = here else {
        return;
    };
    let left = here.total.saturating_sub(here.done);
    let there = u128::from(left) * u128::from(done.min(total)) / u128::from(total.max(1));
    post(Response::Progress {
        job,
        stage: WorkStage::SimulatingShared,
        done: here
            .done
            .saturating_add(u64::try_from(there).unwrap_or(left)),
        total: here.total,
    });
}

/// The runs the simulation helper made for `job`: its estimate is finished
/// and posted; where the helper could not make them, they are simulated
/// here.
pub(super) fn helper_runs(
    job: u32,
    runs: Result<Vec<(usize, crate::report::SimulatedRun)>, String>,
    post: &dyn Fn(Response),
) {
    let waiting = WAITING_RUNS.with(|slot| {
        let mut slot = slot.borrow_mut();
        match slot.as_ref() {
            Some(w) if w.job == job => slot.take(),
            _ => None,
        }
    });
    let Some(waiting) = waiting else {
        return;
    };
    let mut progress = progress_poster(job, post);
    let result = PREPARED.with(|slot| {
        let slot = slot.borrow();
        let prepared = &slot.as_ref()?.loaded.prepared;
        let config = &waiting.config;
        let given = match runs {
            Ok(given) => Ok(given),
            Err(_) => pipeline::runs_at_capacity(
                prepared,
                config,
                waiting.pending.elsewhere(),
                &mut |_| {},
                &pipeline::InTurn,
            ),
        };
        Some(
            given
                .and_then(|given| {
                    waiting
                        .pending
                        .finish(prepared, config, given, &mut progress)
                })
                .map(|report| Box::new(report.value))
                .map_err(|err| err.to_string()),
        )
    });
    match result {
        None => post(Response::NeedTrace { job }),
        Some(result) => post_result(job, waiting.trace, result, post),
    }
}
