//! Generated types of the `tensorflow.PipelineSnapshot` schema (stats.pb).
#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/tensorflow.rs"));
