//! Concurrency limits per queue: [`Admin::set_queue_limit`] and [`Admin::queue_limits`].
//!
//! A limit is a row of `postpone_queue_limits`: at most `max_running` jobs of the queue run
//! at once across every worker of the cluster. The claim (the SQL function
//! `postpone_claim`, schema version 7) enforces it: claims of a limited queue are serialised
//! by an advisory lock held until the claim commits, and each counts the queue's running
//! jobs first, so no number of workers claiming at once goes past the limit. A running job
//! holds its slot until it leaves `doing`; the jobs of a worker that died come back through
//! the rescue (`stalled_after`), and their slots with them. Lowering a limit does not stop
//! running jobs: claims are held back until the queue is under the new limit.

use std::time::SystemTime;

use serde::Serialize;

use super::info::ser_time;
use super::Admin;
use crate::error::{Error, Result};
use crate::limits;
use crate::store;

/// One queue's concurrency limit; from [`Admin::queue_limits`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct QueueLimit {
    /// The queue.
    pub queue: String,
    /// At most this many of its jobs run at once, cluster-wide.
    pub max_running: i32,
    /// How many of its jobs run now (when this was read).
    pub running: i64,
    /// When the limit was last set.
    #[serde(serialize_with = "ser_time")]
    pub set_at: SystemTime,
}

impl QueueLimit {
    /// Whether the limit holds back the queue's waiting jobs now (its slots are all taken).
    pub fn is_reached(&self) -> bool {
        self.running >= i64::from(self.max_running)
    }
}

impl Admin {
    /// Sets (`Some(n)`) or clears (`None`) the concurrency limit of `queue`: at most `n` of
    /// its jobs run at once across every worker. Takes effect at the next claim of every
    /// worker (they are woken, so a raised or cleared limit starts waiting jobs at once);
    /// running jobs are never stopped. The queue need not have been seen
    /// ([`queue_seen`](Self::queue_seen) tells). Returns the previous limit.
    ///
    /// A limit of zero or less, or above `i32::MAX`, is an
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) error (to stop a queue, use
    /// [`pause`](Self::pause)); so is an empty name, a NUL, or a name over
    /// 255 bytes.
    pub fn set_queue_limit(&self, queue: &str, max_running: Option<i64>) -> Result<Option<i32>> {
        let what = "setting a queue's concurrency limit";
        limits::check_name("queue", queue).map_err(|e| e.context(what))?;
        let mut conn = self.conn()?;
        match max_running {
            Some(n) => {
                let n = i32::try_from(n).ok().filter(|n| *n > 0).ok_or_else(|| {
                    Error::invalid(format!(
                        "concurrency limit {n} for queue {queue:?}: it must be at least 1 and at \
                         most {} (to stop a queue, pause it; to lift the limit, clear it)",
                        i32::MAX
                    ))
                    .context(what)
                })?;
                let rows = conn.query_named(what, store::QUEUE_LIMIT_SET, &[&queue, &n])?;
                let old: Option<i32> = rows.first().and_then(|r| r.get(0));
                log::info!("queue {queue:?} limited to {n} running jobs by the admin API");
                Ok(old)
            }
            None => {
                let rows = conn.query_named(
                    "clearing a queue's concurrency limit",
                    store::QUEUE_LIMIT_CLEAR,
                    &[&queue],
                )?;
                let old: Option<i32> = rows.first().map(|r| r.get(0));
                if old.is_some() {
                    log::info!("concurrency limit of queue {queue:?} cleared by the admin API");
                }
                Ok(old)
            }
        }
    }

    /// Every concurrency limit, by queue name, with the jobs running now.
    pub fn queue_limits(&self) -> Result<Vec<QueueLimit>> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("reading the queue limits", store::QUEUE_LIMITS, &[])?;
        Ok(rows
            .iter()
            .map(|r| QueueLimit {
                queue: r.get(0),
                max_running: r.get(1),
                running: r.get(2),
                set_at: r.get(3),
            })
            .collect())
    }
}
