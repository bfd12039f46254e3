//! The claim itself: one statement (or, with outcomes riding on it, one transaction of two)
//! that takes due jobs for this worker and returns them in the claim's order, and the
//! hand-out of claimed jobs to the executors. The fetcher (`fetch.rs`) decides when and how
//! many; `split.rs` sends one in two halves.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use super::idhash::IdMap;
use super::record::{FinishParams, Recorder};
use super::{Claimed, Outcome, Shared};
use crate::conn::Connection;
use crate::error::Result;
use crate::job::JobId;
use crate::store;

/// Hands claimed jobs to the executors, the ledger holding them first.
pub(crate) fn hand_out(shared: &Shared, claimed: Vec<Claimed>) {
    if claimed.is_empty() {
        return;
    }
    shared.ledger.hold(claimed.iter().map(Claimed::hold));
    shared
        .stats
        .claimed
        .fetch_add(claimed.len() as u64, Ordering::Relaxed);
    if log::log_enabled!(log::Level::Debug) {
        for job in &claimed {
            log::debug!(
                "worker {}: claimed job {} ({}, attempt {})",
                shared.name,
                job.id,
                job.task,
                job.attempts
            );
        }
    }
    shared.handoff.push(claimed);
}

/// What a claim may return in bytes of arguments (see [`byte_room`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Budget {
    pub(super) bytes: usize,
    /// A first job larger than `bytes` may come alone.
    pub(super) alone: bool,
}

/// A claim that also records the final outcomes waiting for it (`ride.rs`), in one
/// transaction, when any wait and the link allows it (outside a transaction pooler);
/// otherwise a claim alone. Outcomes it could not record go back to the completer.
pub(super) fn claim_with_riders(
    shared: &Shared,
    conn: &mut Connection,
    limit: usize,
    start: usize,
    budget: Budget,
    task_names: &Option<Vec<String>>,
) -> Result<(Keyed, bool)> {
    let possible = shared.opts.ride_claims && !conn.through_transaction_pooler();
    shared.ride.claiming(possible);
    if !possible {
        return claim_keyed(shared, conn, limit, start, budget, task_names, None);
    }
    let riders = shared.ride.take(super::complete::MAX_BATCH);
    if riders.is_empty() {
        return claim_keyed(shared, conn, limit, start, budget, task_names, None);
    }
    let refs: Vec<&Outcome> = riders.iter().collect();
    let params = FinishParams::new(&refs);
    let mut recorded = None;
    let res = claim_keyed(
        shared,
        conn,
        limit,
        start,
        budget,
        task_names,
        Some((&params, &mut recorded)),
    );
    match recorded {
        Some(done) => {
            // Committed with the claim.
            shared
                .stats
                .rode
                .fetch_add(refs.len() as u64, Ordering::Relaxed);
            Recorder::new(shared).settle(conn, &refs, &done);
        }
        None => {
            drop(params);
            shared.ride.hand_back(riders);
            // The transaction failed on the server (the recording was refused, or a row
            // lock made it wait past its lock_timeout) and the link is fine: the completer
            // records the outcomes on its own, and the claim goes alone, as it would have.
            if res.is_err() && !conn.is_broken() {
                return claim_keyed(shared, conn, limit, start, budget, task_names, None);
            }
        }
    }
    res
}

