//! The what-if panel: any [`WhatIfResult`] as a chart and the table of its
//! numbers, laid out by the core ([`crate::present::whatif::figure`], which
//! the CLI prints as text). Display only.

use leptos::prelude::*;

use super::charts;
use super::format::{exact, open_state};
use crate::whatif::WhatIfResult;

/// One what-if result: chart, table and notes.
#[component]
pub fn WhatIfPanel(
    /// The result to show.
    result: WhatIfResult,
) -> impl IntoView {
    let layout = crate::present::whatif::figure(&result);
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
            charts::fit_all(&[&element]);
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
