//! Retention: deleting finished jobs once they are old enough, in small batches.
//!
//! One [`Retention`] describes what to delete: jobs whose status is one of the chosen
//! finished statuses (all four by default) and that finished more than `older_than` ago.
//! It is used by [`Admin::prune`](crate::Admin::prune) and, on an interval, by a worker
//! given [`WorkerBuilder::retention`](crate::WorkerBuilder::retention).
//!
//! Each statement deletes at most `batch_size` rows (1000 by default), the oldest first
//! (through the finished-jobs index), and commits on its own, skipping rows other
//! transactions hold, so no statement holds many locks or runs long; batches repeat until
//! one comes back short. Several workers pruning at once share the work. Records of
//! periodic instants older than `older_than` (but never younger than two days, which
//! periodic deduplication needs) are pruned the same way, except the latest of each
//! schedule, from which its catch-up after downtime is counted. Then workflows and batches
//! older than `older_than` none of whose jobs is left are deleted, so a program that uses
//! them and prunes keeps its tables flat.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::conn::Connection;
use crate::error::{fmt_duration, Error, ErrorKind, Result};
use crate::periodic::PERIODIC_KEEP_MIN;
use crate::store;
use crate::types::JobStatus;

/// Rows per delete statement unless [`Retention::batch_size`] says otherwise.
const DEFAULT_BATCH: u32 = 1000;

/// What finished jobs to delete, and how often a worker does it.
///
/// ```no_run
/// use std::time::Duration;
/// use postpone::{JobStatus, Retention};
///
/// # fn main() -> postpone::Result<()> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// const DAY: Duration = Duration::from_secs(24 * 3600);
/// // Once, now: succeeded jobs older than a day.
/// let report = app
///     .admin()
///     .prune(&Retention::new(DAY).statuses([JobStatus::Succeeded]))?;
/// println!("{report}");
/// // Or by a worker, every 5 minutes: every finished job older than a week.
/// # let tasks = postpone::Tasks::new();
/// let worker = postpone::Worker::builder(&app, tasks)
///     .retention(Retention::new(7 * DAY))
///     .spawn()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    pub(crate) older_than: Duration,
    pub(crate) statuses: Vec<JobStatus>,
    pub(crate) interval: Duration,
    pub(crate) batch: u32,
}

impl Retention {
    /// Deletes jobs that finished more than `older_than` ago (an age over 100 years reads as
    /// 100 years: the database cannot count much further back from its clock).
    pub fn new(older_than: Duration) -> Retention {
        Retention {
            older_than,
            statuses: Vec::new(),
            interval: Duration::from_secs(300),
            batch: DEFAULT_BATCH,
        }
    }

    /// Only jobs with these statuses (each must be a finished one: succeeded, failed,
    /// cancelled, aborted). Defaults to all four.
    pub fn statuses<I: IntoIterator<Item = JobStatus>>(mut self, statuses: I) -> Retention {
        self.statuses = statuses.into_iter().collect();
        self
    }

    /// How often a worker prunes (the first run comes after a random part of it, so that
    /// workers started together do not prune together). Ignored by `Admin::prune`.
    /// Defaults to 5 minutes.
    pub fn interval(mut self, every: Duration) -> Retention {
        self.interval = every;
        self
    }

    /// Most rows one delete statement removes. Defaults to 1000.
    pub fn batch_size(mut self, rows: u32) -> Retention {
        self.batch = rows;
        self
    }

    /// The age past which finished jobs are deleted.
    pub fn older_than(&self) -> Duration {
        self.older_than
    }

    /// Refuses unfinished statuses and zero sizes.
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(s) = self.statuses.iter().find(|s| !s.is_finished()) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "invalid retention status {s}: only finished jobs (succeeded, failed, cancelled, aborted) can be pruned"
                ),
            ));
        }
        if self.batch == 0 {
            return Err(Error::invalid(
                "invalid retention batch size 0: use at least 1",
            ));
        }
        if self.interval.is_zero() {
            return Err(Error::invalid(
                "invalid retention interval: it must be longer than zero",
            ));
        }
        Ok(())
    }

    fn status_names(&self) -> Vec<&'static str> {
        if self.statuses.is_empty() {
            JobStatus::ALL
                .iter()
                .filter(|s| s.is_finished())
                .map(|s| s.as_str())
                .collect()
        } else {
            self.statuses.iter().map(|s| s.as_str()).collect()
        }
    }
}