/// The recording of outcomes that rides on a claim: its parameters, and where the claim
/// puts, once the transaction committed, each recorded job's id.
type Riders<'a, 'b> = (&'a FinishParams<'a>, &'b mut Option<IdMap<i64, String>>);

/// Claimed jobs with the time each was due, in the claim's order (see [`claim_order`]).
pub(super) type Keyed = Vec<(SystemTime, Claimed)>;

/// The jobs of a keyed claim, in its order.
pub(super) fn unkey(claimed: Keyed) -> Vec<Claimed> {
    claimed.into_iter().map(|(_, c)| c).collect()
}

/// The claim's order: priority (highest first), then due time, then id.
pub(super) fn claim_order(
    a: &(SystemTime, Claimed),
    b: &(SystemTime, Claimed),
) -> std::cmp::Ordering {
    (b.1.priority.cmp(&a.1.priority))
        .then(a.0.cmp(&b.0))
        .then(a.1.id.cmp(&b.1.id))
}

/// A claim of up to `limit` due jobs for this worker (`start` of them started at once, the
/// rest held), within `budget`; with `riders`, in one transaction with their recording.
/// Returns the jobs, each with the time it was due, in the claim's order, and whether the
/// claim left a job for its size.
pub(super) fn claim_keyed(
    shared: &Shared,
    conn: &mut Connection,
    limit: usize,
    start: usize,
    budget: Budget,
    task_names: &Option<Vec<String>>,
    riders: Option<Riders<'_, '_>>,
) -> Result<(Keyed, bool)> {
    let id = shared.id();
    let limit = limit.min(i32::MAX as usize) as i32;
    let start = start.min(i32::MAX as usize) as i32;
    let sent = shared.due.sending();
    shared.stats.claims.fetch_add(1, Ordering::Relaxed);
    let bytes = budget.bytes.min(i64::MAX as usize) as i64;
    let claim_params: [&(dyn postgres::types::ToSql + Sync); 8] = [
        &id,
        &limit,
        &shared.opts.queues,
        task_names,
        &start,
        &bytes,
        &budget.alone,
        &false,
    ];
    let mut rows = match riders {
        None => conn.query_cached("claiming jobs", store::JOB_CLAIM, &claim_params)?,
        Some((finish, recorded)) => {
            let pair = conn.query_cached_pair_in_transaction(
                "recording job outcomes and claiming jobs",
                // A job row locked by someone else (an admin command, a transaction of
                // the user's) holds the recording up: not the claim, which gives up after
                // 100 ms and goes again alone, leaving that wait to the completer.
                store::CLAIM_WITH_FINISH_BEGIN,
                (FinishParams::SQL, &finish.params()),
                (store::JOB_CLAIM, &claim_params),
            )?;
            match (pair.first, pair.second) {
                (Ok(done), Ok(rows)) => {
                    *recorded = Some(done.iter().map(|r| (r.get(0), String::new())).collect());
                    rows
                }
                (first, second) => {
                    let e = first.err().or(second.err()).expect("one failed");
                    log::debug!(
                        "worker {}: recording outcomes with a claim failed ({e}); the completer records them",
                        shared.name
                    );
                    return Err(e);
                }
            }
        }
    };
    Ok(parse_claim(shared, &mut rows, sent))
}

/// The jobs of a claim's reply (`rows`, from `store::JOB_CLAIM` sent at `sent`), each with
/// the time it was due, in the claim's order, and whether the claim left a job for its size;
/// what the reply says of due times is learnt.
pub(super) fn parse_claim(
    shared: &Shared,
    rows: &mut Vec<postgres::Row>,
    sent: std::time::Instant,
) -> (Keyed, bool) {
    let id = shared.id();
    // On every row, the job-less one too (which `learn` removes).
    let cut = rows.first().is_some_and(|r| r.get::<_, bool>(15));
    shared.due.learn(rows, sent, shared.opts.poll_interval);
    let mut claimed: Vec<(SystemTime, Claimed)> = rows
        .iter()
        .map(|r| {
            (
                r.get::<_, SystemTime>(8),
                Claimed {
                    id: JobId(r.get(0)),
                    queue: r.get(1),
                    task: r.get(2),
                    args: r.get(3),
                    attempts: r.get(4),
                    priority: r.get(5),
                    lock: r.get(6),
                    abort_requested: r.get(7),
                    worker: id,
                    max_attempts: r.get(10),
                    held: r.get(13),
                    claimed: sent,
                    queue_wait: r.get(9),
                    expires: r
                        .get::<_, Option<f64>>(14)
                        .and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok())
                        .and_then(|d| sent.checked_add(d)),
                    locked: r.get::<_, Option<bool>>(16).unwrap_or(false),
                },
            )
        })
        .collect();
    // UPDATE ... RETURNING does not keep the claim's order: restore it.
    claimed.sort_by(claim_order);
    (claimed, cut)
}
