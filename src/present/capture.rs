//! What a trace made by the capture helper says of itself.

use crate::scale::ScaleFacts;
use crate::trace::Capture;

/// "train of meta-llama/Llama-3.1-8B (adamw, bf16-mixed, batch 4); estimated
/// for the full job: 32 layers (traced 2), sequence length 4,096 (traced
/// 128)" — what the capture helper recorded and what the estimate answers
/// for (`scaled`: what was rebuilt).
pub fn captured(capture: &Capture, scaled: &ScaleFacts) -> String {
    let mut what = capture.job.clone().unwrap_or_else(|| "a job".to_owned());
    if let Some(model) = &capture.model {
        what.push_str(&format!(" of {model}"));
    }
    let mut details: Vec<String> = Vec::new();
    details.extend(capture.optimizer.clone());
    details.extend(capture.precision.clone());
    if let Some(q) = &capture.quantization {
        details.push(format!("{} weights", q.to_uppercase()));
    }
    if let Some(b) = capture.batch {
        details.push(format!("batch {b}"));
    }
    if capture.checkpointing {
        details.push("checkpointing".to_owned());
    }
    if let Some(k) = capture.grad_accum.filter(|&k| k > 1) {
        details.push(format!("{k} micro-batches per step"));
    }
    if !details.is_empty() {
        what.push_str(&format!(" ({})", details.join(", ")));
    }
    let n = |v: u32| super::thousands(u64::from(v));
    let mut job = Vec::new();
    if let Some(d) = &scaled.depth {
        job.push(format!(
            "{} layers (traced {})",
            n(d.estimated),
            n(d.traced)
        ));
    }
    if let Some(l) = &scaled.length {
        let traced: Vec<String> = l.traced.iter().map(|&t| n(t)).collect();
        job.push(format!(
            "sequence length {} (traced {})",
            n(l.estimated),
            traced.join(", ")
        ));
    }
    if let Some(t) = &scaled.tokens {
        job.push(format!(
            "{} new tokens (traced {})",
            n(t.estimated),
            n(t.traced)
        ));
    }
    if job.is_empty() {
        format!("{what}; estimated as traced")
    } else {
        format!("{what}; estimated for the full job: {}", job.join(", "))
    }
}
