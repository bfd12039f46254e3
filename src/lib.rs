#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod app;
mod conn;
mod error;
mod job;
mod limits;
mod periodic;
mod retention;
mod retry;
mod schema;
mod store;
mod task;
mod worker;

pub use admin::{
    AbortOutcome, Admin, AttemptError, JobDetail, JobFilter, JobInfo, QueueCounts, WorkerInfo,
};
pub use app::{App, AppBuilder, JobBuilder, NewJob, PooledConnection};
pub use conn::tls::SslMode;
pub use conn::{Connection, Notification};
pub use error::{Error, ErrorKind, Result};
pub use job::{Job, JobId, JobStatus};
pub use periodic::PeriodicOptions;
pub use retention::{PruneReport, Retention};
pub use retry::RetryStrategy;
pub use task::{TaskError, TaskOptions, Tasks};
pub use worker::{
    DeleteJobs, JobEvent, JobEventKind, JobHook, ShutdownReport, Worker, WorkerBuilder,
    WorkerHandle, WorkerStats,
};
