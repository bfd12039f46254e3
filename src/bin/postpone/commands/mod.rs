//! One module per command: each takes the shared [`Context`](crate::context::Context), its
//! own arguments and the output, and does nothing else.

pub mod abort;
pub mod batch;
pub mod bulk;
mod changed;
pub mod dashboard;
pub mod defer;
pub mod grants;
pub mod healthcheck;
pub mod job;
pub mod jobs;
pub mod limit;
pub mod migrate;
pub mod pause;
pub mod prune;
pub mod rate_limit;
pub mod schedule;
mod seen;
mod select;
pub mod stalled;
pub mod stats;
pub mod workers;
pub mod workflow;
