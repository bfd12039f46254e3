//! Unique jobs: at most one job per key in chosen states, enforced by the database.
//!
//! A [`Unique`] set on a job ([`NewJob::unique`](crate::NewJob::unique)) makes its insert
//! compute a key from the task name and the arguments (their JSON value, so the order of
//! object keys does not matter), optionally the queue, and optionally the period bucket of
//! the job's scheduled time. A unique index over that key, whose predicate covers the chosen
//! [`UniqueStates`], refuses a second job with the same key: the insert then reports
//! [`Deferred::Duplicate`] with the id of the job that already covers the work. This holds
//! across any number of processes inserting at once.
//!
//! A job going back to the queue (a retry, a release at shutdown, the rescue of a dead
//! worker's job) never fails because of its key: from `doing` it stays inside every
//! predicate, except under [`UniqueStates::Waiting`], where a waiting duplicate supersedes it
//! (it ends `cancelled`, naming that job), as with a queueing lock.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::types::JobId;

/// In which states an existing job blocks a duplicate ([`Unique::states`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UniqueStates {
    /// Only a waiting job (`todo`, scheduled or due) blocks; once it runs, a duplicate may be
    /// deferred. Stored as the job's queueing lock, so it cannot be combined with
    /// [`NewJob::queueing_lock`](crate::NewJob::queueing_lock).
    Waiting,
    /// A waiting or running job (`todo` or `doing`) blocks.
    WaitingOrRunning,
    /// A waiting, running or succeeded job blocks: with a period, at most one job per period
    /// ever succeeds (a failed, cancelled or aborted one does not block). Finished jobs block
    /// until they are deleted (retention, `delete_finished`).
    WaitingRunningOrSucceeded,
}

impl UniqueStates {
    /// The scope letter at the start of the key (see `0006_unique.sql`).
    pub(crate) fn scope(self) -> &'static str {
        match self {
            UniqueStates::Waiting => "w",
            UniqueStates::WaitingOrRunning => "r",
            UniqueStates::WaitingRunningOrSucceeded => "s",
        }
    }
}

/// What makes two jobs duplicates, for [`NewJob::unique`](crate::NewJob::unique).
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// use std::time::Duration;
/// use postpone::{Deferred, Unique, UniqueStates};
///
/// // At most one report per customer per hour, counting waiting, running and succeeded ones.
/// let unique = Unique::by_args()
///     .period(Duration::from_secs(3600))
///     .states(UniqueStates::WaitingRunningOrSucceeded);
/// match app.job("report").unique(unique).defer_unique(&serde_json::json!({"customer": 7}))? {
///     Deferred::Inserted(id) => println!("deferred job {id}"),
///     Deferred::Duplicate(id) => println!("job {id} already covers it"),
///     _ => {}
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unique {
    by_queue: bool,
    period: Option<Duration>,
    states: UniqueStates,
}

impl Unique {
    /// Duplicates are jobs of the same task with equal arguments (as JSON values), in any
    /// queue, in states [`UniqueStates::WaitingOrRunning`], with no period.
    pub fn by_args() -> Unique {
        Unique {
            by_queue: false,
            period: None,
            states: UniqueStates::WaitingOrRunning,
        }
    }

    /// The queue is part of the key too: equal jobs in two queues are not duplicates.
    /// Defaults to any queue.
    pub fn by_queue(mut self) -> Unique {
        self.by_queue = true;
        self
    }

    /// At most one job per period: time is cut in periods of this length since the Unix
    /// epoch, and the period of the job's scheduled time (now, unless it is scheduled) is
    /// part of the key. A zero period, or one under a microsecond, is an
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) error when the job is deferred.
    /// Defaults to none (one key for all time).
    pub fn period(mut self, period: Duration) -> Unique {
        self.period = Some(period);
        self
    }

    /// In which states an existing job blocks a duplicate. Defaults to
    /// [`UniqueStates::WaitingOrRunning`].
    pub fn states(mut self, states: UniqueStates) -> Unique {
        self.states = states;
        self
    }

    /// The scope letter of the key.
    pub(crate) fn scope(&self) -> &'static str {
        self.states.scope()
    }

    /// Whether the queue is part of the key.
    pub(crate) fn keyed_by_queue(&self) -> bool {
        self.by_queue
    }

    /// The period in microseconds, validated.
    pub(crate) fn period_us(&self) -> Result<Option<i64>> {
        match self.period {
            None => Ok(None),
            Some(p) => {
                let us = p.as_micros();
                if us == 0 {
                    return Err(Error::invalid(format!(
                        "invalid unique period {p:?}: it must be at least one microsecond"
                    )));
                }
                Ok(Some(us.min(i64::MAX as u128) as i64))
            }
        }
    }
}

/// What an insert of a unique job did ([`JobBuilder::defer_unique`](crate::JobBuilder::defer_unique),
/// [`App::defer_batch_unique`](crate::App::defer_batch_unique)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Deferred {
    /// The job was inserted with this id.
    Inserted(JobId),
    /// Nothing was inserted: the job with this id already covers the work.
    Duplicate(JobId),
}

impl Deferred {
    /// The id of the job inserted, or of the one that covers the duplicate.
    pub fn id(&self) -> JobId {
        match *self {
            Deferred::Inserted(id) | Deferred::Duplicate(id) => id,
        }
    }

    /// Whether nothing was inserted.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Deferred::Duplicate(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_zero_period() {
        let u = Unique::by_args();
        assert_eq!(u.scope(), "r");
        assert!(!u.keyed_by_queue());
        assert_eq!(u.period_us().unwrap(), None);
        let e = u.period(Duration::ZERO).period_us().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("unique period"), "{e}");
        assert!(u.period(Duration::from_nanos(999)).period_us().is_err());
        assert_eq!(
            u.period(Duration::from_secs(3600)).period_us().unwrap(),
            Some(3_600_000_000)
        );
        assert_eq!(u.states(UniqueStates::Waiting).by_queue().scope(), "w");
        let d = Deferred::Duplicate(JobId(4));
        assert!(d.is_duplicate());
        assert_eq!(d.id(), JobId(4));
    }
}
