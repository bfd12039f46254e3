//! Batches: a group of jobs with callbacks when all of them have finished
//! ([`BatchBuilder::on_complete`]) and when all of them have succeeded
//! ([`BatchBuilder::on_success`]), jobs added while it runs ([`App::add_to_batch`],
//! [`Job::add_to_batch`](crate::Job::add_to_batch)), and its progress
//! ([`Admin::batch`](crate::Admin::batch)).
//!
//! Built on job dependencies (schema version 23): a callback is a dependent job that waits
//! on every job of the batch, `after_finished` for `on_complete`, `after` for `on_success`;
//! the database releases it (or cancels it) in the statement that records the last outcome,
//! so it runs once, whichever worker finishes what. Membership is a column of the jobs table
//! (`batch_id`, schema version 24) with a partial index: jobs outside a batch have none, and
//! nothing here runs on their claim or finish.
//!
//! A batch is created in one transaction (the batch row, its jobs, its callbacks), so no job
//! of it can run before its callbacks wait for it. Adding jobs later locks the batch and the
//! waits of its callbacks (`postpone_batch_join`, migration 24): an add is refused with
//! [`InvalidState`](ErrorKind::InvalidState) once the batch is finished (no callback waits
//! and no job of it is left to run), never silently ignored.

use std::fmt;
use std::time::SystemTime;

use serde::Serialize;

use crate::app::App;
use crate::client_trait::DeferClient;
use crate::error::{Error, ErrorKind, Result};
use crate::insert::{self, NewJob};
use crate::store;
use crate::types::{JobId, JobStatus};

/// The id of a batch: a newtype over the `bigint` key of `postpone_batches`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct BatchId(pub i64);

crate::types::id_impls!(BatchId, "batch");

/// A batch being built by [`App::batch`]: its callbacks, then [`defer`](Self::defer) with its
/// jobs.
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// use postpone::NewJob;
///
/// let files = ["a.csv", "b.csv", "c.csv"];
/// let jobs = files
///     .iter()
///     .map(|f| NewJob::new("import", f))
///     .collect::<postpone::Result<Vec<_>>>()?;
/// let batch = app
///     .batch()
///     // Runs once every import has finished, whatever its outcome.
///     .on_complete(NewJob::new("import_report", &files)?)
///     // Runs once every import has succeeded; cancelled if one does not.
///     .on_success(NewJob::new("notify_done", &"ops@example.com")?)
///     .defer(&jobs)?;
/// println!("batch {}: jobs {:?}", batch.id, batch.jobs);
/// let progress = app.admin().batch(batch.id)?;
/// println!("{} of {} finished", progress.finished(), progress.total);
/// # Ok(())
/// # }
/// ```
#[must_use = "a batch is inserted only by defer or defer_in"]
pub struct BatchBuilder<'a> {
    app: &'a App,
    on_complete: Option<NewJob>,
    on_success: Option<NewJob>,
}

impl fmt::Debug for BatchBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchBuilder")
            .field("on_complete", &self.on_complete)
            .field("on_success", &self.on_success)
            .finish()
    }
}

/// A batch as its defer inserted it; from [`BatchBuilder::defer`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Batch {
    /// Its id (for [`App::add_to_batch`] and [`Admin::batch`](crate::Admin::batch)).
    pub id: BatchId,
    /// The ids of its jobs, in input order.
    pub jobs: Vec<JobId>,
    /// The id of the `on_complete` callback, if it has one.
    pub on_complete: Option<JobId>,
    /// The id of the `on_success` callback, if it has one.
    pub on_success: Option<JobId>,
}

impl App {
    /// Starts a batch: a group of jobs with optional callbacks, inserted by
    /// [`BatchBuilder::defer`]. See [`BatchBuilder`] for an example.
    pub fn batch(&self) -> BatchBuilder<'_> {
        BatchBuilder {
            app: self,
            on_complete: None,
            on_success: None,
        }
    }

    /// Adds `jobs` to batch `batch`, in one transaction: its callbacks that still wait now
    /// wait for these jobs too. Returns their ids in input order.
    ///
    /// Always accepted from a running job of the batch (its callbacks wait for that job; see
    /// [`Job::add_to_batch`](crate::Job::add_to_batch)). From elsewhere it is refused, with
    /// [`InvalidState`](ErrorKind::InvalidState) and nothing inserted, once the batch is
    /// finished: every job of it has finished and its callbacks were released. An unknown
    /// batch is [`NotFound`](ErrorKind::NotFound).
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// # let batch_id = postpone::BatchId(1);
    /// let more = vec![postpone::NewJob::new("import", &"d.csv")?];
    /// let ids = app.add_to_batch(batch_id, &more)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn add_to_batch(&self, batch: BatchId, jobs: &[NewJob]) -> Result<Vec<JobId>> {
        let mut conn = self.connection()?;
        let mut tx = conn.transaction()?;
        let ids = add_in(self, &mut tx, batch, jobs)?;
        tx.commit()?;
        Ok(ids)
    }

    /// Like [`add_to_batch`](Self::add_to_batch), inside the caller's transaction: the jobs
    /// join the batch when it commits. Give it a transaction: on a client outside one, the
    /// two statements of an add commit apart, and a failure of the second leaves the jobs
    /// inserted outside the batch.
    pub fn add_to_batch_in<C: DeferClient + ?Sized>(
        &self,
        client: &mut C,
        batch: BatchId,
        jobs: &[NewJob],
    ) -> Result<Vec<JobId>> {
        add_in(self, client, batch, jobs)
    }
}

