//! The what-if panel: any [`WhatIfResult`] as a chart and the table of its
//! numbers. Display only: the numbers come from `crate::whatif`.

use leptos::prelude::*;

use super::charts;
use super::format::{exact, gib, open_state, short};
use crate::whatif::planned::Planner;
use crate::whatif::zero_grad::Placement;
use crate::whatif::WhatIfResult;
use crate::Bytes;

/// The batch chart's data: (batch, peak total) points and, per GPU, its
/// capacity line and the largest batch that fits.
type BatchChart = (Vec<(u32, Bytes)>, Vec<(String, Bytes, u32)>);

/// A what-if result laid out for display.
struct Layout {
    title: String,
    headline: Option<String>,
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    /// One bar per row (label, peak total, highlighted); empty for the batch chart.
    bars: Vec<(String, Bytes, bool)>,
    batch: Option<BatchChart>,
    notes: Vec<String>,
}

fn signed(delta: i64) -> String {
    let magnitude = short(Bytes(delta.unsigned_abs()));
    if delta < 0 {
        format!("−{magnitude}")
    } else {
        format!("+{magnitude}")
    }
}

/// Thousandths as a percentage with one decimal.
fn permille(value: u64) -> String {
    format!("{}.{} %", value / 10, value % 10)
}

/// `part / whole` as a percentage with one decimal (integer arithmetic).
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "–".to_owned();
    }
    let tenths = (u128::from(part) * 1000 + u128::from(whole) / 2) / u128::from(whole);
    format!("{}.{} %", tenths / 10, tenths % 10)
}

fn placement(placement: Option<Placement>) -> &'static str {
    match placement {
        Some(Placement::StartOfIteration) => "start of iteration (pos1)",
        Some(Placement::BeforeBackward) => "before backward (pos0)",
        None => "kept across iterations",
    }
}

