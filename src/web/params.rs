//! The model's parameter bytes when the user knows better than the trace
//! (weights the forward never reads, quantized storage, a trace recorded
//! without shapes): the same figures as the CLI's `--params` and
//! `--frozen-params`, sizes such as `1.3GiB` or plain bytes, carried by the
//! permalink. The orchestrator places the parameters, so applying them runs
//! the last trace again rather than only re-simulating.

use leptos::prelude::*;

/// The two figures, as typed (empty: from the trace).
#[derive(Debug, Clone, Copy)]
pub struct ParamFigures {
    pub total: RwSignal<String>,
    pub frozen: RwSignal<String>,
}

impl ParamFigures {
    pub fn new() -> ParamFigures {
        ParamFigures {
            total: RwSignal::new(String::new()),
            frozen: RwSignal::new(String::new()),
        }
    }

    /// Restores the figures of a permalink's settings.
    pub fn restore(&self, total: Option<&str>, frozen: Option<&str>) {
        self.total.set(total.unwrap_or_default().to_owned());
        self.frozen.set(frozen.unwrap_or_default().to_owned());
    }

    /// The figures for [`Settings`](crate::pipeline::Settings): `None` where
    /// the field is blank.
    pub fn get(&self) -> (Option<String>, Option<String>) {
        let text = |s: RwSignal<String>| {
            let t = s.get_untracked().trim().to_owned();
            (!t.is_empty()).then_some(t)
        };
        (text(self.total), text(self.frozen))
    }
}

/// The form. `apply` runs the last trace again with the figures.
#[component]
pub fn ParamsForm(figures: ParamFigures, apply: Callback<()>) -> impl IntoView {
    // Open when a permalink brought figures (read once: clearing a field
    // must not fold the form under the user's cursor).
    let open =
        !figures.total.get_untracked().is_empty() || !figures.frozen.get_untracked().is_empty();
    view! {
        <details class="params-override" prop:open=open>
            <summary>"Model parameters (when you know better than the trace)"</summary>
            <form class="params" on:submit=move |ev| { ev.prevent_default(); apply.run(()); }>
                <label>"All parameters "
                    <input id="params" type="text" placeholder="from the trace, e.g. 1.3GiB"
                        prop:value=move || figures.total.get()
                        on:input=move |ev| figures.total.set(event_target_value(&ev)) />
                </label>
                <label>" of which frozen "
                    <input id="frozen-params" type="text" placeholder="from the trace"
                        prop:value=move || figures.frozen.get()
                        on:input=move |ev| figures.frozen.set(event_target_value(&ev)) />
                </label>
                <button type="submit">"Apply"</button>
            </form>
        </details>
    }
}