impl BatchBuilder<'_> {
    /// The job to run once every job of the batch has finished, whatever its outcome
    /// (succeeded, failed, cancelled, aborted, or deleted before it finished): a dependent of
    /// each with [`NewJob::after_finished`] semantics. It runs once. Defaults to none.
    pub fn on_complete(mut self, job: NewJob) -> Self {
        self.on_complete = Some(job);
        self
    }

    /// The job to run once every job of the batch has succeeded: a dependent of each with
    /// [`NewJob::after`] semantics. When one ends failed, cancelled or aborted, it ends
    /// `cancelled` at once, with an error naming that job. It runs at most once. Defaults to
    /// none.
    pub fn on_success(mut self, job: NewJob) -> Self {
        self.on_success = Some(job);
        self
    }

    /// Inserts the batch, its `jobs` and its callbacks in one transaction: all, or nothing.
    /// A batch without callbacks is allowed (its progress is still kept). A batch of no jobs
    /// has nothing to wait for: its callbacks are due at once.
    pub fn defer(self, jobs: &[NewJob]) -> Result<Batch> {
        let mut conn = self.app.connection()?;
        let mut tx = conn.transaction()?;
        let batch = self.defer_in(&mut tx, jobs)?;
        tx.commit()?;
        Ok(batch)
    }

    /// Like [`defer`](Self::defer), inside the caller's transaction: the batch exists when
    /// it commits. Give it a transaction (a batch takes several statements).
    pub fn defer_in<C: DeferClient + ?Sized>(
        self,
        client: &mut C,
        jobs: &[NewJob],
    ) -> Result<Batch> {
        let what = "deferring a batch";
        // The caller's client: statements name the App's schema (see namespace.rs).
        let ns = self.app.namespace();
        let rows = client.run_query(what, &ns.qualify(store::BATCH_INSERT), &[])?;
        let id = BatchId(
            rows.first()
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Other,
                        format!("{what}: the insert returned no row"),
                    )
                })?
                .get(0),
        );
        let ids = insert::insert_batch_in(self.app, client, jobs).map_err(|e| e.context(what))?;
        let raw: Vec<i64> = ids.iter().map(|i| i.0).collect();
        let mut callback = |job: Option<NewJob>, any: bool| -> Result<Option<JobId>> {
            let Some(job) = job else { return Ok(None) };
            let job = if any {
                job.after_finished(&ids)
            } else {
                job.after(&ids)
            };
            let got = insert::insert_batch_in(self.app, client, std::slice::from_ref(&job))
                .map_err(|e| e.context(format_args!("{what}: its callback")))?;
            Ok(got.first().copied())
        };
        let on_complete = callback(self.on_complete, true)?;
        let on_success = callback(self.on_success, false)?;
        let mut members = raw.clone();
        members.extend(on_complete.map(|j| j.0));
        members.extend(on_success.map(|j| j.0));
        let total = raw.len() as i64;
        client.run_query(
            what,
            &ns.qualify(store::BATCH_OPEN),
            &[
                &id.0,
                &members,
                &total,
                &on_complete.map(|j| j.0),
                &on_success.map(|j| j.0),
            ],
        )?;
        Ok(Batch {
            id,
            jobs: ids,
            on_complete,
            on_success,
        })
    }
}

/// Inserts `jobs` and adds them to `batch`, with the caller's client.
fn add_in<C: DeferClient + ?Sized>(
    app: &App,
    client: &mut C,
    batch: BatchId,
    jobs: &[NewJob],
) -> Result<Vec<JobId>> {
    let what = format!("adding jobs to batch {batch}");
    let ids = insert::insert_batch_in(app, client, jobs).map_err(|e| e.context(&what))?;
    let raw: Vec<i64> = ids.iter().map(|i| i.0).collect();
    client
        .run_query(
            &what,
            &app.namespace().qualify(store::BATCH_JOIN),
            &[&batch.0, &raw],
        )
        .map_err(|e| match (e.sqlstate(), e.constraint()) {
            (Some("55000"), _) => e.set_kind(ErrorKind::InvalidState),
            (Some("23503"), Some("postpone_batches_batch")) => e.set_kind(ErrorKind::NotFound),
            _ => e,
        })?;
    Ok(ids)
}