/// What a prune deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PruneReport {
    /// Finished jobs deleted.
    pub jobs_deleted: u64,
    /// Records of periodic instants deleted.
    pub periodic_deleted: u64,
    /// Workflows and batches deleted: those older than the retention's age none of whose
    /// jobs is left.
    pub groups_deleted: u64,
}

impl fmt::Display for PruneReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.groups_deleted == 0 {
            return write!(
                f,
                "deleted {} job(s) and {} periodic record(s)",
                self.jobs_deleted, self.periodic_deleted
            );
        }
        write!(
            f,
            "deleted {} job(s), {} periodic record(s) and {} workflow(s) or batch(es)",
            self.jobs_deleted, self.periodic_deleted, self.groups_deleted
        )
    }
}

fn millis(d: Duration) -> i64 {
    crate::limits::age_millis(d)
}

/// Runs the batches of `r` on `conn`. `go_on` is asked before each batch: when it says
/// false (a worker stopping), the prune ends early with what it did.
pub(crate) fn prune(
    conn: &mut Connection,
    r: &Retention,
    mut go_on: impl FnMut() -> bool,
) -> Result<PruneReport> {
    r.validate()?;
    let statuses = r.status_names();
    let age = millis(r.older_than);
    let batch = i64::from(r.batch);
    let mut report = PruneReport::default();
    loop {
        if !go_on() {
            return Ok(report);
        }
        let n = conn
            .execute_cached(
                "pruning finished jobs",
                store::JOBS_PRUNE,
                &[&statuses, &age, &batch],
            )
            .map_err(|e| {
                e.context(format_args!(
                    "after deleting {} job(s)",
                    report.jobs_deleted
                ))
            })?;
        report.jobs_deleted += n;
        if n < batch as u64 {
            break;
        }
    }
    let periodic_age = millis(r.older_than.max(PERIODIC_KEEP_MIN));
    loop {
        if !go_on() {
            return Ok(report);
        }
        let n = conn.execute_cached(
            "pruning periodic records",
            store::PERIODIC_PRUNE,
            &[&periodic_age, &batch],
        )?;
        report.periodic_deleted += n;
        if n < batch as u64 {
            break;
        }
    }
    // Workflows and batches whose jobs are all gone, once as old as the jobs pruned: what
    // is left of them is a row that nothing reads.
    for (what, sql) in [
        ("pruning workflows", store::WORKFLOWS_PRUNE),
        ("pruning batches", store::BATCHES_PRUNE),
    ] {
        loop {
            if !go_on() {
                return Ok(report);
            }
            let n = conn.execute_cached(what, sql, &[&age, &batch])?;
            report.groups_deleted += n;
            if n < batch as u64 {
                break;
            }
        }
    }
    log::debug!(
        "pruned jobs finished more than {} ago ({}): {report}",
        fmt_duration(r.older_than),
        statuses.join(", ")
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let r = Retention::new(Duration::from_secs(60));
        assert_eq!(r.batch, 1000);
        assert_eq!(r.interval, Duration::from_secs(300));
        assert_eq!(
            r.status_names(),
            vec!["succeeded", "failed", "cancelled", "aborted"]
        );
        assert!(r.validate().is_ok());
        let e = r
            .clone()
            .statuses([JobStatus::Todo])
            .validate()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(
            e.to_string().contains("invalid retention status todo"),
            "{e}"
        );
        assert!(r.clone().batch_size(0).validate().is_err());
        assert!(r.clone().interval(Duration::ZERO).validate().is_err());
        let only = r.statuses([JobStatus::Failed, JobStatus::Aborted]);
        assert_eq!(only.status_names(), vec!["failed", "aborted"]);
    }

    #[test]
    fn report_reads_as_a_sentence() {
        let mut r = PruneReport {
            jobs_deleted: 3,
            periodic_deleted: 1,
            groups_deleted: 0,
        };
        assert_eq!(r.to_string(), "deleted 3 job(s) and 1 periodic record(s)");
        r.groups_deleted = 2;
        assert_eq!(
            r.to_string(),
            "deleted 3 job(s), 1 periodic record(s) and 2 workflow(s) or batch(es)"
        );
    }
}
