//! The GPU and allocator choices: the target GPU (the one the user plans to
//! run on), the GPUs to compare it with, grouped by market segment, custom
//! capacities, and `PYTORCH_CUDA_ALLOC_CONF`. They become a
//! [`Settings`](crate::pipeline::Settings), the same the CLI builds from its
//! flags.

use leptos::prelude::*;

use crate::presets::{self, Segment, PRESETS};
use crate::Bytes;

/// The GPUs compared on a first visit (the target is always compared too).
pub const DEFAULT_COMPARED: [&str; 6] = [
    "t4",
    "l4",
    "rtx-4090",
    "a100-40gb",
    "a100-80gb",
    "h100-80gb",
];

/// What the user chose, as plain values in signals.
#[derive(Debug, Clone, Copy)]
pub struct Choice {
    /// The target GPU's spec (a preset slug or a custom capacity).
    pub target: RwSignal<String>,
    /// The specs ticked for comparison (presets and custom capacities).
    pub compared: RwSignal<Vec<String>>,
    /// Every custom capacity added, ticked or not, in the order added.
    pub customs: RwSignal<Vec<String>>,
    pub alloc_conf: RwSignal<String>,
}

impl Choice {
    /// The first visit's choice.
    pub fn new() -> Choice {
        Choice {
            target: RwSignal::new(crate::pipeline::DEFAULT_TARGET.to_owned()),
            compared: RwSignal::new(DEFAULT_COMPARED.iter().map(|s| (*s).to_owned()).collect()),
            customs: RwSignal::new(Vec::new()),
            alloc_conf: RwSignal::new(String::new()),
        }
    }

    /// The GPUs an estimate runs on, in the order every shell uses: the
    /// target, then the compared presets in the presets' order, then the
    /// compared custom capacities in the order added.
    pub fn gpus(&self) -> Vec<String> {
        let target = self.target.get_untracked();
        let compared = self.compared.get_untracked();
        let ticked = |spec: &str| spec != target && compared.iter().any(|c| c == spec);
        std::iter::once(target.clone())
            .chain(
                PRESETS
                    .iter()
                    .map(|p| p.slug.to_owned())
                    .filter(|s| ticked(s)),
            )
            .chain(
                self.customs
                    .get_untracked()
                    .into_iter()
                    .filter(|s| ticked(s)),
            )
            .collect()
    }

    /// Restores a choice from the GPU list of a permalink (the target first)
    /// and its allocator settings.
    pub fn restore(&self, gpus: &[String], alloc_conf: &str) {
        if let Some(target) = gpus.first() {
            self.target.set(target.clone());
        }
        self.compared.set(gpus.to_vec());
        self.customs.set(
            gpus.iter()
                .filter(|spec| presets::find(spec).is_none())
                .cloned()
                .collect(),
        );
        self.alloc_conf.set(alloc_conf.to_owned());
    }

    /// Subscribes the running effect or memo to every choice.
    pub fn track(&self) {
        self.target.track();
        self.compared.track();
        self.customs.track();
        self.alloc_conf.track();
    }

    fn toggle(&self, spec: &str, on: bool) {
        self.compared.update(|list| {
            list.retain(|s| s != spec);
            if on {
                list.push(spec.to_owned());
            }
        });
    }
}

fn capacity(bytes: Bytes) -> String {
    crate::present::gib(bytes)
}

/// The presets of a segment as the lists show them: smallest capacity
/// first, then by name (the settings keep the presets' own order).
fn by_capacity(segment: Segment) -> Vec<&'static presets::GpuPreset> {
    let mut list: Vec<&presets::GpuPreset> =
        PRESETS.iter().filter(|p| p.segment == segment).collect();
    list.sort_by_key(|p| (p.cuda_visible, p.slug));
    list
}

