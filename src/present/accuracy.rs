//! The accuracy table (the README's, from `src/report/accuracy.json`).

use crate::report::accuracy::{Accuracy, ErrorFigures};

use super::percent_bp;

fn row(figures: &ErrorFigures, source: &str) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} |",
        figures.kind.label(),
        source,
        figures.runs,
        percent_bp(figures.mean_abs_bp),
        if figures.worst_under_bp == 0 {
            "none".to_owned()
        } else {
            format!("−{}", percent_bp(figures.worst_under_bp))
        },
        if figures.worst_over_bp == 0 {
            "none".to_owned()
        } else {
            format!("+{}", percent_bp(figures.worst_over_bp))
        },
    )
}

/// The markdown table of the measured errors: one row per kind of job and
/// source (with the command that measures it again), then each kind over
/// every source, whose worst underestimate is the verdict's thin margin.
pub fn accuracy_table(accuracy: &Accuracy) -> String {
    let mut lines = vec![
        "| kind of job | source (command) | runs | mean abs error | worst underestimate (thin margin) | worst overestimate |".to_owned(),
        "| --- | --- | --- | --- | --- | --- |".to_owned(),
    ];
    let mut kinds: Vec<&ErrorFigures> = accuracy.kinds.iter().collect();
    kinds.sort_by_key(|k| k.kind);
    for kind in kinds {
        for figures in accuracy.rows.iter().filter(|r| r.kind == kind.kind) {
            let source = accuracy
                .sources
                .iter()
                .find(|s| s.id == figures.source)
                .map_or_else(
                    || figures.source.clone(),
                    |s| format!("{} (`{}`)", s.name, s.command),
                );
            lines.push(row(figures, &source));
        }
        lines.push(row(kind, "**all sources**"));
    }
    lines.push(String::new());
    lines.push(format!(
        "Errors are (estimate − real) / real of the peak reserved bytes (a published figure: the one it names); a job's kind is the report's `job_kind`. Regenerate with `{}`.",
        accuracy.regenerate
    ));
    lines.join("\n")
}
