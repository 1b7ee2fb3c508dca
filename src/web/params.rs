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

    /// Subscribes the running effect or memo to every figure.
    pub fn track(&self) {
        self.total.track();
        self.frozen.track();
    }
}

/// The run options a warning may ask for: the CUDA context to assume on
/// every GPU (the CLI's `--context`) and the iterations to simulate
/// (`--iterations`), as typed (empty: the default).
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    pub context: RwSignal<String>,
    pub iterations: RwSignal<String>,
}

impl RunOptions {
    pub fn new() -> RunOptions {
        RunOptions {
            context: RwSignal::new(String::new()),
            iterations: RwSignal::new(String::new()),
        }
    }

    /// Restores the options of a permalink's settings.
    pub fn restore(&self, settings: &crate::pipeline::Settings) {
        self.context
            .set(settings.context.clone().unwrap_or_default());
        let default = crate::pipeline::Settings::default().iterations;
        self.iterations.set(if settings.iterations == default {
            String::new()
        } else {
            settings.iterations.to_string()
        });
    }

    /// Writes the options into `settings` (blank: the defaults).
    pub fn apply_to(&self, settings: &mut crate::pipeline::Settings) -> Result<(), String> {
        let context = self.context.get_untracked().trim().to_owned();
        settings.context = (!context.is_empty()).then_some(context);
        let iterations = self.iterations.get_untracked().trim().to_owned();
        settings.iterations = if iterations.is_empty() {
            crate::pipeline::Settings::default().iterations
        } else {
            match iterations.parse::<u32>() {
                Ok(n) if n > 0 => n,
                _ => {
                    return Err(
                        "the number of iterations must be a whole number of at least 1".into(),
                    )
                }
            }
        };
        Ok(())
    }

    /// Subscribes the running effect or memo to both options.
    pub fn track(&self) {
        self.context.track();
        self.iterations.track();
    }
}

/// The run options' form. `apply` runs the last trace again with them.
#[component]
pub fn RunOptionsForm(options: RunOptions, apply: Callback<()>) -> impl IntoView {
    let open = !options.context.get_untracked().is_empty()
        || !options.iterations.get_untracked().is_empty();
    view! {
        <details id="run-options" class="params-override" prop:open=open>
            <summary>"Run options (CUDA context, iterations)"</summary>
            <form class="params" on:submit=move |ev| { ev.prevent_default(); apply.run(()); }>
                <label>"CUDA context on every GPU "
                    <input id="cuda-context" type="text" placeholder="per GPU, e.g. 600MiB"
                        prop:value=move || options.context.get()
                        on:input=move |ev| options.context.set(event_target_value(&ev)) />
                </label>
                <label>" iterations simulated "
                    <input id="iterations" type="number" min="1" step="1" placeholder="3"
                        prop:value=move || options.iterations.get()
                        on:input=move |ev| options.iterations.set(event_target_value(&ev)) />
                </label>
                <button type="submit">"Apply"</button>
            </form>
        </details>
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
