//! Messages between the page and the Web Worker.
//!
//! Pure serde types, compiled natively and round-trip tested, so the worker
//! protocol can be checked without a browser. Messages travel as JSON strings;
//! the files themselves travel as `Blob`s (a JS array `files`, in the order of
//! [`Request::Run`]'s `names`) next to the request, so the page never copies
//! their bytes. Every request is self-contained except
//! [`Request::Resimulate`], which reuses the trace the worker last prepared and
//! is answered with [`Response::NeedTrace`] when the worker has none.

use serde::{Deserialize, Serialize};

use crate::permalink::TraceIdentity;
use crate::pipeline::{Config, Stage};
use crate::report::Report;
use crate::whatif::{WhatIfKind, WhatIfResult};

/// Page → worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    /// Read the attached files in chunks and run the whole pipeline on them:
    /// one trace, or two or three of one job at different sequence lengths
    /// (`config.scale.seq_len` names the length to estimate).
    Run {
        /// A number the page chooses; every response to this request carries it.
        job: u32,
        /// The file names to report, one per attached `Blob`, in order (a
        /// `Blob` from `fetch` has none).
        names: Vec<String>,
        /// Which files these are, as the page numbers what it was given
        /// (each drop, the demo): the worker keeps the files it last read,
        /// parsed, and runs the same files again without reading them
        /// (0: files never to be taken for others).
        #[serde(default)]
        files: u32,
        config: Config,
    },
    /// Simulate the last prepared trace again with other GPUs or allocator
    /// settings (no parsing).
    Resimulate { job: u32, config: Config },
    /// Run a what-if on the last prepared trace.
    WhatIf {
        job: u32,
        what: WhatIfKind,
        config: Config,
    },
}

/// Worker → page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// The worker has loaded and listens; the page sends nothing before this.
    Ready,
    /// Work in progress: `done` out of `total` units of `stage`.
    Progress {
        job: u32,
        stage: WorkStage,
        done: u64,
        total: u64,
    },
    /// The estimate.
    Done {
        job: u32,
        trace: TraceIdentity,
        report: Box<Report>,
    },
    /// The answer to a [`Request::WhatIf`].
    WhatIf { job: u32, result: Box<WhatIfResult> },
    /// A [`Request::Resimulate`] or [`Request::WhatIf`] arrived but the worker holds no prepared trace
    /// (it was restarted): send the file again with [`Request::Run`].
    NeedTrace { job: u32 },
    /// The request failed; the message says what was wrong and what to do.
    Failed { job: u32, message: String },
}

/// What the worker is doing, for the progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkStage {
    Pipeline(Stage),
    /// Simulating, some GPUs' runs at capacity on a second core (the
    /// worker's simulation helper).
    SimulatingShared,
}

impl WorkStage {
    /// The stage's name as the page shows it.
    pub fn label(self) -> &'static str {
        match self {
            WorkStage::Pipeline(Stage::Parsing) => "Reading the trace",
            WorkStage::Pipeline(Stage::Rebuilding) => "Rebuilding the trace for the larger job",
            WorkStage::Pipeline(Stage::Analyzing) => "Analyzing memory blocks",
            WorkStage::Pipeline(Stage::Orchestrating) => "Orchestrating the GPU run",
            WorkStage::Pipeline(Stage::Simulating) => "Simulating the CUDA allocator",
            WorkStage::Pipeline(Stage::Reporting) => "Building the report",
            WorkStage::SimulatingShared => "Simulating the CUDA allocator on two cores",
        }
    }
}

impl Request {
    /// Encodes the request as the JSON string posted to the worker.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Decodes a request posted by the page.
    pub fn from_json(text: &str) -> Result<Request, serde_json::Error> {
        serde_json::from_str(text)
    }
}

