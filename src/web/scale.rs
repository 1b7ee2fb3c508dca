//! "Trace small, run big" (issue 24): the job to estimate when it is deeper
//! or longer than the traced one — the same figures as the CLI's `--layers`
//! and `--seq-len`, carried by the permalink. The form first says what the
//! trace is (its repeated block, their number, the sequence length and
//! batch: the report's `summary.traced`), so the user knows what the numbers
//! start from. The trace is rebuilt before the analyzer, so applying them
//! runs the last trace (or traces) again rather than only re-simulating.

use leptos::prelude::*;

use super::format::short;
use crate::pipeline::Settings;
use crate::scale::{ScaleFacts, Traced};

/// The two figures, as typed (empty: as traced).
#[derive(Debug, Clone, Copy)]
pub struct ScaleChoice {
    pub layers: RwSignal<String>,
    pub seq_len: RwSignal<String>,
    /// New tokens of a generate() run (`--new-tokens`).
    pub new_tokens: RwSignal<String>,
}

/// A figure as [`Settings`] takes it: `None` when blank, an error naming
/// the field when it is not a whole number.
fn figure(text: &str, what: &str) -> Result<Option<u32>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<u32>().map(Some).map_err(|_| {
        format!("the {what} must be a whole number of at least 1, or empty for the trace's own")
    })
}

impl ScaleChoice {
    pub fn new() -> ScaleChoice {
        ScaleChoice {
            layers: RwSignal::new(String::new()),
            seq_len: RwSignal::new(String::new()),
            new_tokens: RwSignal::new(String::new()),
        }
    }

    /// Restores the figures of a permalink's settings.
    pub fn restore(&self, settings: &Settings) {
        let text = |value: Option<u32>| value.map(|v| v.to_string()).unwrap_or_default();
        self.layers.set(text(settings.layers));
        self.seq_len.set(text(settings.seq_len));
        self.new_tokens.set(text(settings.new_tokens));
    }

    /// Writes the figures into `settings` (blank: as traced).
    pub fn apply_to(&self, settings: &mut Settings) -> Result<(), String> {
        settings.layers = figure(&self.layers.get_untracked(), "number of layers")?;
        settings.seq_len = figure(&self.seq_len.get_untracked(), "sequence length")?;
        settings.new_tokens = figure(&self.new_tokens.get_untracked(), "number of new tokens")?;
        Ok(())
    }

    /// Fills the blank figures with those of `settings` (a capture's
    /// figures the estimate took), leaving what the user typed.
    pub fn fill_blank(&self, settings: &Settings) {
        let fill = |field: RwSignal<String>, value: Option<u32>| {
            if let Some(v) = value {
                if field.get_untracked().trim().is_empty() {
                    field.set(v.to_string());
                }
            }
        };
        fill(self.layers, settings.layers);
        fill(self.seq_len, settings.seq_len);
        fill(self.new_tokens, settings.new_tokens);
    }

    /// Subscribes the running effect or memo to every figure.
    pub fn track(&self) {
        self.layers.track();
        self.seq_len.track();
        self.new_tokens.track();
    }

    /// Whether a sequence length is typed (several traces need one).
    pub fn has_length(&self) -> bool {
        !self.seq_len.get_untracked().trim().is_empty()
    }
}

/// What the shown estimate says of its trace, for the form.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceFacts {
    pub traced: Traced,
    pub scaled: ScaleFacts,
}

/// "32 and 64", "32, 64 and 128".
fn lengths(values: &[u32]) -> String {
    let text: Vec<String> = values.iter().map(u32::to_string).collect();
    match text.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => text.join(""),
    }
}

/// "Your trace has 2 blocks of `GPT2Block` at sequence length 128 (batch 4)."
fn traced_line(facts: &TraceFacts) -> impl IntoView {
    let traced = &facts.traced;
    // Several traces: the length fit lists every traced length.
    let several: Vec<u32> = facts
        .scaled
        .length
        .as_ref()
        .filter(|l| l.traced.len() > 1)
        .map(|l| l.traced.clone())
        .unwrap_or_default();
    let subject = if several.is_empty() {
        "Your trace has "
    } else {
        "Your traces have "
    };
    let blocks = match (&traced.block, traced.layers) {
        (Some(block), Some(layers)) => {
            let stacks = traced
                .stacks
                .filter(|s| *s > 1)
                .map(|s| format!(" ×{s} stacks"))
                .unwrap_or_default();
            view! {
                {format!("{layers} blocks of ")}<code>{block.clone()}</code>{stacks}
            }
            .into_any()
        }
        _ => "no repeated block (layer) that could be copied".into_any(),
    };
    // A model without token ids (a CNN) has no sequence: nothing to say.
    let length = match (several.is_empty(), traced.seq_len) {
        (false, _) => format!(" at sequence lengths {}", lengths(&several)),
        (true, Some(len)) => format!(" at sequence length {len}"),
        (true, None) => String::new(),
    };
    let batch = traced
        .batch
        .map(|b| format!(" (batch {b})"))
        .unwrap_or_default();
    view! {
        <p id="traced-facts" class="traced">{subject}{blocks}{length}{batch}"."</p>
    }
}

