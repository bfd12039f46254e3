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
