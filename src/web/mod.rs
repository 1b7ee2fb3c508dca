//! The browser shell: a Leptos (client-side rendered) page and a Web Worker.
//!
//! This is one of the two places (with `src/bin`) allowed to touch the browser.
//! The page never runs the pipeline: it hands the dropped `File` to the worker,
//! which reads it in chunks and answers with [`crate::protocol::Response`]s.
//! Domain data stays out of the reactive runtime: signals hold plain values.

mod answer;
mod app;
mod autocast;
mod bridge;
mod charts;
mod controls;
mod format;
mod gpus;
mod guide;
mod hasher;
mod helper;
mod params;
mod results;
mod scale;
mod sharing;
mod whatif;
pub mod worker;

pub use app::mount;
