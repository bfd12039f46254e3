//! The completer: records job outcomes in batches, on its own connection.
//!
//! It takes every outcome waiting in its channel (up to [`MAX_BATCH`]) and records them in
//! one statement, so a busy worker pays one round-trip for many jobs. An outcome that cannot
//! be recorded (the database is unreachable) is kept and retried on a fresh connection with
//! backoff; nothing is dropped while the worker lives. A recorded batch that misses an id
//! means that job was no longer held by this worker (it was rescued after this worker was
//! presumed dead): it is logged, and the job will run again (at-least-once).
//!
//! Ends when every executor has ended and all outcomes are recorded, or at the shutdown's
//! hard deadline; outcomes still unrecorded then are left to the shutdown's last step.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use crossbeam_channel::{select, Receiver, Sender, TryRecvError};

use super::backoff::Backoff;
use super::{Outcome, Shared};
use crate::conn::Connection;
use crate::error::Result;
use crate::store;
use crate::types::RawJson;

/// Most outcomes recorded by one statement.
pub(crate) const MAX_BATCH: usize = 1000;

pub(crate) fn run(
    shared: &Shared,
    outcomes: &Receiver<Outcome>,
    hard: &Receiver<()>,
    wake: &Sender<()>,
) {
    let mut pending: Vec<Outcome> = Vec::new();
    let mut conn: Option<Connection> = None;
    let mut backoff = Backoff::new(shared.opts.backoff_cap);
    let mut senders_gone = false;
    loop {
        if pending.is_empty() {
            if senders_gone {
                return;
            }
            select! {
                recv(outcomes) -> o => match o {
                    Ok(o) => pending.push(o),
                    Err(_) => return,
                },
                recv(hard) -> _ => return,
            }
        }
        while pending.len() < MAX_BATCH {
            match outcomes.try_recv() {
                Ok(o) => pending.push(o),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    senders_gone = true;
                    break;
                }
            }
        }
        if conn.is_none() {
            match shared.connect() {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    shared.log_db_error(
                        &format!("connecting to record {} outcome(s)", pending.len()),
                        &e,
                        backoff.failures() + 1,
                    );
                    if wait_or_hard(hard, &mut backoff) {
                        keep(shared, pending);
                        return;
                    }
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        let batch = pending.len().min(MAX_BATCH);
        match record(shared, c, &pending[..batch]) {
            Ok(()) => {
                backoff.reset();
                let requeued_now = pending[..batch]
                    .iter()
                    .any(|o| o.word == "retry" && o.delay.is_zero());
                pending.drain(..batch);
                if requeued_now {
                    // A job to retry at once is due again: let our fetcher look.
                    let _ = wake.try_send(());
                }
            }
            Err(e) => {
                let ids: Vec<String> = pending[..batch.min(5)]
                    .iter()
                    .map(|o| o.id.to_string())
                    .collect();
                shared.log_db_error(
                    &format!(
                        "recording {} outcome(s) (jobs {}{})",
                        batch,
                        ids.join(", "),
                        if batch > 5 { ", ..." } else { "" }
                    ),
                    &e,
                    backoff.failures() + 1,
                );
                if c.is_broken() {
                    conn = None;
                }
                if wait_or_hard(hard, &mut backoff) {
                    keep(shared, pending);
                    return;
                }
            }
        }
    }
}

/// Waits the next backoff step; true if the hard deadline came first.
fn wait_or_hard(hard: &Receiver<()>, backoff: &mut Backoff) -> bool {
    super::sleep_or_stop(hard, backoff.next_wait())
}

fn keep(shared: &Shared, pending: Vec<Outcome>) {
    if !pending.is_empty() {
        shared
            .unrecorded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(pending);
    }
}

/// Records a batch of outcomes with one statement; logs the ones no longer ours.
pub(crate) fn record(shared: &Shared, conn: &mut Connection, batch: &[Outcome]) -> Result<()> {
    let ids: Vec<i64> = batch.iter().map(|o| o.id.0).collect();
    let words: Vec<&str> = batch.iter().map(|o| o.word).collect();
    let delays: Vec<i64> = batch
        .iter()
        .map(|o| o.delay.as_micros().min(i64::MAX as u128) as i64)
        .collect();
    let errors: Vec<Option<&str>> = batch.iter().map(|o| o.error.as_deref()).collect();
    let outputs: Vec<Option<&RawJson>> = batch.iter().map(|o| o.output.as_ref()).collect();
    let worker = shared.id();
    let rows = conn.query_cached(
        "recording job outcomes",
        store::JOB_FINISH_BATCH,
        &[&worker, &ids, &words, &delays, &errors, &outputs],
    )?;
    shared.unhold(batch.iter().map(|o| o.id));
    shared
        .stats
        .recorded
        .fetch_add(rows.len() as u64, Ordering::Relaxed);
    if rows.len() < batch.len() {
        let done: HashSet<i64> = rows.iter().map(|r| r.get(0)).collect();
        let missing: Vec<&Outcome> = batch.iter().filter(|o| !done.contains(&o.id.0)).collect();
        explain_unrecorded(shared, conn, &missing);
    }
    Ok(())
}

/// An outcome the guarded update did not apply: either an earlier try of this very batch
/// committed and only its reply was lost (the row already says so), or the job is no longer
/// this worker's (it was presumed dead and requeued: the job will run again). Tells which.
fn explain_unrecorded(shared: &Shared, conn: &mut Connection, missing: &[&Outcome]) {
    let ids: Vec<i64> = missing.iter().map(|o| o.id.0).collect();
    let now: std::collections::HashMap<i64, (String, Option<i64>)> =
        match conn.query_cached("reading unrecorded outcomes", store::JOB_STATES, &[&ids]) {
            Ok(rows) => rows
                .iter()
                .map(|r| (r.get(0), (r.get(1), r.get(2))))
                .collect(),
            Err(e) => {
                log::warn!(
                    "worker {}: {} outcome(s) not recorded, and their jobs could not be read: {e}",
                    shared.name,
                    missing.len()
                );
                return;
            }
        };
    let me = shared.id();
    for o in missing {
        let state = now.get(&o.id.0);
        let already = match (o.word, state) {
            ("delete", None) => true,
            ("retry" | "release", Some((st, _))) => st == "todo",
            (word, Some((st, worker))) => st == word && *worker == Some(me),
            _ => false,
        };
        if already {
            log::debug!(
                "worker {}: outcome {:?} of job {} was already recorded (an earlier try committed; its reply was lost)",
                shared.name,
                o.word,
                o.id
            );
            shared.stats.recorded.fetch_add(1, Ordering::Relaxed);
        } else {
            log::warn!(
                "worker {}: outcome {:?} of job {} not recorded: the job is no longer held by this worker (now {}); it was presumed dead and the job was requeued, so it runs again",
                shared.name,
                o.word,
                o.id,
                match state {
                    Some((st, Some(w))) => format!("{st} under worker {w}"),
                    Some((st, None)) => st.clone(),
                    None => "deleted".to_owned(),
                }
            );
        }
    }
}
