//! A workflow read, cancelled and retried as a whole: [`Admin::workflow`](crate::Admin::workflow),
//! [`Admin::workflows`](crate::Admin::workflows),
//! [`Admin::cancel_workflow`](crate::Admin::cancel_workflow) and
//! [`Admin::retry_workflow`](crate::Admin::retry_workflow), with what they return.

use std::time::SystemTime;

use serde::Serialize;

use super::WorkflowId;
use crate::error::{Error, ErrorKind, Result};
use crate::store;
use crate::types::{JobId, JobStatus};

/// Most members [`Admin::workflow`](crate::Admin::workflow) lists.
pub const WORKFLOW_JOBS_LISTED: usize = 1000;

/// A workflow as [`Admin::workflow`](crate::Admin::workflow) shows it: its members counted
/// by state, and the first [`WORKFLOW_JOBS_LISTED`] of them with their dependencies.
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// let w = app.admin().workflow(postpone::WorkflowId(7))?;
/// println!("{} {:?}: {} of {} finished", w.id, w.name, w.finished(), w.total);
/// for job in &w.jobs {
///     println!("  job {} {} {} after {:?}", job.id, job.task.as_deref().unwrap_or("?"),
///              job.describe(), job.after);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WorkflowInfo {
    /// Its id.
    pub id: WorkflowId,
    /// Its name.
    pub name: String,
    /// When it was inserted.
    #[serde(serialize_with = "crate::timefmt::ser_time")]
    pub created_at: SystemTime,
    /// Its jobs.
    pub total: u64,
    /// Jobs waiting (`todo`, for their dependencies or their turn; or held by a worker and
    /// not started).
    pub waiting: u64,
    /// Jobs running.
    pub running: u64,
    /// Jobs that succeeded.
    pub succeeded: u64,
    /// Jobs that failed.
    pub failed: u64,
    /// Jobs cancelled (also those cancelled because a job they ran after ended badly).
    pub cancelled: u64,
    /// Jobs aborted.
    pub aborted: u64,
    /// Jobs whose rows are gone (retention, `DeleteJobs`, an operator).
    pub deleted: u64,
    /// Its first [`WORKFLOW_JOBS_LISTED`] jobs, by id (the order of the graph: a job comes
    /// after the jobs it runs after).
    pub jobs: Vec<WorkflowJob>,
}

impl WorkflowInfo {
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

    /// True when no job of the workflow is left to run.
    pub fn is_finished(&self) -> bool {
        self.pending() == 0
    }

    /// `running`, `succeeded` (every job did), `finished with failures`, or `cancelled`
    /// (nothing failed, something was cancelled or aborted).
    pub fn describe(&self) -> &'static str {
        if !self.is_finished() {
            "running"
        } else if self.unsuccessful() == 0 {
            "succeeded"
        } else if self.failed > 0 {
            "finished with failures"
        } else {
            "cancelled"
        }
    }
}

/// A job of a workflow, as [`WorkflowInfo::jobs`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WorkflowJob {
    /// Its id.
    pub id: JobId,
    /// The name of its step ([`StepBuilder::name`](crate::StepBuilder::name)), if it was
    /// given one.
    pub step: Option<String>,
    /// Its task; `None` when its row is gone.
    pub task: Option<String>,
    /// Its queue; `None` when its row is gone.
    pub queue: Option<String>,
    /// Its status (a job held by a worker but not started is `todo`); `None` when its row
    /// is gone.
    pub status: Option<JobStatus>,
    /// True while it waits for the jobs it runs after.
    pub waiting_for_dependencies: bool,
    /// The error of its last failed attempt (or why it was cancelled), if any.
    pub last_error: Option<String>,
    /// The jobs it runs after once they succeeded, by id.
    pub after: Vec<JobId>,
    /// The jobs it runs after once they finished, whatever their outcome, by id.
    pub after_finished: Vec<JobId>,
}

impl WorkflowJob {
    /// `waiting for dependencies`, `waiting`, `running`, `succeeded`, ..., or `deleted`.
    pub fn describe(&self) -> &'static str {
        match self.status {
            None => "deleted",
            Some(JobStatus::Todo) if self.waiting_for_dependencies => "waiting for dependencies",
            Some(JobStatus::Todo) => "waiting",
            Some(JobStatus::Doing) => "running",
            Some(s) => s.as_str(),
        }
    }
}

