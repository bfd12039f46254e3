//! One claiming connection's round-trip: the old transaction written and committed, a
//! lock-only claim in a new one, and what is kept of it; the writing of a lost transaction.

use std::time::Instant;

use super::super::claim::{parse_claim, Keyed};
use super::super::idhash::IdMap;
use super::super::ledger::AttemptKey;
use super::super::Shared;
use super::plan::Plan;
use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::store;

/// A transaction open on one of the claiming connections.
pub(super) struct Open {
    /// Its id (NULL until it locked a row).
    pub(super) xid: Option<String>,
    /// The server process of the session.
    pub(super) pid: Option<i32>,
    pub(super) keys: Vec<AttemptKey>,
    pub(super) begun: Instant,
}

/// A transaction whose jobs the worker must still write itself: it was rolled back, or its
/// commit's fate is unknown.
pub(super) struct Lost {
    pub(super) xid: String,
    pub(super) pid: Option<i32>,
    pub(super) keys: Vec<AttemptKey>,
    /// The plan sent with the commit whose fate is unknown (`None`: it surely did not
    /// commit).
    pub(super) sent: Option<Plan>,
}

/// What one claiming connection asks for.
pub(super) struct Ask<'s> {
    pub(super) id: i64,
    pub(super) limit: i32,
    pub(super) start: i32,
    pub(super) bytes: i64,
    pub(super) alone: bool,
    pub(super) queues: &'s Option<Vec<String>>,
    pub(super) task_names: &'s Option<Vec<String>>,
}

/// One round-trip on one claiming connection: `plan` (of the open transaction `xid`)
/// written and committed, then, with `ask`, a lock-only claim in a new transaction.
pub(super) fn cycle_once(
    conn: &mut Connection,
    plan: Option<&Plan>,
    xid: &String,
    ask: Option<&Ask<'_>>,
) -> Result<crate::conn::Cycle> {
    let lock_only = true;
    let settle = plan.map(|p| p.params(xid));
    let claim = ask.map(|a| -> [&(dyn postgres::types::ToSql + Sync); 8] {
        [
            &a.id,
            &a.limit,
            a.queues,
            a.task_names,
            &a.start,
            &a.bytes,
            &a.alone,
            &lock_only,
        ]
    });
    conn.query_cached_cycle(
        if ask.is_some() {
            "writing locked jobs and claiming jobs"
        } else {
            "writing locked jobs"
        },
        store::LOCKED_BEGIN,
        settle.as_ref().map(|p| (store::LOCKED_SETTLE, &p[..])),
        claim.as_ref().map(|p| (store::JOB_CLAIM, &p[..])),
    )
}

/// What a claiming connection's round-trip brought, once its old transaction is dealt with.
pub(super) struct Got {
    pub(super) keyed: Keyed,
    pub(super) cut: bool,
    pub(super) xid: Option<String>,
    pub(super) pid: Option<i32>,
}

/// What one claiming connection's round-trip brought.
pub(super) struct Round {
    /// The old transaction's writing (see [`crate::conn::Cycle`]).
    pub(super) settled: Option<Result<Vec<postgres::Row>>>,
    pub(super) commit_failed: bool,
    /// The claim's jobs; when none is kept only locked, already committed.
    pub(super) got: Result<Got>,
    /// The new transaction (its id and session) when it locked jobs and could not be
    /// committed: none of its jobs is handed out, but a session the worker lost may still
    /// hold them (see [`Locked::recover`]).
    pub(super) abandoned: Option<(String, Option<i32>)>,
}

/// One claiming connection's round-trip (see [`cycle_once`]), its reply parsed, and its new
/// transaction committed at once unless its claim keeps jobs only locked (and nothing else:
/// a claim that took jobs held beside them writes those held too, and commits). `Err`: the
/// link failed.
pub(super) fn slot_round(
    shared: &Shared,
    conn: &mut Connection,
    plan: Option<&Plan>,
    xid: &String,
    ask: &Ask<'_>,
    sent: Instant,
) -> Result<Round> {
    let cycle = cycle_once(conn, plan, xid, Some(ask))?;
    let mut abandoned = None;
    let got = parse_got(shared, cycle.claimed, sent).and_then(|mut g| {
        let locked: Vec<AttemptKey> = g
            .keyed
            .iter()
            .filter(|(_, c)| c.locked)
            .map(|(_, c)| c.key())
            .collect();
        if locked.is_empty() {
            conn.commit()?;
            g.xid = None;
        } else if locked.len() < g.keyed.len() {
            let Some(x) = g.xid.take() else {
                let _ = conn.rollback();
                return Err(no_xid());
            };
            if let Err(e) = commit_held(conn, &x, &locked) {
                abandoned = Some((x, g.pid));
                return Err(e);
            }
            for (_, c) in g.keyed.iter_mut() {
                c.locked = false;
            }
        } else if g.xid.is_none() {
            let _ = conn.rollback();
            return Err(no_xid());
        }
        Ok(g)
    });
    Ok(Round {
        settled: cycle.settled,
        commit_failed: cycle.commit_failed,
        got,
        abandoned,
    })
}

