//! Claims of large jobs, split over two connections.
//!
//! A claim returns its jobs' arguments, and the claim's one backend reads each back from
//! TOAST and sends it: with large arguments, a drain of jobs that do little runs at that
//! backend's pace while the executors wait for each claim. When the last claim brought all
//! it asked for (a backlog: a worker whose claims find a few jobs at a time sends each
//! whole), its jobs carried [`SPLIT_ARGS_BYTES`] or more each on average, and a claim asks
//! for at least [`SPLIT_MIN_JOBS`], the fetcher sends half of it (half the jobs, half the
//! byte budget) on a second connection of its own, from a scoped thread, while it sends the
//! other half on its own: two backends read and send at once, and `SKIP LOCKED` keeps
//! their jobs apart. Outcomes ride on the first half only (`ride.rs`).
//!
//! The second connection opens at the first such claim and closes once none came for the
//! App's `pool_idle_timeout`, when the fetcher's own closes, and while the server refuses
//! connections; after a failure it waits out its backoff (a minute when the server refused
//! it: out of slots), the claims going whole meanwhile. Its round-trips have the App's
//! deadlines and its socket is the worker's, severed by a shutdown like the others.
//! `WorkerBuilder::split_large_claims(false)` keeps a worker to one claiming connection.
//!
//! Measured (2026-12-06, drains at concurrency 4 on clusters of their own with default
//! settings, the build before and this one alternated, medians of two runs each): 10,000
//! jobs of 64 KiB 7,407 / 7,258 / 7,522 -> 8,775 / 8,813 / 8,905 jobs/s (+18% over five
//! pairs); of 32 KiB 11,950 / 11,728 -> 12,906 / 13,632; 20,000 of 16 KiB 19,827 / 21,527
//! against 20,750 / 20,337 (no difference), so jobs below 32 KiB keep one connection.

use std::time::{Duration, Instant};

use super::claim::{claim_keyed, claim_order, claim_with_riders, hand_out, unkey, Budget, Keyed};
use super::link::Link;
use super::{Shared, WorkerBuilder};
use crate::conn::Connection;
use crate::error::Result;

/// The mean size of the last claim's arguments from which the next goes in two.
pub(crate) const SPLIT_ARGS_BYTES: usize = 32 << 10;

/// The fewest jobs a claim asks for to go in two.
pub(crate) const SPLIT_MIN_JOBS: usize = 32;

/// A claim's jobs, and whether it left a job for its size.
type Claim = (Keyed, bool);

/// How long claims go whole after the server refused the second connection.
const REFUSED_PAUSE: Duration = Duration::from_secs(60);

/// The fetcher's second connection (see the module's comment).
pub(crate) struct Second<'a> {
    link: Link<'a, ()>,
    /// When a claim last went in two.
    last: Option<Instant>,
    /// After a failure, no split before this.
    not_before: Option<Instant>,
}

impl<'a> Second<'a> {
    pub(crate) fn new(shared: &'a Shared) -> Self {
        Second {
            link: Link::new(shared, "claiming jobs (second connection)"),
            last: None,
            not_before: None,
        }
    }

    /// Whether a claim of `free` jobs, at `args_bytes` each on average, goes in two.
    pub(crate) fn wanted(shared: &Shared, free: usize, args_bytes: usize) -> bool {
        shared.opts.split_claims && args_bytes >= SPLIT_ARGS_BYTES && free >= SPLIT_MIN_JOBS
    }

    /// The second connection when the claim goes in two (`wanted`) and it can be had now:
    /// opened if needed, not while a failure's backoff lasts.
    pub(crate) fn connection(&mut self, wanted: bool) -> Option<&mut Connection> {
        if !wanted || self.not_before.is_some_and(|t| Instant::now() < t) {
            return None;
        }
        self.not_before = None;
        match self.link.get().map(|_| ()) {
            Ok(()) => self.link.get().ok().map(|(c, ())| c),
            Err(wait) => {
                // A server out of connection slots: the worker does without for a while
                // rather than take a slot a whole process may need.
                let wait = if self.link.refused() {
                    wait.max(REFUSED_PAUSE)
                } else {
                    wait
                };
                self.not_before = Some(Instant::now() + wait);
                None
            }
        }
    }