/// A workflow in the list of [`Admin::workflows`](crate::Admin::workflows).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WorkflowSummary {
    /// Its id.
    pub id: WorkflowId,
    /// Its name.
    pub name: String,
    /// When it was inserted.
    #[serde(serialize_with = "crate::timefmt::ser_time")]
    pub created_at: SystemTime,
    /// Its jobs.
    pub total: u64,
    /// Its jobs still to run (waiting or running).
    pub pending: u64,
}

/// What [`Admin::cancel_workflow`](crate::Admin::cancel_workflow) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WorkflowCancel {
    /// Waiting jobs now cancelled.
    pub cancelled: u64,
    /// Jobs held or running, asked to abort (a held job ends aborted without running; a
    /// running task sees [`Job::should_abort`](crate::Job::should_abort)).
    pub aborting: u64,
}

/// What [`Admin::retry_workflow`](crate::Admin::retry_workflow) did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WorkflowRetry {
    /// Jobs put back to wait (for the jobs they run after, or their turn), in id order.
    pub retried: Vec<JobId>,
    /// Jobs not retried, with why (a job of the same queueing lock waits, or a job it runs
    /// after, outside those retried, ended badly), in id order.
    pub refused: Vec<(JobId, String)>,
}

/// How many times a cancel is tried when it deadlocks with a worker settling dependencies.
const CANCEL_TRIES: usize = 3;

impl crate::Admin {
    /// Workflow `id` ([`App::workflow`](crate::App::workflow)): its jobs counted by state, and
    /// the first [`WORKFLOW_JOBS_LISTED`] of them with their states and dependencies.
    /// [`NotFound`](ErrorKind::NotFound) if there is no such workflow. See
    /// [`WorkflowInfo`] for an example.
    pub fn workflow(&self, id: WorkflowId) -> Result<WorkflowInfo> {
        let mut conn = self.app().connection()?;
        let what = "reading a workflow";
        let rows = conn.query_named(what, store::WORKFLOW_GET, &[&id.0])?;
        let r = rows.first().ok_or_else(|| not_found(what, id))?;
        let n = |i: usize| r.get::<_, i64>(i).max(0) as u64;
        let (total, waiting, running, succeeded, failed, cancelled, aborted) =
            (n(3), n(4), n(5), n(6), n(7), n(8), n(9));
        let present = waiting + running + succeeded + failed + cancelled + aborted;
        let limit = WORKFLOW_JOBS_LISTED as i64;
        let jobs = conn
            .query_named(what, store::WORKFLOW_JOBS, &[&id.0, &limit])?
            .iter()
            .map(|j| WorkflowJob {
                id: JobId(j.get(0)),
                step: j.get(1),
                task: j.get(2),
                queue: j.get(3),
                status: j.get::<_, Option<String>>(4).and_then(|s| s.parse().ok()),
                waiting_for_dependencies: j.get(5),
                last_error: j.get(6),
                after: j.get::<_, Vec<i64>>(7).into_iter().map(JobId).collect(),
                after_finished: j.get::<_, Vec<i64>>(8).into_iter().map(JobId).collect(),
            })
            .collect();
        Ok(WorkflowInfo {
            id: WorkflowId(r.get(0)),
            name: r.get(1),
            created_at: r.get(2),
            total,
            waiting,
            running,
            succeeded,
            failed,
            cancelled,
            aborted,
            deleted: total.saturating_sub(present),
            jobs,
        })
    }

    /// The `limit` most recent workflows, newest first, with how many of their jobs are
    /// still to run.
    pub fn workflows(&self, limit: u32) -> Result<Vec<WorkflowSummary>> {
        let mut conn = self.app().connection()?;
        let rows = conn.query_named(
            "listing workflows",
            store::WORKFLOW_LIST,
            &[&i64::from(limit)],
        )?;
        Ok(rows
            .iter()
            .map(|r| WorkflowSummary {
                id: WorkflowId(r.get(0)),
                name: r.get(1),
                created_at: r.get(2),
                total: r.get::<_, i64>(3).max(0) as u64,
                pending: r.get::<_, i64>(4).max(0) as u64,
            })
            .collect())
    }

