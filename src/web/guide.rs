//! The capture guide: the user describes the job (model, kind, optimizer,
//! precision, batch, lengths, recipe) and gets the exact command of the
//! capture helper shipped with the site (`memcast_capture.py`), which records
//! a few-block, short-context trace carrying the full job's figures; and the
//! wrapper for a loop of their own. The command is written by the core
//! (`present::capture_command`), as the README's are.

use leptos::prelude::*;

use crate::present::{capture_command, install_command, CaptureAsk, HELPER};

/// A whole number typed in a field, or `fallback`.
fn number(text: &str, fallback: u32) -> u32 {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .unwrap_or(fallback)
}

/// The guide, folded under "How to capture a trace".
#[component]
pub fn CaptureGuide() -> impl IntoView {
    let defaults = CaptureAsk::default();
    let model = RwSignal::new(defaults.model.clone());
    let job = RwSignal::new(defaults.job.clone());
    let optimizer = RwSignal::new(defaults.optimizer.clone());
    let precision = RwSignal::new(defaults.precision.clone());
    let batch = RwSignal::new(defaults.batch.to_string());
    let seq_len = RwSignal::new(defaults.seq_len.to_string());
    let new_tokens = RwSignal::new(defaults.new_tokens.to_string());
    let checkpointing = RwSignal::new(false);
    let grad_accum = RwSignal::new("1".to_string());
    let ask = move || CaptureAsk {
        model: model.get(),
        job: job.get(),
        optimizer: optimizer.get(),
        precision: precision.get(),
        batch: number(&batch.get(), 1),
        seq_len: number(&seq_len.get(), defaults.seq_len),
        new_tokens: number(&new_tokens.get(), defaults.new_tokens),
        checkpointing: checkpointing.get(),
        grad_accum: number(&grad_accum.get(), 1),
    };
    let training = move || matches!(job.get().as_str(), "train" | "lora" | "qlora");
    let select = |id: &'static str,
                  signal: RwSignal<String>,
                  options: &'static [(&'static str, &'static str)]| {
        view! {
            <select id=id on:change=move |ev| signal.set(event_target_value(&ev))>
                {options.iter().map(|(value, label)| view! {
                    <option value=*value selected=move || signal.get() == *value>{*label}</option>
                }).collect_view()}
            </select>
        }
    };
    view! {
        <details id="capture" class="capture">
            <summary>"How to capture a trace"</summary>
            <p>"Trace small, run big: "<a id="capture-helper" href=format!("./{HELPER}") download=HELPER>{HELPER}</a>
                " builds your model with 2 of its blocks, random weights and a short context, runs the job on the CPU under the profiler, and writes the full job's figures into the trace. Drop the file here: the answer is for the full job."</p>
            <form id="capture-form" class="capture-form" on:submit=move |ev| ev.prevent_default()>
                <label class="wide">"Model "
                    <input id="capture-model" type="text" placeholder="a Hugging Face id or a config.json"
                        prop:value=move || model.get() on:input=move |ev| model.set(event_target_value(&ev)) />
                </label>
                <label>"Job "{select("capture-job", job, &[
                    ("train", "training"), ("lora", "LoRA fine-tuning"), ("qlora", "QLoRA (4-bit NF4)"),
                    ("inference", "inference"), ("generate", "generation"),
                ])}</label>
                <label class:hidden=move || !training()>"Optimizer "{select("capture-optimizer", optimizer, &[
                    ("adamw", "AdamW"), ("adam", "Adam"), ("sgd", "SGD"), ("adafactor", "Adafactor"),
                    ("rmsprop", "RMSprop"), ("adagrad", "Adagrad"),
                ])}</label>
                <label>"Precision "{select("capture-precision", precision, &[
                    ("fp32", "fp32"), ("bf16-mixed", "bf16 mixed"), ("fp16-mixed", "fp16 mixed"), ("bf16", "bf16 weights"),
                ])}</label>
                <label>"Batch "<input id="capture-batch" type="number" min="1" prop:value=move || batch.get()
                    on:input=move |ev| batch.set(event_target_value(&ev)) /></label>
                <label>{move || if job.get() == "generate" { "Prompt length " } else { "Sequence length " }}
                    <input id="capture-seq-len" type="number" min="1" prop:value=move || seq_len.get()
                        on:input=move |ev| seq_len.set(event_target_value(&ev)) /></label>
                <label class:hidden=move || job.get() != "generate">"New tokens "
                    <input id="capture-new-tokens" type="number" min="1" prop:value=move || new_tokens.get()
                        on:input=move |ev| new_tokens.set(event_target_value(&ev)) /></label>
                <label class:hidden=move || !training()>
                    <input id="capture-checkpointing" type="checkbox" prop:checked=move || checkpointing.get()
                        on:change=move |ev| checkpointing.set(event_target_checked(&ev)) />" activation checkpointing"</label>
                <label class:hidden=move || !training()>"Micro-batches per step "
                    <input id="capture-grad-accum" type="number" min="1" prop:value=move || grad_accum.get()
                        on:input=move |ev| grad_accum.set(event_target_value(&ev)) /></label>
            </form>
            <pre><code id="capture-command">{move || format!("{}\n{}", install_command(&job.get()), capture_command(&ask()))}</code></pre>
            <p class="hint">"Only the model's config.json is read (never its weights). The trace is traced at your batch size; memcast rebuilds the layers and the length (and a generation's new tokens), and says so under the verdict. Then: "<code>"memcast estimate TRACE"</code>" gives the same answer."</p>
            <details class="own-loop">
                <summary>"Your own training loop"</summary>
                <pre><code>{OWN_LOOP}</code></pre>
                <p class="hint">"Build the model with 2 of its blocks and trace a short length; give the full job's figures, and memcast answers for it. Three steps let a stateful optimizer reach its steady state. No GPU is needed."</p>
            </details>
        </details>
    }
}

const OWN_LOOP: &str = r#"from memcast_capture import capture   # the file above, beside your script

model = build_model(num_layers=2)       # your model, 2 of its 32 blocks, on the CPU
with capture("trace.json.gz", layers=32, traced_layers=2,
             seq_len=4096, traced_seq_len=128) as prof:
    for step, batch in zip(range(3), loader):   # batches of 128 tokens
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
        prof.step()"#;
