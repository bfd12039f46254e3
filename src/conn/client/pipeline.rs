//! Two statements in one round-trip, each its own transaction: a defer and the wake-up that
//! follows it.

use std::task::Poll;

use super::*;

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
                let mut fa = std::pin::pin!(client.query(&first, params));
                let mut fb = std::pin::pin!(client.query(&second, after_params));
                let (mut ra, mut rb) = (None, None);
                std::future::poll_fn(|cx| {
                    if ra.is_none() {
                        if let Poll::Ready(v) = fa.as_mut().poll(cx) {
                            ra = Some(v);
                        }
                    }
                    if rb.is_none() {
                        if let Poll::Ready(v) = fb.as_mut().poll(cx) {
                            rb = Some(v);
                        }
                    }
                    match (ra.take(), rb.take()) {
                        (Some(x), Some(y)) => Poll::Ready(Ok((x, y))),
                        (x, y) => {
                            (ra, rb) = (x, y);
                            Poll::Pending
                        }
                    }
                })
                .await
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
            let mut f0 = std::pin::pin!(client.batch_execute(begin));
            let mut f1 = std::pin::pin!(client.query(&s1, first.1));
            let mut f2 = std::pin::pin!(client.query(&s2, second.1));
            let mut f3 = std::pin::pin!(client.batch_execute("COMMIT"));
            let (mut r0, mut r1, mut r2, mut r3) = (None, None, None, None);
            std::future::poll_fn(|cx| {
                // Polled in order: the requests go out in this order, pipelined.
                if r0.is_none() {
                    if let Poll::Ready(v) = f0.as_mut().poll(cx) {
                        r0 = Some(v);
                    }
                }
                if r1.is_none() {
                    if let Poll::Ready(v) = f1.as_mut().poll(cx) {
                        r1 = Some(v);
                    }
                }
                if r2.is_none() {
                    if let Poll::Ready(v) = f2.as_mut().poll(cx) {
                        r2 = Some(v);
                    }
                }
                if r3.is_none() {
                    if let Poll::Ready(v) = f3.as_mut().poll(cx) {
                        r3 = Some(v);
                    }
                }
                if r0.is_some() && r1.is_some() && r2.is_some() && r3.is_some() {
                    Poll::Ready(Ok((
                        r0.take().unwrap(),
                        r1.take().unwrap(),
                        r2.take().unwrap(),
                        r3.take().unwrap(),
                    )))
                } else {
                    Poll::Pending
                }
            })
            .await
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