/// The form: what the trace is, and the job to estimate instead. `facts`
/// is the shown estimate's (none before the first); `pending` names files
/// that wait for a sequence length; `apply` runs the last trace again with
/// the figures.
#[component]
pub fn ScaleForm(
    choice: ScaleChoice,
    #[prop(into)] facts: Signal<Option<TraceFacts>>,
    pending: RwSignal<Option<String>>,
    apply: Callback<()>,
) -> impl IntoView {
    let placeholder = move |of: fn(&Traced) -> Option<u32>| {
        facts.with(|f| {
            f.as_ref()
                .and_then(|f| of(&f.traced))
                .map_or_else(|| "as traced".to_owned(), |v| format!("traced: {v}"))
        })
    };
    view! {
        <section id="scale" class="settings scale">
            <div class="scale-text">
                {move || match facts.get() {
                    Some(facts) => traced_line(&facts).into_any(),
                    None => view! {
                        <p class="hint">"Trace small, run big: trace your job with a few layers and a short sequence on the CPU, then estimate it at its full depth and length here (or drop two or three traces of it at different sequence lengths together)."</p>
                    }.into_any(),
                }}
                {move || pending.get().map(|names| view! {
                    <p id="scale-pending" class="pending">
                        <strong>{names}</strong>": traces of one job at different sequence lengths — give the sequence length to estimate, then Apply."
                    </p>
                })}
            </div>
            <form class="scale-figures" on:submit=move |ev| { ev.prevent_default(); apply.run(()); }>
                <span class="label">"Estimate for: "</span>
                <label>
                    <input id="layers" type="number" min="1" step="1"
                        placeholder=move || placeholder(|t| t.layers)
                        prop:value=move || choice.layers.get()
                        on:input=move |ev| choice.layers.set(event_target_value(&ev)) />
                    " layers"
                </label>
                <label>
                    <input id="seq-len" type="number" min="1" step="1"
                        placeholder=move || placeholder(|t| t.seq_len)
                        prop:value=move || choice.seq_len.get()
                        on:input=move |ev| choice.seq_len.set(event_target_value(&ev)) />
                    " sequence length"
                </label>
                <label>
                    <input id="new-tokens" type="number" min="1" step="1"
                        placeholder="as traced"
                        prop:value=move || choice.new_tokens.get()
                        on:input=move |ev| choice.new_tokens.set(event_target_value(&ev)) />
                    " new tokens (generation)"
                </label>
                <button id="scale-apply" type="submit">"Apply"</button>
            </form>
        </section>
    }
}

/// The note under the verdict of a job that is not the traced one.
pub fn scaled_note(scaled: &ScaleFacts) -> Option<String> {
    if scaled.is_empty() {
        return None;
    }
    let mut job = Vec::new();
    let mut from = Vec::new();
    if let Some(depth) = &scaled.depth {
        job.push(format!("{} blocks per stack", depth.estimated));
        from.push(format!("{} blocks", depth.traced));
    }
    if let Some(length) = &scaled.length {
        job.push(format!("sequence length {}", length.estimated));
        let plural = if length.traced.len() > 1 { "s" } else { "" };
        from.push(format!(
            "sequence length{plural} {}",
            lengths(&length.traced)
        ));
    }
    if let Some(tokens) = &scaled.tokens {
        job.push(format!("{} new tokens", tokens.estimated));
        from.push(format!("{} new tokens", tokens.traced));
    }
    let several = scaled.length.as_ref().is_some_and(|l| l.traced.len() > 1);
    Some(format!(
        "For the job with {}, rebuilt from {} of {} and simulated in full.",
        job.join(" at "),
        if several { "traces" } else { "a trace" },
        from.join(" at ")
    ))
}

/// The details' table of what was rebuilt: which block, traced against
/// estimated, bytes per block, how the length was found.
#[component]
pub fn ScaledTable(scaled: ScaleFacts) -> impl IntoView {
    let depth = scaled.depth.map(|depth| {
        let how = depth
            .stacks
            .iter()
            .map(|s| {
                format!(
                    "{} (in {}) copied from {}: {} per forward call",
                    s.block,
                    s.parent,
                    s.template,
                    short(s.bytes_per_call)
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        view! {
            <tr id="scaled-depth"><td>"blocks per stack"</td><td class="num">{depth.traced}</td>
                <td class="num">{depth.estimated}</td><td>{how}</td></tr>
        }
    });
    let length = scaled.length.map(|length| {
        let how = format!(
            "{}: {} allocations grow as T, {} as T²",
            if length.method == "fit" {
                "each size fitted across the traces"
            } else {
                "from the trace's recorded shapes"
            },
            length.linear,
            length.quadratic
        );
        view! {
            <tr id="scaled-length"><td>"sequence length"</td><td class="num">{lengths(&length.traced)}</td>
                <td class="num">{length.estimated}</td><td>{how}</td></tr>
        }
    });
    let tokens = scaled.tokens.map(|t| {
        let how = format!(
            "the last decode step copied, {} allocations growing a position per step",
            t.growing
        );
        view! {
            <tr id="scaled-tokens"><td>"new tokens"</td><td class="num">{t.traced}</td>
                <td class="num">{t.estimated}</td><td>{how}</td></tr>
        }
    });
    view! {
        <h3>"Rebuilt from the trace"</h3>
        <p class="hint">"This is not the traced job: its trace was rebuilt for the job below, and the whole sequence simulated (the peak is found again, not scaled)."</p>
        <table id="scaled-table">
            <thead><tr><th></th><th>"traced"</th><th>"estimated"</th><th>"how"</th></tr></thead>
            <tbody>{depth}{length}{tokens}</tbody>
        </table>
    }
}
