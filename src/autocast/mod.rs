//! PyTorch's autocast as data: the per-device op policies and the cast-cache
//! rules, for the PyTorch versions of [`VERSIONS`], with their sources.
//!
//! The orchestrator's autocast rules (`orchestrator::rules::autocast`) and
//! the mixed-precision what-if read these tables; nothing here reads a trace.

mod policy;

pub use crate::trace::Dtype;
pub use policy::{policy_of, CastPolicy, Device, PolicyVersion, Source, SOURCES, VERSIONS};
