//! Key limits and rate limits per queue (schema version 8): [`Admin::set_key_limit`],
//! [`Admin::set_rate_limit`], their `clear_` forms, [`Admin::key_limits`] and
//! [`Admin::rate_limits`].
//!
//! A **key limit** partitions a queue by one top-level field of the jobs' JSON arguments
//! (the key): at most `max_per_key` jobs of each key run at once across every worker of the
//! cluster. `lock` is the special case of one running job per lock value, in defer order
//! (it keeps working as before); a key limit allows N per key and starts a key's jobs in the
//! queue's usual order (priority, due time, id). Jobs whose arguments lack the field share
//! one key, so no job of the queue escapes the limit. A running job holds its key's slot
//! until it leaves `doing`; the jobs of a worker that died come back through the rescue
//! (`stalled_after`), and their slots with them.
//!
//! A **rate limit** lets at most `max_starts` jobs of a queue start in any sliding window of
//! `period`, across the cluster, by the database's clock. A start is a claim: each attempt
//! counts, retries included. The claim logs the starts of a rate-limited queue in buckets of
//! a hundredth of the period (a small table, pruned by the claim itself) and counts the
//! starts of the last `period` before claiming: in no interval of length `period` do more
//! than `max_starts` starts fall, and a start's slot comes back between `period` and
//! 1.01 x `period` after it (its bucket's end plus the period). A worker that got no job
//! because of a rate limit does not spin: it waits for a notification or its poll interval
//! (`Worker::builder(..).poll_interval`, 1 s by default), so a freed start is taken up to
//! one poll interval late; [`RateLimit::next_start_in`] says when it frees.
//!
//! Both limits are rows of their own tables; the claim (the SQL function `postpone_claim`)
//! enforces them under the advisory lock of the queue's concurrency limit (version 7), so the
//! claims of a limited queue are serialised and never go past a limit. Queues without limits
//! are claimed in parallel as before. A limit may be set for a queue never seen yet (as
//! with pauses and concurrency limits; see `queues.rs`), and `Admin::queue_seen` tells.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::info::{secs, ser_opt_secs, ser_secs, ser_time};
use super::Admin;
use crate::error::{Error, Result};
use crate::limits;
use crate::store;

/// One queue's key limit; from [`Admin::key_limits`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeyLimit {
    /// The queue.
    pub queue: String,
    /// The top-level field of the jobs' arguments that is their key.
    pub key_arg: String,
    /// At most this many jobs of one key run at once, cluster-wide.
    pub max_per_key: i32,
    /// How many of the queue's jobs run now (when this was read).
    pub running: u64,
    /// How many keys have all their slots taken now.
    pub keys_at_limit: u64,
    /// Due jobs held back now because their key has all its slots taken.
    pub held: u64,
    /// When the limit was last set.
    #[serde(serialize_with = "ser_time")]
    pub set_at: SystemTime,
}

/// One queue's rate limit; from [`Admin::rate_limits`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RateLimit {
    /// The queue.
    pub queue: String,
    /// At most this many of its jobs start in any window of `period`.
    pub max_starts: i32,
    /// The length of the sliding window.
    #[serde(serialize_with = "ser_secs", rename = "period_secs")]
    pub period: Duration,
    /// Starts in the last `period` (when this was read).
    pub recent_starts: u64,
    /// When the rate limit lets the next job start, if it holds them back now (every start
    /// of the window is taken); `None`: a job may start now.
    #[serde(serialize_with = "ser_opt_secs", rename = "next_start_in_secs")]
    pub next_start_in: Option<Duration>,
    /// When the limit was last set.
    #[serde(serialize_with = "ser_time")]
    pub set_at: SystemTime,
}

impl RateLimit {
    /// Whether the rate limit holds back the queue's due jobs now.
    pub fn is_reached(&self) -> bool {
        self.next_start_in.is_some()
    }
}

/// Shortest rate-limit period: one millisecond.
pub const MIN_RATE_PERIOD: Duration = Duration::from_millis(1);

fn positive(what: &str, queue: &str, n: i64, hint: &str) -> Result<i32> {
    i32::try_from(n).ok().filter(|n| *n > 0).ok_or_else(|| {
        Error::invalid(format!(
            "{what} {n} for queue {queue:?}: it must be at least 1 and at most {} ({hint})",
            i32::MAX
        ))
    })
}