    /// The second half's result judged (a failure logged, the link reset when broken, its
    /// backoff begun), joined to the first's.
    ///
    /// Jobs the second half brought are never dropped: when only the first failed, they
    /// are handed out here, and the first's error goes on to the fetcher's link.
    pub(crate) fn judge(
        &mut self,
        shared: &Shared,
        first: Result<Claim>,
        second: Result<Claim>,
    ) -> Result<Claim> {
        self.last = Some(Instant::now());
        let second = match self.link.judge(second) {
            Ok(r) => Some(r),
            Err(wait) => {
                self.not_before = Some(Instant::now() + wait);
                None
            }
        };
        match (first, second) {
            (Ok((mut a, cut_a)), Some((b, cut_b))) => {
                a.extend(b);
                a.sort_by(claim_order);
                Ok((a, cut_a || cut_b))
            }
            (Ok(a), None) => Ok(a),
            (Err(e), Some((b, _))) => {
                hand_out(shared, unkey(b));
                Err(e)
            }
            (Err(e), None) => Err(e),
        }
    }

    /// Closes the connection once no claim went in two for `idle`.
    pub(crate) fn close_if_idle(&mut self, idle: Duration) {
        if self.last.is_some_and(|t| t.elapsed() >= idle) {
            self.close();
        }
    }

    /// Closes the connection (it opens again at the next claim that goes in two).
    pub(crate) fn close(&mut self) {
        self.link.close();
        self.last = None;
    }
}

/// One claim of `limit` jobs sent as two, on `first` (with riding outcomes, and the jobs to
/// start at once) and on `second` (from a scoped thread): each asks for half the jobs and
/// half the byte budget. Returns both results.
pub(crate) fn claim_split(
    shared: &Shared,
    first: &mut Connection,
    second: &mut Connection,
    limit: usize,
    start: usize,
    budget: Budget,
    task_names: &Option<Vec<String>>,
) -> (Result<Claim>, Result<Claim>) {
    let half = limit / 2;
    let budget2 = Budget {
        bytes: budget.bytes / 2,
        alone: false,
    };
    let budget1 = Budget {
        bytes: budget.bytes - budget2.bytes,
        alone: budget.alone,
    };
    shared
        .stats
        .split
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::thread::scope(|s| {
        let other = std::thread::Builder::new()
            .name("postpone-claim2".into())
            .spawn_scoped(s, || {
                claim_keyed(shared, second, half, 0, budget2, task_names, None)
            });
        let one = claim_with_riders(shared, first, limit - half, start, budget1, task_names);
        let two = match other {
            Ok(h) => h.join().unwrap_or_else(|_| {
                Err(crate::Error::invalid(
                    "the second half of a claim: its thread panicked",
                ))
            }),
            Err(e) => Err(crate::Error::invalid(format!(
                "the second half of a claim: no thread for it ({e})"
            ))),
        };
        (one, two)
    })
}

impl WorkerBuilder {
    /// Whether a claim of large jobs goes in two halves on two connections at once, so that
    /// two PostgreSQL backends read the arguments back and send them: when the last claim
    /// brought all it asked for, its jobs carried 32 KiB of arguments or more each on
    /// average, and the claim asks for 32 jobs or more. Defaults to true: a drain of 64-KiB
    /// jobs that do little ran 18% faster. The second connection is open only while such
    /// claims come (it closes after the App's `pool_idle_timeout` without one); `false`
    /// keeps the worker to one claiming connection, for a fleet that counts its connections.
    pub fn split_large_claims(mut self, split: bool) -> Self {
        self.opts.split_claims = split;
        self
    }
}
