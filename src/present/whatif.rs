//! What-if results laid out once for both shells: a title, a headline, a
//! table (headers and rows of formatted cells), the bars or batch curve of
//! its chart and its notes. The page draws and tabulates a [`Figure`]; the
//! CLI prints the same [`Figure`] as an aligned text table ([`text`]).

use super::{exact, gib, percent, short, signed, thousands};
use crate::whatif::context::Found;
use crate::whatif::planned::Planner;
use crate::whatif::zero_grad::Placement;
use crate::whatif::WhatIfResult;
use crate::Bytes;

/// The batch chart's data: (batch, peak total) points and, per GPU, its
/// capacity line and the largest batch that fits.
pub type BatchChart = (Vec<(u32, Bytes)>, Vec<(String, Bytes, u32)>);

/// A what-if result laid out for display: the same title, table and notes
/// in the page and the CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figure {
    pub title: String,
    pub headline: Option<String>,
    pub headers: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
    /// One bar per row (label, peak total, highlighted); empty for the batch chart.
    pub bars: Vec<(String, Bytes, bool)>,
    pub batch: Option<BatchChart>,
    pub notes: Vec<String>,
}

/// Thousandths as a percentage with one decimal.
fn permille(value: u64) -> String {
    format!("{}.{} %", value / 10, value % 10)
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
pub fn figure(result: &WhatIfResult) -> Figure {
    match result {
        WhatIfResult::Alloc(c) => Figure {
            title: "Allocator settings".into(),
            headline: Some(if c.recommended_conf.is_empty() {
                "best: PyTorch's defaults; leave PYTORCH_CUDA_ALLOC_CONF unset".to_owned()
            } else {
                format!("best: PYTORCH_CUDA_ALLOC_CONF={}", c.recommended_conf)
            }),
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
        WhatIfResult::ZeroGrad(c) => Figure {
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
                    "live lower bound (peak allocated)".to_owned(),
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
            Figure {
                title: "Planned allocation".into(),
                headline: Some(format!(
                    "offline plan: PyTorch reserves {} of it; the plan ({}, {} requests) is {} of the live-tensor lower bound",
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
        WhatIfResult::Distributed(c) => Figure {
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
        WhatIfResult::Precision(c) => Figure {
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
        WhatIfResult::Batch(s) => Figure {
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
            // The target's runs at capacity make the chart (the first GPU
            // where it is not one).
            let target = s
                .gpus
                .iter()
                .position(|g| g.preset == s.reference_gpu)
                .unwrap_or(0);
            let target_name = s
                .gpus
                .get(target)
                .map_or("the first GPU", |g| g.preset.as_str());
            let num = |x: Option<u64>| x.map_or_else(|| "–".to_owned(), thousands);
            let limit = match (s.position_limit, &s.position_limit_from) {
                (Some(n), Some(from)) => {
                    format!("the model's position limit: {} ({from})", thousands(n))
                }
                _ => "no position limit in the trace".to_owned(),
            };
            Figure {
                title: "Longest generation".into(),
                headline: Some(format!(
                    "A {}-token prompt, {} new tokens traced; every length up to {} new tokens simulated; {limit}",
                    num(s.prompt_tokens),
                    thousands(u64::from(s.traced_new_tokens)),
                    thousands(u64::from(s.budget_new_tokens))
                )),
                headers: vec!["GPU", "new tokens", "context (prompt + new)", "how"],
                rows: s
                    .gpus
                    .iter()
                    .map(|g| {
                        let at_least = if matches!(
                            g.found,
                            Found::NoLimitInTrace | Found::MemoryBudget | Found::MostNewTokens
                        ) {
                            "≥ "
                        } else {
                            ""
                        };
                        let how = match (g.runs_out_at, g.shown_by) {
                            (Some(n), Some(by)) => format!(
                                "{}; {} runs out (the {}-token run's first call ran out there)",
                                g.found.label(),
                                thousands(n),
                                thousands(u64::from(by))
                            ),
                            (Some(n), None) => format!("{}; {} runs out", g.found.label(), thousands(n)),
                            _ => g.found.label().to_owned(),
                        };
                        vec![
                            g.preset.clone(),
                            format!("{at_least}{}", num(g.max_new_tokens)),
                            format!("{at_least}{}", num(g.max_context_tokens)),
                            how,
                        ]
                    })
                    .collect(),
                bars: {
                    s.points
                        .iter()
                        .filter_map(|p| {
                            let run = p.runs.get(target).copied().flatten()?;
                            let fits = if run.fits { "" } else { ", does not fit" };
                            Some((format!("{} new tokens{fits}", thousands(u64::from(p.new_tokens))), run.peak_total_bytes, run.fits))
                        })
                        .collect()
                },
                batch: None,
                notes: s
                    .warnings
                    .iter()
                    .filter(|w| w.code == "context_memory_budget")
                    .map(|w| w.message.clone())
                    .chain([
                    "Each length is the whole generation simulated: the decode steps copied, the KV cache grown a position a step, every block through the caching allocator; no limit is extrapolated.".to_owned(),
                    "A run that runs out of memory in its first generate() call's decode steps shows that every longer generation runs out there too: up to that step it makes the same allocations (a cache grown a step at a time), so the allocator decides the same.".to_owned(),
                    format!("The page's chart: {target_name}'s peak at its capacity (reserved plus CUDA context; up to where it runs out of memory) at each length simulated on it, green where it fits."),
                    "With a position limit the search goes up to it; without one it stops at the simulation budget (new tokens simulated at most), and a GPU that still fits there fits at least that many new tokens.".to_owned(),
                    ])
                    .collect(),
            }
        }
    }
}

/// A figure as plain text: title, headline, the table with its columns
/// aligned, and the notes (what the CLI prints).
pub fn text(figure: &Figure) -> String {
    let mut out = String::new();
    out.push_str(&figure.title);
    out.push('\n');
    if let Some(h) = &figure.headline {
        out.push_str(h);
        out.push('\n');
    }
    let width = |s: &str| s.chars().count();
    let columns = figure.headers.len();
    let mut widths: Vec<usize> = figure.headers.iter().map(|h| width(h)).collect();
    for row in &figure.rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(width(cell));
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| -> String {
        let padded: Vec<String> = cells
            .zip(&widths)
            .map(|(cell, w)| format!("{cell}{}", " ".repeat(w.saturating_sub(width(cell)))))
            .collect();
        format!("  {}\n", padded.join("  ").trim_end())
    };
    out.push_str(&line(&mut figure.headers.iter().copied()));
    for row in &figure.rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    if let Some((points, _)) = &figure.batch {
        out.push_str("  peak total per batch size:");
        for (batch, bytes) in points {
            out.push_str(&format!(" {batch}: {}", short(*bytes)));
        }
        out.push('\n');
    }
    for note in &figure.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}