/// The chooser. `changed` runs after every change that alters the estimate.
#[component]
pub fn GpuChooser(
    choice: Choice,
    /// Re-estimates with the new choice.
    changed: Callback<()>,
    /// Shows a message about a bad entry.
    failed: Callback<String>,
) -> impl IntoView {
    let custom = RwSignal::new(String::new());
    let add_custom = move || {
        let text = custom.get_untracked().trim().to_owned();
        if text.is_empty() {
            return;
        }
        match presets::parse_gpu(&text) {
            Ok(_) => {
                if presets::find(&text).is_none() {
                    choice.customs.update(|list| {
                        if !list.contains(&text) {
                            list.push(text.clone());
                        }
                    });
                }
                choice.toggle(&text, true);
                custom.set(String::new());
                changed.run(());
            }
            Err(err) => failed.run(err.to_string()),
        }
    };
    let summary = move || {
        let target = choice.target.get();
        let compared = choice.compared.get();
        let others: Vec<String> = PRESETS
            .iter()
            .map(|p| p.slug.to_owned())
            .chain(choice.customs.get())
            .filter(|s| *s != target && compared.contains(s))
            .collect();
        if others.is_empty() {
            "Compare with other GPUs".to_owned()
        } else {
            format!("Compared with {}: {}", others.len(), others.join(", "))
        }
    };
    let checkbox = move |spec: String, label: String| {
        let checked = spec.clone();
        let disabled = spec.clone();
        let toggled = spec.clone();
        view! {
            <label class="gpu">
                <input type="checkbox" value=spec.clone()
                    prop:checked=move || choice.target.with(|t| *t == checked) || choice.compared.with(|list| list.contains(&checked))
                    prop:disabled=move || choice.target.with(|t| *t == disabled)
                    on:change=move |ev| { choice.toggle(&toggled, event_target_checked(&ev)); changed.run(()); } />
                {label}
            </label>
        }
    };
    view! {
        <section class="settings">
            <label class="target">"Target GPU "
                <select id="target-gpu" on:change=move |ev| { choice.target.set(event_target_value(&ev)); changed.run(()); }>
                    {Segment::ALL.iter().map(|segment| view! {
                        <optgroup label=segment.label()>
                            {by_capacity(*segment).into_iter().map(|preset| {
                                let slug = preset.slug;
                                view! {
                                    <option value=slug prop:selected=move || choice.target.with(|t| t == slug)>
                                        {format!("{slug} ({})", capacity(preset.cuda_visible))}
                                    </option>
                                }
                            }).collect_view()}
                        </optgroup>
                    }).collect_view()}
                    {move || {
                        let customs = choice.customs.get();
                        (!customs.is_empty()).then(|| view! {
                            <optgroup label="custom capacity">
                                {customs.into_iter().map(|spec| {
                                    let selected = spec.clone();
                                    view! { <option value=spec.clone() prop:selected=move || choice.target.with(|t| *t == selected)>{spec.clone()}</option> }
                                }).collect_view()}
                            </optgroup>
                        })
                    }}
                </select>
            </label>
            <details id="compare" class="compare">
                <summary>{summary}</summary>
                <div id="gpu-list" class="gpu-list">
                    {Segment::ALL.iter().map(|segment| view! {
                        <fieldset>
                            <legend>{segment.label()}</legend>
                            {by_capacity(*segment).into_iter().map(|preset| {
                                checkbox(preset.slug.to_owned(), format!("{} ({})", preset.slug, capacity(preset.cuda_visible)))
                            }).collect_view()}
                        </fieldset>
                    }).collect_view()}
                    {move || {
                        let customs = choice.customs.get();
                        (!customs.is_empty()).then(|| view! {
                            <div class="customs">
                                {customs.into_iter().map(|spec| checkbox(spec.clone(), spec)).collect_view()}
                            </div>
                        })
                    }}
                </div>
                <form class="custom-gpu" on:submit=move |ev| { ev.prevent_default(); add_custom(); }>
                    <label>"Custom capacity "
                        <input id="custom-gpu" type="text" placeholder="e.g. 24GiB or 12884377600" prop:value=move || custom.get()
                            on:input=move |ev| custom.set(event_target_value(&ev)) />
                    </label>
                    <button type="submit">"Add"</button>
                </form>
            </details>
            <form class="alloc-conf" on:submit=move |ev| { ev.prevent_default(); changed.run(()); }>
                <label><code>"PYTORCH_CUDA_ALLOC_CONF"</code>" "
                    <input id="alloc-conf" type="text" placeholder="default" prop:value=move || choice.alloc_conf.get()
                        on:input=move |ev| choice.alloc_conf.set(event_target_value(&ev)) />
                </label>
                <button type="submit">"Apply"</button>
            </form>
        </section>
    }
}