    /// Cancels workflow `id`, in one statement: every waiting job of it ends `cancelled`
    /// (its error says it was cancelled with its workflow), and every job held or running
    /// is asked to abort, as [`abort`](Self::abort) does (a held job ends aborted without
    /// running; a running task sees [`Job::should_abort`](crate::Job::should_abort) and
    /// ends aborted). Nothing of the workflow is left waiting. Finished jobs are left as
    /// they are; cancelling a finished workflow does nothing.
    /// [`NotFound`](ErrorKind::NotFound) if there is no such workflow.
    pub fn cancel_workflow(&self, id: WorkflowId) -> Result<WorkflowCancel> {
        let what = format!("cancelling workflow {id}");
        let mut conn = self.app().connection()?;
        if conn
            .query_named(&what, store::WORKFLOW_EXISTS, &[&id.0])?
            .is_empty()
        {
            return Err(not_found(&what, id));
        }
        let channel = self.app().namespace().channel();
        let mut tries = 0;
        let row = loop {
            tries += 1;
            match conn.query_named(&what, store::WORKFLOW_CANCEL, &[&id.0, &channel]) {
                Ok(rows) => break rows,
                // A worker settling the dependents of a job of it at the same moment locks
                // in the other order: try again, the worker's statement went through.
                Err(e) if e.sqlstate() == Some("40P01") && tries < CANCEL_TRIES => continue,
                Err(e) => return Err(e),
            }
        };
        let r = row.first().ok_or_else(|| {
            Error::new(
                ErrorKind::Other,
                format!("{what}: the statement returned no row"),
            )
        })?;
        let done = WorkflowCancel {
            cancelled: r.get::<_, i64>(0).max(0) as u64,
            aborting: r.get::<_, i64>(1).max(0) as u64,
        };
        log::info!(
            "workflow {id} cancelled by the admin API: {} jobs cancelled, {} asked to abort",
            done.cancelled,
            done.aborting
        );
        Ok(done)
    }

    /// Retries the failed part of workflow `id`: every job of it that failed, was cancelled
    /// or aborted (also those cancelled because a job they ran after failed) goes back to
    /// waiting, with its attempts counted from zero and its dependencies as they were: a
    /// job runs again only once the jobs it runs after, retried with it or succeeded
    /// before, allow it. A job is refused, and reported in
    /// [`WorkflowRetry::refused`], when a job of its queueing lock waits or a job it must
    /// run after cannot succeed any more (it ended badly and is not retried: it is outside
    /// the workflow, or deleted). [`NotFound`](ErrorKind::NotFound) if there is no such
    /// workflow.
    pub fn retry_workflow(&self, id: WorkflowId) -> Result<WorkflowRetry> {
        let what = format!("retrying workflow {id}");
        let mut conn = self.app().connection()?;
        if conn
            .query_named(&what, store::WORKFLOW_EXISTS, &[&id.0])?
            .is_empty()
        {
            return Err(not_found(&what, id));
        }
        let rows = conn.query_named(&what, store::WORKFLOW_RETRY, &[&id.0])?;
        let mut done = WorkflowRetry {
            retried: Vec::new(),
            refused: Vec::new(),
        };
        for r in &rows {
            let job = JobId(r.get(0));
            let outcome: String = r.get(1);
            match outcome.as_str() {
                "todo" => done.retried.push(job),
                "collision" => done.refused.push((
                    job,
                    "a job with its queueing lock is already waiting (todo)".to_owned(),
                )),
                other => done.refused.push((
                    job,
                    other.strip_prefix("error: ").unwrap_or(other).to_owned(),
                )),
            }
        }
        // In id order, whatever order the statement returned them in.
        done.retried.sort_unstable();
        done.refused.sort_unstable_by_key(|(job, _)| *job);
        log::info!(
            "workflow {id} retried by the admin API: {} jobs retried, {} refused",
            done.retried.len(),
            done.refused.len()
        );
        Ok(done)
    }
}

fn not_found(what: &str, id: WorkflowId) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("{what}: workflow {id} does not exist"),
    )
}

/// The workflow of job `id`, if it is in one.
pub(crate) fn of_job(conn: &mut crate::Connection, id: JobId) -> Result<Option<WorkflowId>> {
    let rows = conn.query_named(
        "reading the workflow of a job",
        store::WORKFLOW_OF_JOB,
        &[&id.0],
    )?;
    Ok(rows.first().map(|r| WorkflowId(r.get(0))))
}