impl Admin {
    /// Sets the key limit of `queue`: at most `max_per_key` of its jobs with the same value
    /// of the argument field `key_arg` run at once, across every worker. Replaces the
    /// queue's key limit, if it had one; returns the previous one as (`max_per_key`,
    /// `key_arg`). Takes effect at the next claim of every worker (they are woken); running
    /// jobs are never stopped. The queue need not have been seen
    /// ([`queue_seen`](Self::queue_seen) tells).
    ///
    /// Two jobs share a key when the field's value has the same JSON text: `42` and
    /// `"bob"` as any serializer writes them; an object or an array as the same text (the
    /// library writes it compactly, with the keys in the order it serialized them). Jobs
    /// without the field share one key.
    ///
    /// A limit under 1 or above `i32::MAX` is an
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) error (to stop a queue, use
    /// [`pause`](Self::pause)); so is an empty queue name or `key_arg`, a NUL, or a name over
    /// 255 bytes.
    pub fn set_key_limit(
        &self,
        queue: &str,
        key_arg: &str,
        max_per_key: i64,
    ) -> Result<Option<(i32, String)>> {
        let what = "setting a queue's key limit";
        limits::check_name("queue", queue).map_err(|e| e.context(what))?;
        limits::check_name("key argument", key_arg).map_err(|e| e.context(what))?;
        let n = positive(
            "key limit",
            queue,
            max_per_key,
            "to stop a queue, pause it; to lift the limit, clear it",
        )
        .map_err(|e| e.context(what))?;
        let mut conn = self.conn()?;
        let rows = conn.query_named(what, store::KEY_LIMIT_SET, &[&queue, &n, &key_arg])?;
        let old = rows.first().and_then(|r| {
            let n: Option<i32> = r.get(0);
            let arg: Option<String> = r.get(1);
            n.zip(arg)
        });
        log::info!(
            "queue {queue:?} limited to {n} running jobs per value of argument {key_arg:?} by the admin API"
        );
        Ok(old)
    }

    /// Lifts the key limit of `queue` and wakes its workers. Returns `false` if it had none.
    pub fn clear_key_limit(&self, queue: &str) -> Result<bool> {
        let what = "clearing a queue's key limit";
        limits::check_name("queue", queue).map_err(|e| e.context(what))?;
        let mut conn = self.conn()?;
        let cleared = !conn
            .query_named(what, store::KEY_LIMIT_CLEAR, &[&queue])?
            .is_empty();
        if cleared {
            log::info!("key limit of queue {queue:?} cleared by the admin API");
        }
        Ok(cleared)
    }

    /// Every key limit, by queue name, with what it holds back now.
    pub fn key_limits(&self) -> Result<Vec<KeyLimit>> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("reading the key limits", store::KEY_LIMITS, &[])?;
        let n = |r: &tokio_postgres::Row, i: usize| r.get::<_, i64>(i).max(0) as u64;
        Ok(rows
            .iter()
            .map(|r| KeyLimit {
                queue: r.get(0),
                key_arg: r.get(1),
                max_per_key: r.get(2),
                running: n(r, 3),
                keys_at_limit: n(r, 4),
                held: n(r, 5),
                set_at: r.get(6),
            })
            .collect())
    }

    /// Sets the rate limit of `queue`: at most `max_starts` of its jobs start in any sliding
    /// window of `per`, across every worker, by the database's clock (see docs/guide.md, "Key
    /// limits and rate limits" for the exact semantics). Replaces the queue's rate limit, if
    /// it had one (the starts already logged still count); returns the previous `max_starts`.
    /// Takes effect at the next claim of every worker; running jobs are never stopped. The
    /// queue need not have been seen ([`queue_seen`](Self::queue_seen) tells).
    ///
    /// `max_starts` under 1 or above `i32::MAX`, or `per` under [`MIN_RATE_PERIOD`] or over
    /// 100 years, is an
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) error; so is a bad queue name.
    pub fn set_rate_limit(
        &self,
        queue: &str,
        max_starts: i64,
        per: Duration,
    ) -> Result<Option<i32>> {
        let what = "setting a queue's rate limit";
        limits::check_name("queue", queue).map_err(|e| e.context(what))?;
        let n = positive(
            "rate limit",
            queue,
            max_starts,
            "to stop a queue, pause it; to lift the limit, clear it",
        )
        .map_err(|e| e.context(what))?;
        if per < MIN_RATE_PERIOD || per > limits::MAX_DELAY {
            return Err(Error::invalid(format!(
                "rate-limit period {per:?} for queue {queue:?}: it must be at least 1 ms and at most 100 years"
            ))
            .context(what));
        }
        let micros = per.as_micros() as i64;
        let mut conn = self.conn()?;
        let rows = conn.query_named(what, store::RATE_LIMIT_SET, &[&queue, &n, &micros])?;
        let old: Option<i32> = rows.first().and_then(|r| r.get(0));
        log::info!("queue {queue:?} limited to {n} starts per {per:?} by the admin API");
        Ok(old)
    }

    /// Lifts the rate limit of `queue` (and forgets its logged starts) and wakes its
    /// workers. Returns `false` if it had none.
    pub fn clear_rate_limit(&self, queue: &str) -> Result<bool> {
        let what = "clearing a queue's rate limit";
        limits::check_name("queue", queue).map_err(|e| e.context(what))?;
        let mut conn = self.conn()?;
        let cleared = !conn
            .query_named(what, store::RATE_LIMIT_CLEAR, &[&queue])?
            .is_empty();
        if cleared {
            log::info!("rate limit of queue {queue:?} cleared by the admin API");
        }
        Ok(cleared)
    }

    /// Every rate limit, by queue name, with the starts of the current window.
    pub fn rate_limits(&self) -> Result<Vec<RateLimit>> {
        let mut conn = self.conn()?;
        let rows = conn.query_named("reading the rate limits", store::RATE_LIMITS, &[])?;
        Ok(rows
            .iter()
            .map(|r| RateLimit {
                queue: r.get(0),
                max_starts: r.get(1),
                period: secs(r.get(2)).unwrap_or_default(),
                recent_starts: r.get::<_, i64>(3).max(0) as u64,
                next_start_in: r
                    .get::<_, Option<f64>>(4)
                    .map(|s| secs(s).unwrap_or_default()),
                set_at: r.get(5),
            })
            .collect())
    }
}