/// How each what-if result is shown: its title, the rows of its bar chart
/// (or the batch chart's points and capacity lines), its table headers and
/// rows, and its notes. One arm per what-if, so that adding one is one arm.
fn layout(result: &WhatIfResult) -> Layout {
    match result {
        WhatIfResult::Alloc(c) => Layout {
            title: "Allocator settings".into(),
            headline: Some(format!(
                "Best: PYTORCH_CUDA_ALLOC_CONF={:?}",
                c.recommended_conf
            )),
            headers: vec![
                "setting",
                "peak total",
                "peak reserved",
                "fragmentation",
                "segments",
                "vs default",
            ],
            rows: c
                .rows
                .iter()
                .map(|r| {
                    vec![
                        if r.conf.is_empty() {
                            "default".into()
                        } else {
                            r.conf.clone()
                        },
                        exact(r.peak.total_bytes),
                        exact(r.peak.reserved_bytes),
                        short(r.fragmentation_bytes),
                        r.peak_segments.to_string(),
                        signed(r.delta_total_bytes),
                    ]
                })
                .collect(),
            bars: c
                .rows
                .iter()
                .enumerate()
                .map(|(idx, r)| {
                    let name = if r.conf.is_empty() {
                        "default".to_string()
                    } else {
                        r.conf.clone()
                    };
                    (name, r.peak.total_bytes, idx == c.best)
                })
                .collect(),
            batch: None,
            notes: c.notes.clone(),
        },
        WhatIfResult::ZeroGrad(c) => Layout {
            title: "zero_grad placement and set_to_none".into(),
            headline: None,
            headers: vec![
                "gradients freed",
                "set_to_none",
                "captured",
                "peak total",
                "vs captured",
            ],
            rows: c
                .rows
                .iter()
                .map(|r| {
                    vec![
                        placement(r.placement).into(),
                        r.set_to_none.to_string(),
                        if r.captured {
                            "yes".into()
                        } else {
                            String::new()
                        },
                        exact(r.peak.total_bytes),
                        signed(r.delta_total_bytes),
                    ]
                })
                .collect(),
            bars: c
                .rows
                .iter()
                .map(|r| {
                    (
                        format!("{}, set_to_none={}", placement(r.placement), r.set_to_none),
                        r.peak.total_bytes,
                        r.captured,
                    )
                })
                .collect(),
            batch: None,
            notes: c.notes.clone(),
        },
        WhatIfResult::Plan(p) => {
            let won = |planner: Planner| if p.winner == planner { "yes" } else { "" };
            let rows = [
                (
                    "live tensors (lower bound, peak allocated)".to_owned(),
                    "live tensors",
                    p.live_lower_bound_bytes,
                    "",
                ),
                (
                    format!(
                        "STWeaver plan ({} phase groups, {} fused, {} layers)",
                        p.phase_groups, p.fused_groups, p.memory_layers
                    ),
                    "STWeaver plan",
                    p.stweaver_bytes,
                    won(Planner::Stweaver),
                ),
                (
                    format!("best-fit plan ({} sizes)", p.size_groups),
                    "best-fit plan",
                    p.best_fit_bytes,
                    won(Planner::BestFit),
                ),
                (
                    "PyTorch peak allocated (whole blocks)".to_owned(),
                    "PyTorch allocated",
                    p.pytorch_allocated_bytes,
                    "",
                ),
                (
                    "PyTorch peak reserved".to_owned(),
                    "PyTorch reserved",
                    p.pytorch_reserved_bytes,
                    "",
                ),
            ];
            let bound = p.live_lower_bound_bytes.get();
            Layout {
                title: "Planned allocation".into(),
                headline: Some(format!(
                    "PyTorch reserves {} of the plan; the plan ({}, {} requests) is {} of the live-tensor lower bound",
                    permille(p.reserved_per_planned_permille),
                    match p.winner {
                        Planner::Stweaver => "STWeaver",
                        Planner::BestFit => "best fit",
                    },
                    p.requests,
                    permille(p.planned_per_lower_bound_permille),
                )),
                headers: vec!["", "bytes", "GiB", "vs lower bound", "kept"],
                rows: rows
                    .iter()
                    .map(|(n, _, b, kept)| {
                        vec![
                            n.clone(),
                            exact(*b),
                            gib(*b),
                            percent(b.get(), bound),
                            (*kept).to_owned(),
                        ]
                    })
                    .collect(),
                bars: rows
                    .iter()
                    .map(|(_, bar, b, kept)| ((*bar).to_owned(), *b, !kept.is_empty()))
                    .collect(),
                batch: None,
                notes: p.notes.clone(),
            }
        }
        WhatIfResult::Distributed(c) => Layout {
            title: format!("Distributed training, per GPU, {} GPUs", c.world_size),
            headline: None,
            headers: vec![
                "strategy",
                "peak total per GPU",
                "NCCL (assumed)",
                "added buffers",
            ],
            rows: c
                .rows
                .iter()
                .map(|r| {
                    vec![
                        format!("{:?}", r.strategy),
                        exact(r.peak.total_bytes),
                        short(r.nccl_bytes),
                        short(r.added_bytes),
                    ]
                })
                .collect(),
            bars: c
                .rows
                .iter()
                .map(|r| {
                    (
                        format!("{:?}", r.strategy),
                        r.peak.total_bytes.saturating_add(r.nccl_bytes),
                        false,
                    )
                })
                .collect(),
            batch: None,
            notes: c.assumptions.clone(),
        },
        WhatIfResult::Precision(c) => Layout {
            title: format!(
                "Mixed precision (CUDA autocast, PyTorch {} policy)",
                c.policy
            ),
            headline: Some(format!("{} with autocast", signed(c.delta_total_bytes))),
            headers: vec!["", "peak total", "peak reserved", "peak allocated"],
            rows: [
                ("fp32 (as captured)", &c.fp32),
                ("bf16/fp16 autocast", &c.autocast_16bit),
            ]
            .iter()
            .map(|(n, p)| {
                vec![
                    n.to_string(),
                    exact(p.total_bytes),
                    exact(p.reserved_bytes),
                    exact(p.allocated_bytes),
                ]
            })
            .collect(),
            bars: vec![
                ("fp32".into(), c.fp32.total_bytes, false),
                ("autocast".into(), c.autocast_16bit.total_bytes, true),
            ],
            batch: None,
            notes: c
                .changes
                .iter()
                .map(|ch| {
                    format!(
                        "{}: {} blocks, {} — {}",
                        ch.rule.name(),
                        ch.blocks,
                        signed(ch.bytes),
                        ch.reason
                    )
                })
                .collect(),
        },
        WhatIfResult::Batch(s) => Layout {
            title: format!("Batch size ({})", s.certainty.replace('_', " ")),
            headline: None,
            headers: vec!["GPU", "capacity", "largest batch that fits"],
            rows: s
                .max_batch
                .iter()
                .map(|m| vec![m.preset.clone(), gib(m.capacity_bytes), m.batch.to_string()])
                .collect(),
            bars: Vec::new(),
            batch: Some((
                s.points
                    .iter()
                    .map(|p| (p.batch, p.peak_total_bytes))
                    .collect(),
                s.max_batch
                    .iter()
                    .map(|m| (m.preset.clone(), m.capacity_bytes, m.batch))
                    .collect(),
            )),
            notes: s.notes.clone(),
        },
        WhatIfResult::Context(s) => {
            use crate::whatif::context::Found;
            let num = |x: Option<u64>| x.map_or_else(|| "–".to_owned(), |x| x.to_string());
            Layout {
                title: "Longest generation".into(),
                headline: Some(format!(
                    "A {}-token prompt, {} new tokens traced; every length up to {} new tokens simulated",
                    num(s.prompt_tokens),
                    s.traced_new_tokens,
                    s.budget_new_tokens
                )),
                headers: vec!["GPU", "new tokens", "context (prompt + new)", "how"],
                rows: s
                    .gpus
                    .iter()
                    .map(|g| {
                        let how = match g.found {
                            Found::Simulated => "simulated",
                            Found::Extrapolated => "extrapolated past the simulated lengths",
                            Found::DoesNotFit => "the traced generation does not fit",
                            Found::NoGrowth => "no growth seen: no limit found",
                        };
                        vec![g.preset.clone(), num(g.max_new_tokens), num(g.max_context_tokens), how.to_owned()]
                    })
                    .collect(),
                bars: s
                    .points
                    .iter()
                    .map(|p| (format!("{} new tokens", p.new_tokens), p.peak.total_bytes, false))
                    .collect(),
                batch: None,
                notes: vec![
                    "Each length is the whole generation simulated: the decode steps copied, the KV cache grown a position a step, every block through the caching allocator.".to_owned(),
                    "Past the simulated lengths a limit is extrapolated at the steepest of the total's growth, the live bytes' growth and the KV cache's bytes per token; growing caches fragment more at longer lengths, so it can be optimistic.".to_owned(),
                ],
            }
        }
    }
}

