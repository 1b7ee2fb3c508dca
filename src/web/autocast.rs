//! How a trace recorded under CPU autocast is estimated: the same choices as
//! the CLI's `--autocast`, `--autocast-dtype`, `--autocast-policy` and
//! `--grad-scaler`, carried by the permalink. The orchestrator applies them,
//! so applying them runs the last trace again rather than only
//! re-simulating.

use leptos::prelude::*;

use crate::autocast::VERSIONS;

/// The choices as the form holds them (empty text: the default).
#[derive(Debug, Clone, Copy)]
pub struct AutocastChoice {
    /// Keep the CPU's dtypes instead of translating to CUDA autocast.
    pub keep_cpu_dtypes: RwSignal<bool>,
    /// `bf16`, `fp16`, or empty for the trace's own type.
    pub dtype: RwSignal<String>,
    /// A policy version's name, or empty for the newest.
    pub policy: RwSignal<String>,
    pub grad_scaler: RwSignal<bool>,
}

impl AutocastChoice {
    pub fn new() -> AutocastChoice {
        AutocastChoice {
            keep_cpu_dtypes: RwSignal::new(false),
            dtype: RwSignal::new(String::new()),
            policy: RwSignal::new(String::new()),
            grad_scaler: RwSignal::new(false),
        }
    }

    /// Restores the choices of a permalink's settings.
    pub fn restore(&self, settings: &crate::pipeline::Settings) {
        self.keep_cpu_dtypes.set(settings.keep_cpu_dtypes);
        self.dtype
            .set(settings.autocast_dtype.clone().unwrap_or_default());
        self.policy
            .set(settings.autocast_policy.clone().unwrap_or_default());
        self.grad_scaler.set(settings.grad_scaler);
    }

    /// Writes the choices into `settings` (empty fields: the defaults).
    pub fn apply_to(&self, settings: &mut crate::pipeline::Settings) {
        let text = |s: RwSignal<String>| {
            let t = s.get_untracked().trim().to_owned();
            (!t.is_empty()).then_some(t)
        };
        settings.keep_cpu_dtypes = self.keep_cpu_dtypes.get_untracked();
        settings.autocast_dtype = text(self.dtype);
        settings.autocast_policy = text(self.policy);
        settings.grad_scaler = self.grad_scaler.get_untracked();
    }

    /// Subscribes the running effect or memo to every choice.
    pub fn track(&self) {
        self.keep_cpu_dtypes.track();
        self.dtype.track();
        self.policy.track();
        self.grad_scaler.track();
    }

    /// Whether any choice differs from the default.
    fn any(&self) -> bool {
        self.keep_cpu_dtypes.get_untracked()
            || !self.dtype.get_untracked().is_empty()
            || !self.policy.get_untracked().is_empty()
            || self.grad_scaler.get_untracked()
    }
}

/// The form. `apply` runs the last trace again with the choices.
#[component]
pub fn AutocastForm(choice: AutocastChoice, apply: Callback<()>) -> impl IntoView {
    // Open when a permalink brought choices (read once, as the parameter form).
    let open = choice.any();
    let newest = VERSIONS.first().map_or("", |v| v.name);
    view! {
        <details class="autocast-options" prop:open=open>
            <summary>"Mixed precision (a trace recorded under CPU autocast)"</summary>
            <form class="autocast" on:submit=move |ev| { ev.prevent_default(); apply.run(()); }>
                <label>"Estimate "
                    <select id="autocast-mode"
                        on:change=move |ev| choice.keep_cpu_dtypes.set(event_target_value(&ev) == "as-traced")>
                        <option value="cuda" selected=move || !choice.keep_cpu_dtypes.get()>
                            "as CUDA autocast runs it"
                        </option>
                        <option value="as-traced" selected=move || choice.keep_cpu_dtypes.get()>
                            "with the CPU's dtypes"
                        </option>
                    </select>
                </label>
                <label>" in "
                    <select id="autocast-dtype" on:change=move |ev| choice.dtype.set(event_target_value(&ev))>
                        <option value="" selected=move || choice.dtype.get().is_empty()>"the trace's type"</option>
                        <option value="bf16" selected=move || choice.dtype.get() == "bf16">"bf16"</option>
                        <option value="fp16" selected=move || choice.dtype.get() == "fp16">"fp16"</option>
                    </select>
                </label>
                <label>" PyTorch policy "
                    <select id="autocast-policy" on:change=move |ev| choice.policy.set(event_target_value(&ev))>
                        <option value="" selected=move || choice.policy.get().is_empty()>
                            {format!("newest ({newest})")}
                        </option>
                        {VERSIONS.iter().map(|v| {
                            let name = v.name;
                            view! {
                                <option value=name selected=move || choice.policy.get() == name>
                                    {format!("{name} (torch {})", v.torch)}
                                </option>
                            }
                        }).collect_view()}
                    </select>
                </label>
                <label>
                    <input id="grad-scaler" type="checkbox"
                        prop:checked=move || choice.grad_scaler.get()
                        on:change=move |ev| choice.grad_scaler.set(event_target_checked(&ev)) />
                    " GradScaler (fp16 training)"
                </label>
                <button type="submit">"Apply"</button>
            </form>
        </details>
    }
}
