//! The fetcher: claims due jobs for the worker's free slots and hands them to executors.
//!
//! States: *claiming* (slots free, the last claim filled every slot asked for: claim again at
//! once), *full* (no free slot: wait for an executor to finish one), *idle* (the queue gave
//! fewer jobs than asked: wait for a notification, the poll interval, or stop), *backing
//! off* (the last round-trip failed: wait, reconnect, claim again). A claim asks for every
//! free slot at once, so a busy worker claims in batches and an idle one in ones.

use crossbeam_channel::{select, Receiver, Sender};
use std::sync::atomic::Ordering;
use tokio_postgres::Statement;

use super::backoff::Backoff;
use super::{sleep_or_stop, Claimed, Shared};
use crate::conn::Connection;
use crate::error::Result;
use crate::job::JobId;
use crate::store;

pub(crate) fn run(
    shared: &Shared,
    stop: &Receiver<()>,
    jobs: &Sender<Claimed>,
    wake: &Receiver<()>,
) {
    let sql = store::job_claim_sql(shared.opts.queues.is_some(), shared.opts.only_registered);
    let task_names: Vec<String> = shared.tasks.keys().cloned().collect();
    let mut conn: Option<(Connection, Statement)> = None;
    let mut backoff = Backoff::new(shared.opts.backoff_cap);
    loop {
        if shared.stopping() {
            return;
        }
        let free = shared
            .capacity
            .saturating_sub(shared.in_flight.load(Ordering::Acquire));
        if free == 0 {
            // Executors signal on `wake` when they finish a job.
            select! {
                recv(stop) -> _ => return,
                recv(wake) -> _ => continue,
            }
        }
        if conn.is_none() {
            match shared.connect().and_then(|mut c| {
                let stmt = c.prepare(&sql)?;
                Ok((c, stmt))
            }) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    shared.log_db_error("connecting to claim jobs", &e, backoff.failures() + 1);
                    if sleep_or_stop(stop, backoff.next_wait()) {
                        return;
                    }
                    continue;
                }
            }
        }
        let (c, stmt) = conn.as_mut().expect("connected above");
        match claim(shared, c, stmt, free, &task_names) {
            Ok(claimed) => {
                backoff.reset();
                let n = claimed.len();
                if n > 0 {
                    shared.hold(claimed.iter().map(|j| j.id));
                    shared.in_flight.fetch_add(n, Ordering::AcqRel);
                    shared.stats.claimed.fetch_add(n as u64, Ordering::Relaxed);
                    for job in claimed {
                        log::debug!(
                            "worker {}: claimed job {} ({}, attempt {})",
                            shared.name,
                            job.id,
                            job.task,
                            job.attempts
                        );
                        // Executors hold the receiver until the handle drops it after they
                        // have all stopped, so this cannot fail while we run.
                        let _ = jobs.send(job);
                    }
                }
                if n < free {
                    // The queue had less than we could take: wait for news.
                    select! {
                        recv(stop) -> _ => return,
                        recv(wake) -> _ => {},
                        default(shared.opts.poll_interval) => {},
                    }
                }
            }
            Err(e) => {
                shared.log_db_error("claiming jobs", &e, backoff.failures() + 1);
                if c.is_broken() {
                    conn = None;
                }
                if sleep_or_stop(stop, backoff.next_wait()) {
                    return;
                }
            }
        }
    }
}

fn claim(
    shared: &Shared,
    conn: &mut Connection,
    stmt: &Statement,
    limit: usize,
    task_names: &[String],
) -> Result<Vec<Claimed>> {
    let id = shared.id();
    let limit = limit as i64;
    let queues = shared.opts.queues.as_deref().unwrap_or(&[]);
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&id, &limit];
    if shared.opts.queues.is_some() {
        params.push(&queues);
    }
    if shared.opts.only_registered {
        params.push(&task_names);
    }
    let rows = conn.query_named("claiming jobs", stmt, &params)?;
    let mut claimed: Vec<(i32, Claimed)> = rows
        .iter()
        .map(|r| {
            (
                r.get::<_, i32>(5),
                Claimed {
                    id: JobId(r.get(0)),
                    queue: r.get(1),
                    task: r.get(2),
                    args: r.get(3),
                    attempts: r.get(4),
                    priority: r.get(5),
                    lock: r.get(6),
                    abort_requested: r.get(7),
                },
            )
        })
        .collect();
    // UPDATE ... RETURNING does not keep the claim's order: restore it.
    claimed.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
    Ok(claimed.into_iter().map(|(_, c)| c).collect())
}
