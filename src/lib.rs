#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod app;
mod conn;
mod error;
mod job;
mod retry;
mod schema;
mod store;
mod task;
mod worker;

pub use app::{App, AppBuilder, JobBuilder, NewJob, PooledConnection};
pub use conn::{Connection, Notification};
pub use error::{Error, ErrorKind, Result};
pub use job::{Job, JobId, JobStatus};
pub use retry::RetryStrategy;
pub use task::{TaskError, TaskOptions, Tasks};
pub use worker::{
    DeleteJobs, JobEvent, JobEventKind, JobHook, ShutdownReport, Worker, WorkerBuilder,
    WorkerHandle, WorkerStats,
};