/// One what-if result: chart, table and notes.
#[component]
pub fn WhatIfPanel(
    /// The result to show.
    result: WhatIfResult,
) -> impl IntoView {
    let layout = layout(&result);
    let json_details = NodeRef::<leptos::html::Details>::new();
    let (json_open, json_toggled) = open_state(json_details);
    let json = result.to_json_pretty();
    let canvas = NodeRef::<leptos::html::Canvas>::new();
    let bars = layout.bars.clone();
    let batch = layout.batch.clone();
    let height = if batch.is_some() {
        320
    } else {
        40 + 34 * bars.len().max(1)
    };
    let batch_points = batch
        .as_ref()
        .map(|(points, _)| points.clone())
        .unwrap_or_default();
    Effect::new(move |_| {
        if let Some(element) = canvas.get() {
            let drawn = match &batch {
                Some((points, capacities)) => charts::batch(&element, points, capacities),
                None => charts::bars(&element, &bars),
            };
            if let Err(message) = drawn {
                web_sys::console::warn_1(&format!("chart not drawn: {message}").into());
            }
        }
    });
    view! {
        <div id="whatif-result" class="whatif-result">
            <h3>{layout.title}</h3>
            {layout.headline.map(|h| view! { <p class="whatif-headline">{h}</p> })}
            <canvas id="whatif-chart" node_ref=canvas width="900" height=height.to_string()></canvas>
            <table id="whatif-table">
                <thead><tr>{layout.headers.iter().map(|h| view! { <th>{*h}</th> }).collect_view()}</tr></thead>
                <tbody>
                    {layout.rows.into_iter().map(|row| view! {
                        <tr>{row.into_iter().map(|cell| view! { <td>{cell}</td> }).collect_view()}</tr>
                    }).collect_view()}
                </tbody>
            </table>
            {(!batch_points.is_empty()).then(|| view! {
                <details class="numbers">
                    <summary>"Peak per batch size"</summary>
                    <table id="batch-points">
                        <thead><tr><th>"batch"</th><th>"peak total"</th></tr></thead>
                        <tbody>
                            {batch_points.iter().map(|(b, bytes)| view! { <tr><td>{*b}</td><td class="num">{exact(*bytes)}</td></tr> }).collect_view()}
                        </tbody>
                    </table>
                </details>
            })}
            <ul class="notes">{layout.notes.into_iter().map(|n| view! { <li>{n}</li> }).collect_view()}</ul>
            <details id="whatif-json-details" class="numbers" node_ref=json_details on:toggle=json_toggled>
                <summary>"JSON (the same as the CLI's "<code>"--json"</code>")"</summary>
                {move || json_open.get().then(|| view! {
                    <textarea id="whatif-json" readonly rows="12">{json.clone()}</textarea>
                })}
            </details>
        </div>
    }
}
