//! Two statements in one round-trip: each its own transaction (a defer and the wake-up that
//! follows it), or both in one (outcomes recorded with the next claim).

use std::task::Poll;

use super::*;

/// Runs `a` and `b` together, polling `a` first each time: requests they send on one
/// connection go out in that order, pipelined in one round-trip.
async fn both<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        if ra.is_some() && rb.is_some() {
            Poll::Ready((ra.take().unwrap(), rb.take().unwrap()))
        } else {
            Poll::Pending
        }
    })
    .await
}

impl Connection {
    /// Runs `sql`, which commits on its own (the connection is outside a transaction and not
    /// behind a transaction pooler: the caller checks), and `after` pipelined behind it in
    /// the same round-trip as a transaction of its own; returns `sql`'s rows. `after` is a
    /// hint (a wake-up): its failure is logged, not returned. Used so that a deferred job's
    /// notification is sent by a transaction that writes nothing, hence does not hold the
    /// server's notification lock through a WAL flush.
    pub(crate) fn query_cached_then(
        &mut self,
        what: &str,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        after: &'static str,
        after_params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        // A session whose prepared statements were dropped (26000) gets them prepared afresh
        // once, as in `with_cached`.
        for round in 0..2 {
            let first = self.cached(what, sql)?;
            let second = self.cached(what, after)?;
            let t = self.inner.io_timeout;
            let client = &self.client;
            let (a, b) = self.inner.run(what, t, async {
                Ok(both(
                    client.query(&first, params),
                    client.query(&second, after_params),
                )
                .await)
            })?;
            if let Err(e) = &b {
                log::debug!(
                    "{what} on {}: the wake-up after it failed: {e}",
                    self.inner.peer
                );
            }
            match a {
                Ok(rows) => return Ok(rows),
                Err(e) => {
                    let e = self.inner.classify(what, e);
                    if round == 0 && e.sqlstate() == Some("26000") {
                        self.statements.clear();
                        self.client.clear_type_cache();
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        Err(Error::new(
            ErrorKind::Other,
            format!("{what}: the session's prepared statements kept disappearing"),
        ))
    }
}

/// What [`Connection::query_cached_pair_in_transaction`] got back: each statement's own
/// result. The transaction committed only when both are `Ok`.
pub(crate) struct PairInTransaction {
    pub(crate) first: Result<Vec<Row>>,
    pub(crate) second: Result<Vec<Row>>,
}

impl Connection {
    /// Runs `first` then `second` in one transaction of their own, opened by `begin` (`BEGIN`
    /// and any `SET LOCAL`, one simple query) and closed by `COMMIT`, in one round-trip (the connection is outside a transaction and not behind a
    /// transaction pooler: the caller checks). A statement that fails rolls the transaction
    /// back: the other then reports that failure too (the server's "current transaction is
    /// aborted", or the first statement's error). `Err` is returned only when the link
    /// itself failed (no answer, a deadline): whether the transaction committed is then
    /// unknown.
    pub(crate) fn query_cached_pair_in_transaction(
        &mut self,
        what: &str,
        begin: &'static str,
        first: (&'static str, &[&(dyn ToSql + Sync)]),
        second: (&'static str, &[&(dyn ToSql + Sync)]),
    ) -> Result<PairInTransaction> {
        debug_assert!(!self.inner.in_tx && !self.through_transaction_pooler());
        let s1 = self.cached(what, first.0)?;
        let s2 = self.cached(what, second.0)?;
        let t = self.inner.io_timeout;
        let client = &self.client;
        let (begin, a, b, commit) = self.inner.run(what, t, async {
            // Nested, the polls keep their order: BEGIN, first, second, COMMIT.
            let ((r0, r1), (r2, r3)) = both(
                both(client.batch_execute(begin), client.query(&s1, first.1)),
                both(client.query(&s2, second.1), client.batch_execute("COMMIT")),
            )
            .await;
            Ok((r0, r1, r2, r3))
        })?;
        let mut first = a.map_err(|e| self.inner.classify(what, e));
        let mut second = b.map_err(|e| self.inner.classify(what, e));
        // A statement dropped by task code (DEALLOCATE) fails the first use: forget them all.
        if [&first, &second]
            .iter()
            .any(|r| matches!(r, Err(e) if e.sqlstate() == Some("26000")))
        {
            self.statements.clear();
            self.client.clear_type_cache();
        }
        for (step, r) in [("BEGIN", begin), ("COMMIT", commit)] {
            if let Err(e) = r {
                let e = self.inner.classify(what, e);
                log::debug!("{what} on {}: {step} failed: {e}", self.inner.peer);
                // Nothing committed: both statements report the failure.
                if first.is_ok() {
                    first = Err(Error::new(e.kind(), format!("{what}: {step}: {e}")));
                }
                if second.is_ok() {
                    second = Err(Error::new(e.kind(), format!("{what}: {step}: {e}")));
                }
                if self.client.is_closed() {
                    return Err(e);
                }
            }
        }
        Ok(PairInTransaction { first, second })
    }
}

/// What [`Connection::query_cached_cycle`] got back: the settling statement's result and
/// the claim's, each when it was sent.
pub(crate) struct Cycle {
    /// The statement run in the open transaction before its `COMMIT`. `Ok` means it ran;
    /// the transaction committed unless the `COMMIT` failed (then `commit` says so).
    pub(crate) settled: Option<Result<Vec<Row>>>,
    /// The `COMMIT` of the open transaction failed: it did not commit.
    pub(crate) commit_failed: bool,
    /// The statement run in the new transaction, which stays open when it succeeded.
    pub(crate) claimed: Option<Result<Vec<Row>>>,
}

impl Connection {
    /// One round-trip that ends the open transaction (after `settle`, when given, runs in
    /// it) and, with `claim`, opens a new one (`begin`: `BEGIN` and any `SET LOCAL`, one
    /// simple query) that runs it and stays open; not through a
    /// transaction pooler (the caller checks). A `claim` that fails leaves no transaction
    /// open: it is rolled back here (a second round-trip, only then). `Err` is returned only
    /// when the link itself failed: what committed is then unknown, and the connection must
    /// be dropped.
    pub(crate) fn query_cached_cycle(
        &mut self,
        what: &str,
        begin: &'static str,
        settle: Option<(&'static str, &[&(dyn ToSql + Sync)])>,
        claim: Option<(&'static str, &[&(dyn ToSql + Sync)])>,
    ) -> Result<Cycle> {
        debug_assert!(!self.through_transaction_pooler());
        let s1 = match settle {
            Some((sql, _)) => Some(self.cached(what, sql)?),
            None => None,
        };
        let s2 = match claim {
            Some((sql, _)) => Some(self.cached(what, sql)?),
            None => None,
        };
        let in_tx = self.inner.in_tx;
        let t = self.inner.io_timeout;
        let client = &self.client;
        let (settled, commit, begin, claimed) = self.inner.run(what, t, async {
            let settle_f = async {
                match (&s1, settle) {
                    (Some(st), Some((_, p))) => Some(client.query(st, p).await),
                    _ => None,
                }
            };
            let commit_f = async {
                if in_tx {
                    Some(client.batch_execute("COMMIT").await)
                } else {
                    None
                }
            };
            let begin_f = async {
                if s2.is_some() {
                    Some(client.batch_execute(begin).await)
                } else {
                    None
                }
            };
            let claim_f = async {
                match (&s2, claim) {
                    (Some(st), Some((_, p))) => Some(client.query(st, p).await),
                    _ => None,
                }
            };
            // Nested, the polls keep their order: the statement, COMMIT, BEGIN, the claim.
            let ((a, b), (c, d)) = both(both(settle_f, commit_f), both(begin_f, claim_f)).await;
            Ok((a, b, c, d))
        })?;
        self.inner.in_tx = false;
        let settled = settled.map(|r| r.map_err(|e| self.inner.classify(what, e)));
        let mut commit_failed = false;
        if let Some(Err(e)) = commit {
            let e = self.inner.classify(what, e);
            log::debug!("{what} on {}: COMMIT failed: {e}", self.inner.peer);
            commit_failed = true;
            if self.client.is_closed() {
                return Err(e);
            }
        }
        let mut claimed = claimed.map(|r| r.map_err(|e| self.inner.classify(what, e)));
        match begin {
            Some(Err(e)) => {
                let e = self.inner.classify(what, e);
                if self.client.is_closed() {
                    return Err(e);
                }
                claimed = Some(Err(Error::new(e.kind(), format!("{what}: BEGIN: {e}"))));
                // BEGIN failed: whatever ran after it ran outside a transaction block.
            }
            Some(Ok(())) => self.inner.in_tx = true,
            None => {}
        }
        if [&settled, &claimed]
            .iter()
            .any(|r| matches!(r, Some(Err(e)) if e.sqlstate() == Some("26000")))
        {
            self.statements.clear();
            self.client.clear_type_cache();
        }
        if self.inner.in_tx && matches!(claimed, Some(Err(_))) {
            // The new transaction is aborted: end it.
            self.rollback()?;
        }
        Ok(Cycle {
            settled,
            commit_failed,
            claimed,
        })
    }
}
