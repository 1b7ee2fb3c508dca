//! The estimate on screen: the first screen's verdict (marked when it came
//! from a permalink) and the details below it — summary, what was rebuilt
//! for a deeper or longer job, charts with their tables, layers, warnings,
//! the report JSON and the link. Display only: every number is the report's.

use leptos::prelude::*;
use wasm_bindgen_futures::JsFuture;

use super::answer::Answer;
use super::charts::{self, Band};
use super::format::{exact, gib, open_state, seconds, short, thousands};
use super::scale::{scaled_note, ScaledTable};
use crate::orchestrator::Phase;
use crate::permalink::TraceIdentity;
use crate::pipeline::Settings;
use crate::report::{Breakdown, GpuVerdict, LayerKey, Margin, Report};

/// An estimate on screen.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Shown {
    pub(super) trace: TraceIdentity,
    /// What it was computed with.
    pub(super) settings: Settings,
    pub(super) report: Report,
    /// Opened from a permalink (no trace in this browser).
    pub(super) shared: bool,
}

/// The breakdown's rows in chart order, each with its colour's index in
/// [`charts::CATEGORY_COLORS`]; the quantisation state (after the
/// parameters) and a generation's KV cache (last) only when there is some.
fn breakdown_parts(breakdown: &Breakdown) -> Vec<charts::Part> {
    let optional =
        |label, bytes: crate::Bytes, color| (!bytes.is_zero()).then_some((label, bytes, color));
    [
        Some(("parameters", breakdown.parameters, 0)),
        optional("quantisation state", breakdown.quant_state, 10),
        Some(("buffers", breakdown.buffers, 1)),
        Some(("gradients", breakdown.gradients, 2)),
        Some(("optimizer state", breakdown.optimizer_state, 3)),
        Some(("activations", breakdown.activations, 4)),
        Some(("batch", breakdown.batch, 5)),
        Some(("temporaries", breakdown.temporaries, 6)),
        Some(("cached / fragmentation", breakdown.cached, 7)),
        Some(("CUDA context + workspaces", breakdown.overheads, 8)),
        optional("KV cache", breakdown.kv_cache, 9),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The GPU table's rows: the target first, then the others by capacity,
/// smallest first (the report keeps the order the GPUs were chosen in).
fn gpu_rows(report: &Report) -> Vec<GpuVerdict> {
    let mut rows = report.gpus.clone();
    rows.sort_by_key(|g| {
        (
            g.preset != report.reference_gpu,
            g.capacity_bytes,
            g.preset.clone(),
        )
    });
    rows
}

/// The shaded phases of the timeline, and their names for the legend.
const BAND_PHASES: [(Phase, &str); 6] = [
    (Phase::DataLoading, "data loading"),
    (Phase::ZeroGrad, "zero_grad"),
    (Phase::Forward, "forward"),
    (Phase::Backward, "backward"),
    (Phase::OptimizerStep, "optimizer step"),
    (Phase::ClipGrad, "gradient clipping"),
];

fn phase_bands(report: &Report) -> Vec<Band> {
    report
        .phases
        .iter()
        .filter_map(|window| {
            let shade = BAND_PHASES
                .iter()
                .position(|(phase, _)| *phase == window.phase)?;
            Some(Band {
                start_ns: window.start.get(),
                end_ns: window.end.get(),
                label: BAND_PHASES[shade].1.to_string(),
                shade,
            })
        })
        .collect()
}

/// The page's control for a setting a warning asks for: the element's id and
/// the button's words (`None`: the page has none, e.g. the batch sizes of a
/// batch sweep, which is the CLI's `memcast batch`, or the memory budget,
/// which on the page is the worker's own, below the wasm heap).
fn control_of(setting: crate::diag::Setting) -> Option<(&'static str, &'static str)> {
    use crate::diag::Setting;
    match setting {
        Setting::CudaContext => Some(("cuda-context", "Set the CUDA context")),
        Setting::Iterations => Some(("iterations", "Set the iterations")),
        Setting::ParameterBytes => Some(("params", "Give the parameter bytes")),
        Setting::SequenceLength => Some(("seq-len", "Set the sequence length")),
        Setting::WorldSize => Some(("world-size", "Set the number of GPUs")),
        Setting::BatchSizes | Setting::TargetBatch | Setting::MemoryBudget => None,
    }
}

/// Opens the form that holds the control `id`, scrolls to it and focuses it.
fn focus_control(id: &str) {
    use wasm_bindgen::JsCast;
    let Some(element) = document().get_element_by_id(id) else {
        return;
    };
    if let Some(details) = element.closest("details").ok().flatten() {
        let _ = details.set_attribute("open", "");
    }
    element.scroll_into_view();
    if let Ok(input) = element.dyn_into::<web_sys::HtmlElement>() {
        let _ = input.focus();
    }
}

/// The first screen's answer, marked when it was opened from a permalink,
/// and greyed with the settings it answers when the fields ask for others.
#[component]
pub(super) fn Verdict(
    /// The estimate to answer for.
    shown: Shown,
    /// The choices the fields ask for that the estimate was not made with
    /// (an error: a field the page cannot read).
    mismatch: Signal<Result<Vec<crate::present::Changed>, String>>,
    /// Estimates what the fields ask for.
    apply: Callback<()>,
    /// Puts the estimate's own settings back in the fields.
    restore: Callback<()>,
) -> impl IntoView {
    let stale = move || mismatch.with(|m| m.as_ref().map_or(true, |m| !m.is_empty()));
    view! {
        <section class="result first" class:stale=stale>
            {move || mismatch.get().map_or_else(
                |message| Some(view! {
                    <div id="stale-banner" class="stale-banner" role="status">
                        <p>"This estimate answers its own settings, not the fields: "{message}"."</p>
                        <button id="stale-restore" type="button" on:click=move |_| restore.run(())>"Put its settings back"</button>
                    </div>
                }.into_any()),
                |changed| (!changed.is_empty()).then(|| view! {
                    <div id="stale-banner" class="stale-banner" role="status">
                        <p>"Not yet estimated — this answer is for "
                            {changed.iter().map(|c| format!("{} {}", c.what, c.shown)).collect::<Vec<_>>().join(", ")}
                            ", while the fields ask for "
                            <strong id="stale-asked">{changed.iter().map(|c| format!("{} {}", c.what, c.asked)).collect::<Vec<_>>().join(", ")}</strong>"."</p>
                        <button id="stale-apply" type="button" on:click=move |_| apply.run(())>"Estimate what the fields ask"</button>
                        " "<button id="stale-restore" type="button" on:click=move |_| restore.run(())>"Put the estimate's settings back"</button>
                    </div>
                }.into_any()),
            )}
            {shown.shared.then(|| view! {
                <p id="shared-banner" class="shared-banner">
                    "Shared estimate — computed elsewhere from "<strong>{shown.trace.name.clone()}</strong>
                    " (SHA-256 "<code>{shown.trace.sha256.chars().take(16).collect::<String>()}"…"</code>"). No trace is loaded in this browser."
                </p>
            })}
            <Answer report=shown.report.clone() />
            {scaled_note(&shown.report.summary.scaled).map(|note| view! {
                <p id="scaled-note" class="hint">{note}</p>
            })}
        </section>
    }
}

/// The estimate's details: summary, charts with their tables, layers,
/// warnings, JSON, link.
#[component]
pub(super) fn Results(
    /// The estimate to show.
    shown: Shown,
    /// Its permalink (with the what-if asked on it, if any).
    link: RwSignal<String>,
) -> impl IntoView {
    let report = shown.report.clone();
    let peak = report.peak.clone();
    let parts = breakdown_parts(&report.breakdown_at_peak);

    let timeline_canvas = NodeRef::<leptos::html::Canvas>::new();
    let gpu_canvas = NodeRef::<leptos::html::Canvas>::new();
    let breakdown_canvas = NodeRef::<leptos::html::Canvas>::new();
    let bands = phase_bands(&report);
    {
        let report = report.clone();
        let parts = parts.clone();
        Effect::new(move |_| {
            let (Some(timeline), Some(gpus), Some(breakdown)) = (
                timeline_canvas.get(),
                gpu_canvas.get(),
                breakdown_canvas.get(),
            ) else {
                return;
            };
            let (report, parts, bands) = (report.clone(), parts.clone(), bands.clone());
            charts::after_paint(move || {
                charts::fit_all(&[&timeline, &gpus, &breakdown]);
                let drawn = [
                    charts::timeline(&timeline, &report, &bands),
                    charts::gpus(&gpus, &report),
                    charts::breakdown(&breakdown, &parts),
                ];
                for message in drawn.into_iter().filter_map(Result::err) {
                    web_sys::console::warn_1(&format!("chart not drawn: {message}").into());
                }
            });
        });
    }

    let copied = RwSignal::new(false);
    let timeline_details = NodeRef::<leptos::html::Details>::new();
    let (timeline_open, timeline_toggled) = open_state(timeline_details);
    let json_details = NodeRef::<leptos::html::Details>::new();
    let (json_open, json_toggled) = open_state(json_details);
    let timeline = std::sync::Arc::new(report.timeline.clone());
    let json_report = std::sync::Arc::new(report.clone());
    let copy_link = move |_| {
        let clipboard = window().navigator().clipboard();
        let promise = clipboard.write_text(&link.get_untracked());
        leptos::task::spawn_local(async move {
            copied.set(JsFuture::from(promise).await.is_ok());
        });
    };
    let where_peak = {
        let at = &peak.at;
        let mut parts = Vec::new();
        if let Some(iteration) = at.iteration {
            parts.push(format!("iteration {iteration}"));
        }
        parts.push(format!("{:?}", at.phase).to_lowercase());
        if let Some(op) = &at.op {
            parts.push(format!("op {op}"));
        }
        if let Some(layer) = &at.layer {
            parts.push(format!("layer {layer}"));
        }
        parts.join(", ")
    };

    view! {
        <section id="results" class="result">
            <h2>"Details"</h2>
            <dl class="summary">
                <dt>"Trace"</dt><dd id="trace-name">{shown.trace.name.clone()}" ("{exact(shown.trace.size_bytes)}")"</dd>
                <dt>"Reserved by PyTorch"</dt><dd id="peak-reserved">{format!("{} — {}", gib(peak.reserved_bytes), exact(peak.reserved_bytes))}</dd>
                <dt>"Allocated (live tensors)"</dt><dd id="peak-allocated">{format!("{} — {}", gib(peak.allocated_bytes), exact(peak.allocated_bytes))}</dd>
                <dt>"CUDA context"</dt><dd>{format!("{} — {}", gib(peak.context_bytes), exact(peak.context_bytes))}</dd>
                <dt>"Where"</dt><dd id="peak-where">{where_peak}</dd>
                <dt>"Run"</dt><dd id="run-facts">{crate::present::run_line(&report)}</dd>
                <dt>"Recipe"</dt><dd id="recipe-facts">{crate::present::recipe_line(&report.summary)}</dd>
                <dt>"Model"</dt><dd id="model-facts">{crate::present::model_line(&report.summary)}</dd>
                {report.summary.capture.clone().map(|c| view! {
                    <dt>"Captured"</dt><dd id="capture-facts">{crate::present::captured(&c, &report.summary.scaled)}</dd>
                })}
                {report.summary.moe.clone().map(|m| view! {
                    <dt>"Experts"</dt><dd id="moe-facts">{format!("{} layers of {} experts ({}){}, {} of weights per expert per layer; rows per expert in the first layer: {}; {}",
                        m.layers, m.experts, m.implementation,
                        m.top_k.map(|k| format!(", top-{k}")).unwrap_or_default(),
                        short(m.expert_parameter_bytes),
                        m.routing.first().map(|r| r.tokens_per_expert.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")).unwrap_or_default(),
                        if m.routing_invariant { "memory does not depend on the routing".to_owned() } else {
                            format!("the worst routing could add up to {}", short(m.worst_routing_extra_bytes))
                        })}</dd>
                })}
                {report.summary.generation.clone().map(|g| view! {
                    <dt>"Generation"</dt><dd id="generation-facts">{format!("{} calls of the model (prefill + decode steps), {} KV cache: {} at the end{}; live peak {} in the prefill, {} in the decode steps",
                        g.calls, g.cache, short(g.kv_bytes_at_end),
                        g.bytes_per_token.map(|b| format!(", {} per token", exact(b))).unwrap_or_default(),
                        g.prefill_peak_allocated_bytes.map_or_else(|| "-".to_owned(), short),
                        g.decode_peak_allocated_bytes.map_or_else(|| "-".to_owned(), short))}</dd>
                })}
                <dt>"GPUs"</dt><dd>{shown.settings.gpus.join(", ")}{(!shown.settings.alloc_conf.is_empty()).then(|| format!(" — PYTORCH_CUDA_ALLOC_CONF={}", shown.settings.alloc_conf))}</dd>
            </dl>

            {(!report.summary.scaled.is_empty()).then(|| view! {
                <ScaledTable scaled=report.summary.scaled.clone() />
            })}

            <h3>"Timeline"</h3>
            <canvas id="timeline-chart" node_ref=timeline_canvas width="1040" height="320"></canvas>
            <p class="hint">"The horizontal axis is the CPU trace's clock: it orders the allocations as the job made them; it is not how long a step takes on a GPU."</p>
            <p class="legend">
                {BAND_PHASES.iter().enumerate().map(|(idx, (_, name))| {
                    let c = charts::BAND_COLORS[idx];
                    view! { <span class="swatch" style=format!("background: rgba({},{},{},0.35)", c.0, c.1, c.2)></span>" "{*name}" " }
                }).collect_view()}
            </p>
            <table id="iterations-table">
                <thead><tr><th>"iteration"</th><th>"from captured"</th><th>"start (CPU trace s)"</th><th>"end (CPU trace s)"</th><th>"peak allocated (B)"</th><th>"peak reserved (B)"</th></tr></thead>
                <tbody>
                    {report.iterations.iter().map(|it| {
                        let t0 = report.timeline.first().map_or(0, |f| f.time_ns.get());
                        view! {
                            <tr><td>{it.index}</td><td>{it.source}</td><td>{seconds(it.start_ns.get() - t0)}</td><td>{seconds(it.end_ns.get() - t0)}</td>
                                <td class="num">{thousands(it.peak_allocated_bytes.get())}</td><td class="num">{thousands(it.peak_reserved_bytes.get())}</td></tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
            <details class="numbers" node_ref=timeline_details on:toggle=timeline_toggled>
                <summary>"Timeline numbers ("{report.timeline.len()}" points)"</summary>
                <table id="timeline-table">
                    <thead><tr><th>"CPU trace time"</th><th>"allocated (B)"</th><th>"reserved (B)"</th></tr></thead>
                    <tbody>
                        // Built when first opened: thousands of rows cost more than the charts.
                        {move || timeline_open.get().then(|| {
                            let t0 = timeline.first().map_or(0, |f| f.time_ns.get());
                            timeline.iter().map(|p| view! {
                                <tr><td>{seconds(p.time_ns.get() - t0)}</td>
                                    <td>{thousands(p.allocated_bytes.get())}</td><td>{thousands(p.reserved_bytes.get())}</td></tr>
                            }).collect_view()
                        })}
                    </tbody>
                </table>
            </details>

            <h3>"GPUs"</h3>
            <div class="chart-and-table">
                <canvas id="gpu-chart" node_ref=gpu_canvas width="620" height={(60 + 44 * report.gpus.len().max(1)).to_string()}></canvas>
                <table id="gpu-table">
                    <thead><tr><th>"GPU"</th><th>"capacity"</th><th>"verdict"</th><th>"headroom / shortfall"</th></tr></thead>
                    <tbody>
                        {gpu_rows(&report).into_iter().map(|gpu| view! {
                            <tr class=match gpu.margin { Margin::Fits => "fits", Margin::Thin => "thin", Margin::DoesNotFit => "oom" }
                                class:target=gpu.preset == report.reference_gpu>
                                <td>{gpu.preset.clone()}{(gpu.preset == report.reference_gpu).then_some(" (target)")}</td>
                                <td title=exact(gpu.capacity_bytes)>{gib(gpu.capacity_bytes)}</td>
                                <td class="verdict">{if gpu.fits { gpu.margin.label() } else { Margin::DoesNotFit.label() }}</td>
                                <td>{match (gpu.headroom_bytes, gpu.shortfall_bytes) {
                                    (Some(headroom), _) => format!("+{} free", short(headroom)),
                                    (_, Some(shortfall)) => format!("needs {} more", short(shortfall)),
                                    _ => String::new(),
                                }}</td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
            </div>

            <h3>"Breakdown at the peak"</h3>
            <div class="chart-and-table">
                <canvas id="breakdown-chart" node_ref=breakdown_canvas width="620" height="150"></canvas>
                <table id="breakdown-table">
                    <thead><tr><th></th><th>"category"</th><th>"bytes"</th><th>"GiB"</th></tr></thead>
                    <tbody>
                        {parts.iter().map(|(label, bytes, idx)| {
                            let color = charts::CATEGORY_COLORS.get(*idx).map_or(String::new(), |c| format!("background: rgb({},{},{})", c.0, c.1, c.2));
                            view! {
                                <tr><td><span class="swatch" style=color></span></td><td>{*label}</td>
                                    <td class="num">{thousands(bytes.get())}</td><td class="num">{gib(*bytes)}</td></tr>
                            }
                        }).collect_view()}
                        <tr class="total"><td></td><td>"total"</td><td class="num">{thousands(report.breakdown_at_peak.total().get())}</td>
                            <td class="num">{gib(report.breakdown_at_peak.total())}</td></tr>
                    </tbody>
                </table>
            </div>

            // Without Python frames the report lists operators instead of layers.
            <h3>{if report.top_layers_by == LayerKey::Op { "Top operators at the peak" } else { "Top layers at the peak" }}</h3>
            <table id="layers-table">
                <thead><tr><th>{if report.top_layers_by == LayerKey::Op { "operator" } else { "layer" }}</th><th>"live bytes"</th></tr></thead>
                <tbody>
                    {report.top_layers.iter().map(|layer| view! {
                        <tr><td><code>{layer.layer.clone()}</code></td><td class="num">{thousands(layer.bytes.get())}</td></tr>
                    }).collect_view()}
                </tbody>
            </table>

            <h3>"Warnings"</h3>
            <ul id="warnings" class="warnings">
                {report.warnings.iter().map(|warning| {
                    let control = warning.setting.and_then(control_of);
                    view! {
                        <li><code>{warning.code.clone()}</code>" "{warning.message.clone()}
                            {control.map(|(id, label)| view! {
                                " "<button type="button" class="set-control" data-control=id
                                    on:click=move |_| focus_control(id)>{label}</button>
                            })}
                        </li>
                    }
                }).collect_view()}
            </ul>

            <details id="report-json-details" class="numbers" node_ref=json_details on:toggle=json_toggled>
                <summary>"Report JSON (the same as "<code>"memcast estimate --json"</code>")"</summary>
                {move || json_open.get().then(|| view! {
                    <textarea id="report-json" readonly rows="12">{serde_json::to_string_pretty(&*json_report).unwrap_or_default()}</textarea>
                })}
            </details>

            <h3>"Share"</h3>
            <div class="share">
                <input id="permalink" type="text" readonly prop:value=move || link.get() />
                <button id="copy-link" type="button" on:click=copy_link>"Copy link"</button>
                {move || copied.get().then(|| view! { <span class="copied">"Copied"</span> })}
            </div>
            <p class="hint">"The link carries this estimate (numbers, breakdown, a downsampled timeline, the GPUs and settings, the trace's name and SHA-256) — never the trace."</p>
        </section>
    }
}