/// The progress of a batch; from [`Admin::batch`](crate::Admin::batch). Counts are read in
/// one statement, so they are consistent with each other.
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// let p = app.admin().batch(postpone::BatchId(7))?;
/// println!(
///     "{}/{} finished ({} failed), {} running, {} waiting",
///     p.finished(), p.total, p.failed, p.running, p.waiting
/// );
/// if let Some(cb) = &p.on_complete {
///     println!("on_complete: job {} {}", cb.id, cb.describe());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BatchProgress {
    /// The batch.
    pub id: BatchId,
    /// When it was created.
    #[serde(serialize_with = "crate::timefmt::ser_time")]
    pub created_at: SystemTime,
    /// Jobs ever added to it (callbacks not counted).
    pub total: u64,
    /// Jobs waiting: `todo`, or held by a worker and not started.
    pub waiting: u64,
    /// Jobs running.
    pub running: u64,
    /// Jobs that succeeded.
    pub succeeded: u64,
    /// Jobs that failed.
    pub failed: u64,
    /// Jobs cancelled.
    pub cancelled: u64,
    /// Jobs aborted.
    pub aborted: u64,
    /// Jobs whose rows are gone (deleted by retention, `DeleteJobs` or an operator): they
    /// finished, or were deleted before; their outcome is no longer known here.
    pub deleted: u64,
    /// The `on_complete` callback, if the batch has one.
    pub on_complete: Option<CallbackState>,
    /// The `on_success` callback, if the batch has one.
    pub on_success: Option<CallbackState>,
}

impl BatchProgress {
    /// Jobs no longer to run: succeeded, failed, cancelled, aborted or deleted.
    pub fn finished(&self) -> u64 {
        self.total - self.pending()
    }

    /// Jobs still to run: waiting or running.
    pub fn pending(&self) -> u64 {
        self.waiting + self.running
    }

    /// Jobs that ended badly: failed, cancelled or aborted.
    pub fn unsuccessful(&self) -> u64 {
        self.failed + self.cancelled + self.aborted
    }

    /// True when no job of the batch is left to run.
    pub fn is_finished(&self) -> bool {
        self.pending() == 0
    }
}

/// A callback of a batch, as [`BatchProgress`] shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CallbackState {
    /// Its job id.
    pub id: JobId,
    /// Its status (a job held by a worker but not started is `todo`); `None` when its row
    /// is gone (deleted by retention or `DeleteJobs`).
    pub status: Option<JobStatus>,
    /// True while it waits for the jobs of the batch (not released yet).
    pub waiting: bool,
}

impl CallbackState {
    /// `waiting for the batch`, `due`, `running`, `succeeded`, ..., or `deleted`.
    pub fn describe(&self) -> &'static str {
        match self.status {
            None => "deleted",
            Some(JobStatus::Todo) if self.waiting => "waiting for the batch",
            Some(JobStatus::Todo) => "due",
            Some(JobStatus::Doing) => "running",
            Some(s) => s.as_str(),
        }
    }
}

/// The progress of batch `id` ([`NotFound`](ErrorKind::NotFound) if there is none).
pub(crate) fn progress(conn: &mut crate::Connection, id: BatchId) -> Result<BatchProgress> {
    let rows = conn.query_named("reading a batch", store::BATCH_PROGRESS, &[&id.0])?;
    let r = rows.first().ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            format!("reading a batch: batch {id} does not exist"),
        )
    })?;
    let n = |i: usize| r.get::<_, i64>(i).max(0) as u64;
    let callback = |i: usize| -> Option<CallbackState> {
        let id: i64 = r.get::<_, Option<i64>>(i)?;
        Some(CallbackState {
            id: JobId(id),
            status: r
                .get::<_, Option<String>>(i + 1)
                .and_then(|s| s.parse().ok()),
            waiting: r.get::<_, Option<bool>>(i + 2).unwrap_or(false),
        })
    };
    let total = n(2);
    let (waiting, running, succeeded, failed, cancelled, aborted) =
        (n(3), n(4), n(5), n(6), n(7), n(8));
    let present = waiting + running + succeeded + failed + cancelled + aborted;
    Ok(BatchProgress {
        id: BatchId(r.get(0)),
        created_at: r.get(1),
        total: total.max(present),
        waiting,
        running,
        succeeded,
        failed,
        cancelled,
        aborted,
        deleted: total.saturating_sub(present),
        on_complete: callback(9),
        on_success: callback(12),
    })
}

/// The batch of job `id`, if it is in one (a callback is in its batch too).
pub(crate) fn of_job(conn: &mut crate::Connection, id: JobId) -> Result<Option<BatchId>> {
    let rows = conn.query_named("reading the batch of a job", store::BATCH_OF_JOB, &[&id.0])?;
    Ok(rows
        .first()
        .and_then(|r| r.get::<_, Option<i64>>(0))
        .map(BatchId))
}
