//! After a round-trip: what the ledger and the completer take over once a transaction
//! committed, and the writing again of the jobs of one that was lost.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::super::idhash::IdMap;
use super::plan::{Plan, Write};
use super::round::{write_lost, Lost, Open};
use super::{Locked, MAX_CAP};
use crate::error::Result;
use crate::store;

impl Locked<'_> {
    /// What a round-trip that ended `open` (with `plan`) brought back.
    pub(super) fn after_commit(
        &mut self,
        open: Open,
        plan: Option<Plan>,
        settled: Option<Result<Vec<postgres::Row>>>,
        commit_failed: bool,
    ) {
        let Some(plan) = plan else {
            return;
        };
        match settled {
            Some(Ok(rows)) if !commit_failed => {
                let done: IdMap<i64, ()> = rows.iter().map(|r| (r.get::<_, i64>(0), ())).collect();
                self.finish(&plan, &done);
            }
            other => {
                if let Some(Err(e)) = other {
                    log::warn!(
                        "worker {}: writing locked jobs failed ({e}); their transaction rolled back, and the worker writes them again",
                        self.shared.name
                    );
                }
                // Surely not committed.
                self.lost.push(Lost {
                    xid: open.xid.unwrap_or_default(),
                    pid: open.pid,
                    keys: open.keys,
                    sent: None,
                });
            }
        }
    }

    /// A transaction that locked jobs was left uncommitted on a failed link (`xid` and the
    /// session's process): none of its jobs was handed out, but the session may live on
    /// holding them (a half-open link), and the note may name it. It is ended and taken off
    /// the note as a lost one with no jobs.
    pub(super) fn abandon(&mut self, abandoned: Option<(String, Option<i32>)>) {
        if let Some((xid, pid)) = abandoned {
            self.lost.push(Lost {
                xid,
                pid,
                keys: Vec::new(),
                sent: None,
            });
        }
    }

    /// `open` (with `plan`, when one was sent) may or may not have committed.
    pub(super) fn lose(&mut self, open: Open, plan: Option<Plan>) {
        let Some(xid) = open.xid else {
            return;
        };
        self.lost.push(Lost {
            xid,
            pid: open.pid,
            keys: open.keys,
            sent: plan,
        });
    }

    /// After `plan` was committed, with `done` the ids it wrote: the ledger and the
    /// completer take over.
    pub(super) fn finish(&mut self, plan: &Plan, done: &IdMap<i64, ()>) {
        let shared = self.shared;
        let mut settled = Vec::new();
        let mut recorded = 0u64;
        let outcomes = shared.absorb.remove_all(&plan.keys);
        for ((k, w), outcome) in plan.keys.iter().zip(&plan.writes).zip(outcomes) {
            let written = done.contains_key(&k.id.0);
            match w {
                Write::Succeeded | Write::Delete if written => {
                    recorded += 1;
                    settled.push(*k);
                }
                Write::Running | Write::Held if written => {
                    shared.ledger.unlock(*k, *w == Write::Running);
                    if let Some(o) = outcome {
                        let _ = self.out.send(o);
                    }
                }
                Write::Release => settled.push(*k),
                _ => {
                    // Not written: the row changed meanwhile (the rescue requeued it, an
                    // operator cancelled it) or the worker's row is gone. The attempt is
                    // not this worker's to record.
                    log::debug!(
                        "worker {}: job {} (attempt {}) was not written with its claim's transaction: it is no longer this attempt's",
                        shared.name,
                        k.id,
                        k.attempt
                    );
                    shared.ledger.unlock(*k, false);
                    if let Some(o) = outcome {
                        let _ = self.out.send(o);
                    }
                }
            }
        }
        shared.stats.recorded.fetch_add(recorded, Ordering::Relaxed);
        shared.stats.once.fetch_add(recorded, Ordering::Relaxed);
        // The next claims' size: the jobs written twice are those still running or waiting
        // at the commit. A few running ones (one per thread) are the cost of any claim. A
        // claim of two connections writes half its jobs on each.
        let twice = plan
            .writes
            .iter()
            .filter(|w| matches!(w, Write::Running | Write::Held))
            .count();
        let c = shared.opts.concurrency;
        if twice * 4 > plan.writes.len() {
            self.cap = (self.cap / 2).max(c);
        } else if twice <= c && plan.writes.len() * 2 >= self.cap {
            self.cap = (self.cap * 2).min(MAX_CAP).max(c);
        }
        shared.ledger.settle(settled);
    }

    /// Writes the jobs of lost transactions (see the module's comment), on the note's
    /// connection. Returns whether nothing is left to write.
    pub(crate) fn recover(&mut self) -> bool {
        let lost = std::mem::take(&mut self.lost);
        for l in lost {
            if !self.lost.is_empty() {
                self.lost.push(l);
                continue;
            }
            match self.try_recover(&l) {
                Ok(true) => {}
                Ok(false) => self.lost.push(l),
                Err(e) => {
                    let _ = self.notes.judge::<()>(Err(e));
                    self.lost.push(l);
                }
            }
        }
        self.lost.is_empty()
    }

    pub(super) fn try_recover(&mut self, lost: &Lost) -> Result<bool> {
        let shared = self.shared;
        let conn = match self.notes.get() {
            Ok((c, ())) => c,
            Err(_) => return Ok(false),
        };
        // The transaction's fate; one still open on a session the fetcher lost is ended.
        let mut status: Option<String> = None;
        for round in 0..20 {
            let rows = conn.query_cached("writing lost jobs", store::XACT_STATUS, &[&lost.xid])?;
            status = rows.first().and_then(|r| r.get(0));
            if status.as_deref() != Some("in progress") || shared.stopping() {
                break;
            }
            if round == 0 {
                if let Some(pid) = lost.pid {
                    log::info!(
                        "worker {}: the claim's transaction {} is still open on a session the worker lost (server process {pid}): ending it",
                        shared.name,
                        lost.xid
                    );
                    conn.query_cached("writing lost jobs", store::END_SESSION, &[&pid])?;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        match status.as_deref() {
            Some("in progress") => return Ok(false),
            Some("committed") => {
                if let Some(plan) = &lost.sent {
                    // The commit whose answer was lost went through: what it wrote is as sent.
                    let done: IdMap<i64, ()> = plan.ids.iter().map(|i| (*i, ())).collect();
                    log::debug!(
                        "worker {}: the claim's transaction {} committed; its jobs are written",
                        shared.name,
                        lost.xid
                    );
                    self.finish(plan, &done);
                    return Ok(true);
                }
            }
            _ => {}
        }
        // Rolled back: the jobs are `todo`, and the note keeps them from other claims. Each
        // is written as it stands now, and the note cleared, in one transaction.
        let plan = Plan::new(shared, &lost.keys);
        let refused = match write_lost(conn, &plan, &lost.xid)? {
            Ok(done) => {
                self.written_again(lost, &plan, &done);
                return Ok(true);
            }
            Err(e) => e,
        };
        // The database refused the writing (a trigger of the user's, say): every job is
        // written running instead (the completer records each outcome after, isolating a
        // refused one), and if even that is refused, each job on its own; a job whose row
        // cannot be written at all goes back to its queue when the note is cleared.
        log::warn!(
            "worker {}: writing the jobs of the lost claim transaction {} was refused ({refused}); writing them running",
            shared.name,
            lost.xid
        );
        let running = plan.rebuilt(
            |w| {
                if matches!(w, Write::Succeeded | Write::Delete) {
                    Write::Running
                } else {
                    w
                }
            },
            None,
        );
        if let Ok(done) = write_lost(conn, &running, &lost.xid)? {
            self.written_again(lost, &running, &done);
            return Ok(true);
        }
        let mut done: IdMap<i64, ()> = IdMap::default();
        for i in 0..running.keys.len() {
            let one = running.rebuilt(|w| w, Some(i));
            if one.ids.is_empty() {
                continue;
            }
            let params = one.params(&lost.xid);
            match conn.query_cached("writing lost jobs", store::LOCKED_SETTLE, &params) {
                Ok(rows) => done.extend(rows.iter().map(|r| (r.get::<_, i64>(0), ()))),
                Err(e) if e.sqlstate().is_some() && !conn.is_broken() => log::error!(
                    "worker {}: job {} of the lost claim transaction {} could not be written ({e}); it goes back to its queue",
                    shared.name,
                    one.keys[0].id,
                    lost.xid
                ),
                Err(e) => return Err(e),
            }
        }
        let worker = running.worker;
        conn.query_cached(
            "writing lost jobs",
            store::CLAIM_UNNOTE,
            &[&worker, &lost.xid],
        )?;
        self.written_again(lost, &running, &done);
        Ok(true)
    }

    /// A lost transaction's jobs were written again (`done`, of `plan`).
    pub(super) fn written_again(&mut self, lost: &Lost, plan: &Plan, done: &IdMap<i64, ()>) {
        let shared = self.shared;
        shared.stats.lost.fetch_add(1, Ordering::Relaxed);
        log::info!(
            "worker {}: the claim's transaction {} was lost; {} of its {} jobs written again",
            shared.name,
            lost.xid,
            done.len(),
            plan.ids.len()
        );
        self.finish(plan, done);
    }
}
