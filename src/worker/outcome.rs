//! What becomes of an attempt: an [`Outcome`] and its [`OutcomeKind`], as executors and
//! the ledger decide them and `record.rs` writes them. A kind becomes SQL in one place,
//! [`OutcomeKind::as_sql`]; which statement records it, in [`OutcomeKind::statement`].

use std::fmt;
use std::time::Duration;

use super::ledger::{self, AttemptKey};
use crate::types::RawJson;

/// What becomes of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OutcomeKind {
    Succeeded,
    Failed,
    Cancelled,
    Aborted,
    /// Not started before its deadline: ends `cancelled`, `expired` (the database writes
    /// the error).
    Expired,
    /// Succeeded and deleted: `DeleteJobs::Successful` or `Always`.
    Delete,
    /// Failed and deleted: `DeleteJobs::Always`.
    DeleteFailed,
    /// Cancelled and deleted: `DeleteJobs::Always`.
    DeleteCancelled,
    /// Aborted and deleted: `DeleteJobs::Always`.
    DeleteAborted,
    /// Back to the queue after the outcome's delay, the attempt counted.
    Retry,
    /// Back to the queue keeping its schedule, the attempt given back (interrupted, or held
    /// and never started).
    Release,
    /// Back to the queue after the outcome's delay, the attempt given back, a snooze counted.
    Snooze,
}

/// Which statement records a kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Statement {
    Finish,
    Requeue,
    Snooze,
}

impl OutcomeKind {
    /// The kind as the recording statements take it: the one conversion to SQL.
    pub(crate) fn as_sql(self) -> &'static str {
        match self {
            OutcomeKind::Succeeded => "succeeded",
            OutcomeKind::Failed => "failed",
            OutcomeKind::Cancelled => "cancelled",
            OutcomeKind::Aborted => "aborted",
            OutcomeKind::Expired => "expired",
            OutcomeKind::Delete => "delete",
            OutcomeKind::DeleteFailed => "delete:failed",
            OutcomeKind::DeleteCancelled => "delete:cancelled",
            OutcomeKind::DeleteAborted => "delete:aborted",
            OutcomeKind::Retry => "retry",
            OutcomeKind::Release => "release",
            OutcomeKind::Snooze => "snooze",
        }
    }

    pub(super) fn statement(self) -> Statement {
        match self {
            OutcomeKind::Retry | OutcomeKind::Release => Statement::Requeue,
            OutcomeKind::Snooze => Statement::Snooze,
            _ => Statement::Finish,
        }
    }

    /// Whether it deletes the job's row (its words begin with `delete`).
    pub(crate) fn deletes(self) -> bool {
        matches!(
            self,
            OutcomeKind::Delete
                | OutcomeKind::DeleteFailed
                | OutcomeKind::DeleteCancelled
                | OutcomeKind::DeleteAborted
        )
    }

    /// Whether it puts the job back in the queue (such outcomes never ride on a claim).
    pub(crate) fn requeues(self) -> bool {
        self.statement() != Statement::Finish
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_sql())
    }
}

/// What an executor decided for a job, for the recorder.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    /// The attempt: only the claim that started it can record its outcome.
    pub(crate) key: AttemptKey,
    pub(crate) kind: OutcomeKind,
    /// The wait before a retry or the end of a snooze.
    pub(crate) delay: Duration,
    pub(crate) error: Option<String>,
    /// The task's output (`Job::set_output`), recorded with a `succeeded` outcome only.
    pub(crate) output: Option<RawJson>,
    /// How long the attempt ran; `None` if it never started (a held job that ends or goes
    /// back unstarted gets its attempt back).
    pub(crate) ran: Option<Duration>,
}

impl Outcome {
    /// A held attempt that ends, or goes back to the queue, without running.
    pub(crate) fn unstarted(key: AttemptKey, why: ledger::Unstarted) -> Outcome {
        let (kind, error) = match why {
            ledger::Unstarted::Aborted => (
                OutcomeKind::Aborted,
                Some("aborted on request before it started".to_owned()),
            ),
            ledger::Unstarted::Cancelled => (
                OutcomeKind::Cancelled,
                Some("cancelled on request before it started".to_owned()),
            ),
            ledger::Unstarted::GivenBack => (OutcomeKind::Release, None),
            // The database writes the error, with the deadline (`postpone_finish`).
            ledger::Unstarted::Expired => (OutcomeKind::Expired, None),
        };
        Outcome {
            key,
            kind,
            delay: Duration::ZERO,
            error,
            output: None,
            ran: None,
        }
    }

    pub(crate) fn requeues(&self) -> bool {
        self.kind.requeues()
    }
    /// The outcome of a job run outside any worker (`testing`), to record with
    /// `record::Fence::NoWorker`; it ran (its start was written by its claim).
    #[cfg(feature = "test-util")]
    pub(crate) fn outside_worker(
        id: crate::job::JobId,
        attempt: i32,
        kind: OutcomeKind,
        delay: Duration,
        error: Option<String>,
        output: Option<RawJson>,
    ) -> Outcome {
        Outcome {
            // The worker is not part of the fence (`Fence::NoWorker`).
            key: AttemptKey {
                id,
                worker: 0,
                attempt,
            },
            kind,
            delay,
            error,
            output: if kind == OutcomeKind::Succeeded {
                output
            } else {
                None
            },
            ran: Some(Duration::ZERO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_one_statement_and_one_word() {
        use OutcomeKind as K;
        let all = [
            K::Succeeded,
            K::Failed,
            K::Cancelled,
            K::Aborted,
            K::Expired,
            K::Delete,
            K::DeleteFailed,
            K::DeleteCancelled,
            K::DeleteAborted,
            K::Retry,
            K::Release,
            K::Snooze,
        ];
        let words: std::collections::BTreeSet<&str> = all.iter().map(|k| k.as_sql()).collect();
        assert_eq!(words.len(), all.len());
        let requeues: Vec<K> = all.iter().copied().filter(|k| k.requeues()).collect();
        assert_eq!(requeues, [K::Retry, K::Release, K::Snooze]);
        assert_eq!(K::Snooze.statement(), Statement::Snooze);
        assert_eq!(K::Delete.statement(), Statement::Finish);
        let deleting: Vec<K> = all.iter().copied().filter(|k| k.deletes()).collect();
        assert!(deleting.iter().all(|k| k.as_sql().starts_with("delete")));
        assert_eq!(deleting.len(), 4);
        assert!(deleting.iter().all(|k| k.statement() == Statement::Finish));
    }
}
