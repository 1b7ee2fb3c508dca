//! Messages between the page and the Web Worker.
//!
//! Pure serde types, compiled natively and round-trip tested, so the worker
//! protocol can be checked without a browser. Messages travel as JSON strings;
//! the file itself travels as a `Blob` next to the request, so the page never
//! copies its bytes.

use serde::{Deserialize, Serialize};

/// Page → worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    /// Read the attached file in chunks and describe it.
    Inspect {
        /// A number the page chooses; every response to this request carries it.
        job: u32,
    },
}

/// Worker → page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// The worker has loaded and listens; the page sends nothing before this.
    Ready,
    /// Work in progress.
    Progress {
        job: u32,
        stage: String,
        done_bytes: u64,
        total_bytes: u64,
    },
    /// What the worker read from the attached file.
    FileInfo {
        job: u32,
        name: String,
        size_bytes: u64,
        /// Whether the file starts with the gzip magic bytes.
        gzip: bool,
    },
    /// The request failed; the message says what to do.
    Failed { job: u32, message: String },
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
    fn messages_round_trip_through_json() {
        let request = Request::Inspect { job: 7 };
        assert_eq!(Request::from_json(&request.to_json()).unwrap(), request);
        let responses = [
            Response::Ready,
            Response::Progress {
                job: 7,
                stage: "reading".into(),
                done_bytes: 1,
                total_bytes: 2,
            },
            Response::FileInfo {
                job: 7,
                name: "a.json.gz".into(),
                size_bytes: 3,
                gzip: true,
            },
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
    fn ready_has_a_stable_wire_form() {
        assert_eq!(Response::Ready.to_json(), r#"{"kind":"ready"}"#);
    }
}
