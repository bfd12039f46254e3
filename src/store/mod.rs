//! The SQL catalogue: every statement the library runs against postpone's tables, grouped by
//! noun, each named `noun_verb` and documented by its contract (its parameters, what it
//! returns, and the guard that makes it safe to run twice or to race).
//!
//! | file | what its statements touch |
//! |------|---------------------------|
//! | `jobs.rs` | deferring: inserts, unique jobs, dependencies, batches |
//! | `attempts.rs` | a worker's attempts: claim, start, outcomes, requeue, expiry; `testing`'s claim |
//! | `workers.rs` | worker rows, controls, rescue, retirement, stalled jobs, vacuum |
//! | `queues.rs` | pauses, concurrency, per-key and rate limits, queue gauges |
//! | `periodic.rs` | periodic instants and stored schedules |
//! | `results.rs` | progress, output, dependencies' outcomes, waiters |
//! | `admin.rs` | one job's reads and controls, statistics, retention |
//! | `schema.rs` | migrations' bookkeeping, adoption, catalogue reads |
//! | `workflows.rs` | workflows: their rows and members, inspect, cancel, retry |
//! | `dashboard.rs` | the dashboard's fixed reads |
//!
//! Statements are `&'static str`, prepared once per connection where the caller caches them.
//! Callers write `store::NAME`: every submodule is re-exported here.
//!
//! Guards live in the SQL, not in the callers: an outcome only touches a row that is still
//! `doing` under the attempt that produced it (its worker and attempt number, the fence); a
//! rescue only touches rows still `doing` under a worker it deletes in the same statement.
//! Neither can overwrite a job that finished meanwhile.
//!
//! What is not here, and why:
//! - SQL built from a caller's filter or options, where it is built: the admin job filter
//!   (`admin/filter.rs`), bulk operations over a filter (`admin/bulk.rs`), the dashboard's
//!   job pages (`web/queries.rs`), the admin statistics' grouping column (the `{group}` of
//!   [`JOB_STATS`]), the stalled-job fixes (`admin/workers.rs`, over
//!   [`STALLED_CONDITION`]) and the cursor over a large value (`admin/preview.rs`);
//! - DDL: the migrations and the present schema (`src/schema/`), the schema of a named
//!   namespace and its pinning (`namespace.rs`), the `grants` script (`admin/grants.rs`);
//! - the connection layer's own session statements (`conn/`: the pool's session check, the
//!   routing's `BEGIN`, the server-state probe), which know nothing of postpone's tables.
//!
//! Channels: the workers' channel (`Namespace::channel`, `postpone` by default) carries
//! `job:<queue>` (new work; `job:*` for every queue), `abort:<id>`, `pause:<queue>` and
//! `at:<µs since the epoch>:<queue>` (a job due later); the done channel (`postpone_done` by
//! default) carries the ids of finished jobs that have waiters. A notification is a hint:
//! the tables are the truth.

/// The columns of a job as the admin API shows it (`admin::JobInfo::from_row`); a job a
/// worker holds but has not started shows as waiting.
macro_rules! job_columns {
    () => {
        "j.id, j.queue, j.task, j.args, \
         CASE WHEN j.status = 'doing' AND j.started_at IS NULL \
              THEN 'todo' ELSE j.status END, j.priority, j.lock, j.queueing_lock, \
         j.scheduled_at, \
         CASE WHEN j.status = 'doing' AND j.started_at IS NULL \
              THEN greatest(j.attempts - 1, 0) ELSE j.attempts END, \
         j.worker_id, j.abort_requested, j.created_at, \
         j.started_at, j.finished_at"
    };
}

mod admin;
mod attempts;
#[cfg(feature = "web")]
mod dashboard;
mod jobs;
mod periodic;
mod queues;
mod results;
mod schema;
mod workers;
mod workflows;

pub(crate) use admin::*;
pub(crate) use attempts::*;
#[cfg(feature = "web")]
pub(crate) use dashboard::*;
pub(crate) use jobs::*;
pub(crate) use periodic::*;
pub(crate) use queues::*;
pub(crate) use results::*;
pub(crate) use schema::*;
pub(crate) use workers::*;
pub(crate) use workflows::*;