pub(super) fn no_xid() -> Error {
    Error::new(
        ErrorKind::Other,
        "claiming jobs: the claim locked jobs but returned no transaction id",
    )
}

/// A reply's jobs parsed, with its transaction's id and session.
pub(super) fn parse_got(
    shared: &Shared,
    claimed: Option<Result<Vec<postgres::Row>>>,
    sent: Instant,
) -> Result<Got> {
    let mut rows = match claimed {
        Some(Ok(rows)) => rows,
        Some(Err(e)) => return Err(e),
        None => return Err(Error::new(ErrorKind::Other, "claiming jobs: not sent")),
    };
    let xid = rows.first().and_then(|r| r.get::<_, Option<String>>(17));
    let pid = rows.first().and_then(|r| r.get::<_, Option<i32>>(18));
    let (keyed, cut) = parse_claim(shared, &mut rows, sent);
    Ok(Got {
        keyed,
        cut,
        xid,
        pid,
    })
}

/// The jobs a claim keeps only locked on `conn` (all of its jobs, when any): kept in its
/// open transaction when `noted` (returned as the connection's open transaction), else
/// written held and committed now. A claim that kept nothing was committed already.
pub(super) fn keep_or_hold(
    shared: &Shared,
    conn: &mut Connection,
    g: Got,
    noted: bool,
) -> Result<(Keyed, bool, Option<Open>)> {
    let Some(xid) = g.xid.filter(|_| g.keyed.iter().any(|(_, c)| c.locked)) else {
        return Ok((g.keyed, g.cut, None));
    };
    let locked: Vec<AttemptKey> = g.keyed.iter().map(|(_, c)| c.key()).collect();
    if noted {
        shared.absorb.add(locked.iter().copied());
        let open = Open {
            xid: Some(xid),
            pid: g.pid,
            keys: locked,
            begun: Instant::now(),
        };
        return Ok((g.keyed, g.cut, Some(open)));
    }
    commit_held(conn, &xid, &locked)?;
    let keyed = g
        .keyed
        .into_iter()
        .map(|(t, mut c)| {
            c.locked = false;
            (t, c)
        })
        .collect();
    Ok((keyed, g.cut, None))
}

/// Writes every locked job of the claim just made held, and commits: they are then claimed
/// as without this mode. Fails when the write does not commit (the jobs are not handed out:
/// they go back to the queue with the transaction).
pub(super) fn commit_held(conn: &mut Connection, xid: &String, keys: &[AttemptKey]) -> Result<()> {
    let plan = Plan::all_held(keys);
    let cycle = cycle_once(conn, Some(&plan), xid, None)?;
    match cycle.settled {
        Some(Ok(rows)) if !cycle.commit_failed && rows.len() == keys.len() => Ok(()),
        Some(Err(e)) => Err(e),
        _ => Err(Error::new(
            ErrorKind::Other,
            "writing claimed jobs held: not every job was written; none is handed out",
        )),
    }
}

/// Writes `plan` for the lost transaction `xid` and takes it off the worker's note, in one
/// transaction. `Ok(Err(_))`: the database refused it (nothing written); `Err`: the link.
pub(super) fn write_lost(
    conn: &mut Connection,
    plan: &Plan,
    xid: &String,
) -> Result<Result<IdMap<i64, ()>>> {
    let params = plan.params(xid);
    let worker = plan.worker;
    let pair = conn.query_cached_pair_in_transaction(
        "writing lost jobs",
        "BEGIN",
        (store::LOCKED_SETTLE, &params),
        (store::CLAIM_UNNOTE, &[&worker, xid]),
    )?;
    match (pair.first, pair.second) {
        (Ok(rows), Ok(_)) => Ok(Ok(rows.iter().map(|r| (r.get::<_, i64>(0), ())).collect())),
        (Err(e), _) | (_, Err(e)) if e.sqlstate().is_some() && !conn.is_broken() => Ok(Err(e)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}