impl Response {
    /// Encodes the response as the JSON string posted to the page.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Decodes a response posted by the worker.
    pub fn from_json(text: &str) -> Result<Response, serde_json::Error> {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_through_json() {
        let requests = [
            Request::Run {
                job: 7,
                names: vec!["a.json.gz".into()],
                files: 3,
                config: Config::standard(),
            },
            Request::Run {
                job: 10,
                names: vec!["seq32.json.gz".into(), "seq64.json.gz".into()],
                files: 4,
                config: scaled_config(),
            },
            Request::Resimulate {
                job: 8,
                config: Config::standard(),
            },
            Request::WhatIf {
                job: 9,
                what: WhatIfKind::Distributed { world_size: 8 },
                config: Config::standard(),
            },
        ];
        for request in requests {
            assert_eq!(Request::from_json(&request.to_json()).unwrap(), request);
        }
    }

    /// A config asking for a deeper, longer job than the traces'.
    fn scaled_config() -> Config {
        let mut config = Config::standard();
        config.scale.layers = Some(8);
        config.scale.seq_len = Some(128);
        config
    }

    /// A run sent without its files' number (a page from before it) is
    /// files never taken for others: the worker reads them.
    #[test]
    fn a_run_without_its_files_number_is_read_again() {
        let request = Request::Run {
            job: 2,
            names: vec!["a.json.gz".into()],
            files: 5,
            config: Config::standard(),
        };
        let text = request.to_json();
        assert!(text.contains(r#""files":5"#), "{text}");
        let without = text.replacen(r#""files":5,"#, "", 1);
        let Request::Run { files, .. } = Request::from_json(&without).unwrap() else {
            panic!("not a run: {without}");
        };
        assert_eq!(files, 0);
    }

    #[test]
    fn several_files_carry_their_names_and_the_target_in_order() {
        let request = Request::Run {
            job: 1,
            names: vec!["b.json.gz".into(), "a.json.gz".into()],
            files: 1,
            config: scaled_config(),
        };
        let back = Request::from_json(&request.to_json()).unwrap();
        let Request::Run { names, config, .. } = back else {
            panic!("not a run: {back:?}");
        };
        assert_eq!(names, ["b.json.gz", "a.json.gz"]);
        assert_eq!(config.scale.layers, Some(8));
        assert_eq!(config.scale.seq_len, Some(128));
    }

    #[test]
    fn responses_round_trip_through_json() {
        let responses = [
            Response::Ready,
            Response::Progress {
                job: 7,
                stage: WorkStage::Pipeline(Stage::Simulating),
                done: 1,
                total: 2,
            },
            Response::Progress {
                job: 7,
                stage: WorkStage::SimulatingShared,
                done: 3,
                total: 4,
            },
            Response::NeedTrace { job: 3 },
            Response::Failed {
                job: 7,
                message: "bad".into(),
            },
        ];
        for response in responses {
            assert_eq!(Response::from_json(&response.to_json()).unwrap(), response);
        }
    }

    #[test]
    fn a_scaled_report_round_trips_with_what_the_trace_is_and_what_was_rebuilt() {
        use crate::scale::{DepthFacts, LengthFacts, StackFacts, Traced};
        let bytes = include_bytes!("../tests/fixtures/tiny_step.json");
        let config = Config::for_gpus("t4", &["t4".to_owned()]).unwrap();
        let mut report = crate::pipeline::run(bytes, &config, &mut |_| {})
            .unwrap()
            .value;
        report.summary.traced = Traced {
            block: Some("LlamaDecoderLayer".into()),
            layers: Some(2),
            stacks: Some(1),
            seq_len: Some(32),
            batch: Some(4),
        };
        report.summary.scaled.depth = Some(DepthFacts {
            traced: 2,
            estimated: 8,
            stacks: vec![StackFacts {
                block: "LlamaDecoderLayer".into(),
                parent: "LlamaModel_0".into(),
                template: "LlamaDecoderLayer_1".into(),
                bytes_per_call: crate::Bytes(1 << 20),
            }],
        });
        report.summary.scaled.length = Some(LengthFacts {
            traced: vec![32, 64],
            estimated: 128,
            method: "fit".into(),
            linear: 10,
            quadratic: 2,
        });
        let response = Response::Done {
            job: 4,
            trace: TraceIdentity::joined(&[
                TraceIdentity::of("seq32.json.gz", b"a"),
                TraceIdentity::of("seq64.json.gz", b"b"),
            ]),
            report: Box::new(report),
        };
        let back = Response::from_json(&response.to_json()).unwrap();
        assert_eq!(back, response);
        let Response::Done { trace, .. } = back else {
            panic!("not done");
        };
        assert_eq!(trace.name, "seq32.json.gz + seq64.json.gz");
    }

    #[test]
    fn ready_has_a_stable_wire_form() {
        assert_eq!(Response::Ready.to_json(), r#"{"kind":"ready"}"#);
    }
}
