//! The verdict for a GPU in words: fits, fits with a thin margin (headroom
//! within the error measured for this kind of job), or does not fit; and
//! what the thin margin is made of, with its source.

use crate::report::{ErrorBand, GpuVerdict, Margin, Report};

use super::{percent_bp, short};

/// "Fits on a100-80gb — 12.30 GiB free of 80.00 GiB", "Fits with a thin
/// margin on a100-40gb — 663.0 MiB free of 40.00 GiB, within the error
/// measured for training jobs", "Does not fit on t4 — needs 3.20 GiB more
/// than its 15.00 GiB"; and the verdict's CSS-friendly class.
pub fn verdict(gpu: &GpuVerdict, band: Option<&ErrorBand>) -> (String, &'static str) {
    match gpu.margin {
        Margin::Fits | Margin::Thin if !gpu.fits => does_not_fit(gpu),
        Margin::Fits => (
            format!(
                "Fits on {} — {} free of {}",
                gpu.preset,
                short(gpu.headroom_bytes.unwrap_or_default()),
                short(gpu.capacity_bytes)
            ),
            "fits",
        ),
        Margin::Thin => (
            format!(
                "Fits with a thin margin on {} — {} free of {}, within the {} error measured for {} jobs",
                gpu.preset,
                short(gpu.headroom_bytes.unwrap_or_default()),
                short(gpu.capacity_bytes),
                band.map_or_else(|| "estimate's".to_owned(), |b| percent_bp(b.margin_bp)),
                band.map_or("such", |b| b.kind.label()),
            ),
            "thin",
        ),
        Margin::DoesNotFit => does_not_fit(gpu),
    }
}

fn does_not_fit(gpu: &GpuVerdict) -> (String, &'static str) {
    (
        format!(
            "Does not fit on {} — needs {} more than its {}",
            gpu.preset,
            short(gpu.shortfall_bytes.unwrap_or_default()),
            short(gpu.capacity_bytes)
        ),
        "oom",
    )
}

/// The verdict of the report's target GPU (`None` when the report has no
/// verdict for it).
pub fn target_verdict(report: &Report) -> Option<(String, &'static str)> {
    report
        .gpus
        .iter()
        .find(|g| g.preset == report.reference_gpu)
        .map(|g| verdict(g, report.error_band.as_ref()))
}

/// What a thin margin means for this report: "A fit is thin when the
/// headroom is under 2.50 % of the peak reserved bytes (1.00 GiB): the worst
/// underestimate measured on 25 training runs against real GPUs (python3
/// benches/gpu/pairs.py; ...)."
pub fn margin_note(band: &ErrorBand) -> String {
    format!(
        "A fit is thin when its headroom is under {} of the peak reserved bytes ({}): the most a real run has needed above memcast's estimate, over {} {} runs measured on real GPUs (mean absolute error {}; {}).",
        percent_bp(band.margin_bp),
        short(band.margin_bytes),
        band.runs,
        band.kind.label(),
        percent_bp(band.mean_abs_bp),
        band.source
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::JobKind;
    use crate::units::Bytes;

    fn gpu(fits: bool, margin: Margin) -> GpuVerdict {
        GpuVerdict {
            preset: "a100-40gb".into(),
            capacity_bytes: Bytes(40 * Bytes::GIB),
            fits,
            peak_total_bytes: Bytes(39 * Bytes::GIB),
            headroom_bytes: fits.then_some(Bytes(663 * Bytes::MIB)),
            shortfall_bytes: (!fits).then_some(Bytes(3 * Bytes::GIB)),
            context_bytes: Bytes::ZERO,
            cublas_workspace_bytes: Bytes::ZERO,
            margin,
            kernels: Vec::new(),
        }
    }

    #[test]
    fn the_three_verdicts_read_the_same_everywhere() {
        let band = ErrorBand {
            kind: JobKind::Training,
            runs: 25,
            mean_abs_bp: 120,
            worst_under_bp: 250,
            margin_bp: 250,
            margin_bytes: Bytes(Bytes::GIB),
            source: "python3 benches/gpu/pairs.py".into(),
        };
        assert_eq!(
            verdict(&gpu(true, Margin::Thin), Some(&band)),
            (
                "Fits with a thin margin on a100-40gb — 663.0 MiB free of 40.00 GiB, within the 2.50 % error measured for training jobs".to_owned(),
                "thin"
            )
        );
        assert_eq!(verdict(&gpu(true, Margin::Fits), None).1, "fits");
        assert_eq!(
            verdict(&gpu(false, Margin::DoesNotFit), None).0,
            "Does not fit on a100-40gb — needs 3.00 GiB more than its 40.00 GiB"
        );
        assert_eq!(
            margin_note(&band),
            "A fit is thin when its headroom is under 2.50 % of the peak reserved bytes (1.00 GiB): the most a real run has needed above memcast's estimate, over 25 training runs measured on real GPUs (mean absolute error 1.20 %; python3 benches/gpu/pairs.py)."
        );
    }
}
