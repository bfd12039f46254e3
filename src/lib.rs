#![doc = include_str!("../README.md")]
//!
//! # Cargo features
//!
//! No feature is on by default: deferring jobs, running workers and the admin API need none.
//!
//! - `cli`: builds the `postpone` command-line tool (migrate, defer, jobs, retry, cancel,
//!   abort, stats, prune, dashboard...): `cargo install postpone --features cli`, or
//!   `cargo run --features cli -- --help` in a checkout. Turns on `web`.
//! - `web`: the dashboard, `postpone::Dashboard`, served on threads of its own or mounted in a
//!   program's web server.
//! - `metrics`: counters, histograms and gauges through the `metrics` facade.
//! - `tracing`: every task runs inside a `tracing` span carrying its job id, task, queue and
//!   attempt.
//! - `test-util`: helpers for the tests of programs that use postpone, in
//!   `postpone::testing`: run the jobs a piece of code deferred, synchronously, and assert what was
//!   deferred, against the real database.
//!
//! # Re-exports
//!
//! [`postgres`] and [`tokio_postgres`] are re-exported, since their types appear in
//! postpone's signatures (`GenericClient` in [`JobBuilder::defer_in`], rows, SQL types):
//! use them through `postpone::postgres` to be sure the versions match.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod app;
mod batch;
mod client_trait;
mod conn;
mod deps;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod insert;
mod job;
mod limits;
mod metrics;
mod namespace;
mod periodic;
mod pooled;
mod retention;
mod retry;
mod schema;
mod store;
mod task;
mod task_error;
#[cfg(feature = "test-util")]
pub mod testing;
mod timefmt;
mod typed;
mod types;
mod unique;
mod wait;
#[cfg(feature = "web")]
mod web;
mod worker;
mod workflow;

pub use postgres;
pub use tokio_postgres;

pub use admin::GrantsFor;
pub use admin::QueueLimit;
pub use admin::{
    AbortOutcome, Admin, AttemptError, BulkAction, BulkReport, DependencyInfo, JobDetail,
    JobFilter, JobInfo, JobPage, JobPreview, JobSort, JobValue, JsonPrefix, MigrateReport,
    QueueCounts, SchemaState, StalledReport, StatsBy, UnknownTask, WorkerInfo,
    DEFAULT_UNKNOWN_TASK_AFTER,
};
pub use admin::{KeyLimit, RateLimit, MIN_RATE_PERIOD};
pub use admin::{NewSchedule, ScheduleInfo};
pub use admin::{PausedQueue, Pauses};
pub use admin::{DEFAULT_MAX_ARGS_BYTES, MAX_ARGS_BYTES_CEILING};
pub use app::{App, AppBuilder, PooledConnection};
pub use batch::{Batch, BatchBuilder, BatchId, BatchProgress, CallbackState};
pub use client_trait::DeferClient;
#[allow(deprecated)]
pub use client_trait::Executor;
pub use conn::tls::SslMode;
pub use conn::{Connection, Notification, Transaction};
pub use deps::Dependency;
pub use error::{Error, ErrorKind, Result};
pub use insert::{Bound, Detached, JobBuilder, NewJob};
pub use insert::{MAX_META_BYTES, MAX_TAGS};
pub use job::{AbortReason, Job, MAX_OUTPUT_BYTES, MAX_PROGRESS_BYTES};
pub use periodic::{PeriodicOptions, Schedules};
pub use retention::{PruneReport, Retention};
pub use retry::RetryStrategy;
pub use schema::SCHEMA_VERSION;
pub use task::{TaskOptions, Tasks};
pub use task_error::TaskError;
pub use typed::Task;
pub use types::{JobId, JobStatus, TaskArgs, TaskDefaults};
pub use unique::{Deferred, Unique, UniqueStates};
pub use wait::JobResult;
#[cfg(feature = "web")]
pub use web::{
    BodyReader, Dashboard, DashboardAuth, DashboardHandle, DashboardHandler, DashboardRequest,
    DashboardResponse,
};
pub use worker::{
    DeleteJobs, JobEvent, JobEventKind, JobHook, ShutdownReport, Vacuum, Worker, WorkerBuilder,
    WorkerHandle, WorkerStats,
};
pub use workflow::{
    Step, StepBuilder, Workflow, WorkflowBuilder, WorkflowCancel, WorkflowId, WorkflowInfo,
    WorkflowJob, WorkflowRetry, WorkflowSummary, WORKFLOW_JOBS_LISTED,
};

/// The code of the guides under `docs/` is compiled by `cargo test --doc`, as the README's is.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct GuideDoctests;

/// See [`GuideDoctests`].
#[cfg(doctest)]
#[doc = include_str!("../docs/connections.md")]
pub struct ConnectionsDoctests;

/// See [`GuideDoctests`].
#[cfg(doctest)]
#[doc = include_str!("../docs/batches.md")]
pub struct BatchesDoctests;

/// See [`GuideDoctests`]; its code mounts the dashboard, which needs the `web` feature.
#[cfg(all(doctest, feature = "web"))]
#[doc = include_str!("../docs/dashboard.md")]
pub struct DashboardDoctests;
