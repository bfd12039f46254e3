//! The parts of a [`Connection`] that depend on where it goes: whether the server it reached
//! is the kind `target_session_attrs` asks for, and how statements travel through a
//! transaction-pooling PgBouncer (`pooler_mode=transaction`).
//!
//! Through such a pooler a server session lasts one transaction, so nothing named may
//! outlive one: the library's own statements go as unnamed statements (Parse, Bind, Execute
//! and Sync in one message, parameter types given), and the parameter types of each SQL text
//! are learnt once per connection inside a short transaction. A caller's statements outside
//! a transaction are wrapped in one for the same reason, and every transaction that may name
//! a statement starts by clearing what earlier clients left behind (see [`BEGIN_CLEAN`]). `LISTEN` and [`Connection::prepare`] need a session and are
//! refused with an error that says so.
//!
//! Fails like any call of the connection (deadline, closed link, database error); a server of
//! the wrong kind is a `Connect` error naming what it is and what was asked for.

use std::future::Future;
use std::pin::pin;
use std::time::Instant;

use futures_core::Stream;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, SimpleQueryMessage};

use super::super::options::ConnectOptions;
use super::super::session_attrs::{self, ServerState, SessionAttrs};
use super::super::socket::Deadline;
use super::Connection;
use crate::error::{Error, ErrorKind, Result};

/// How a transaction starts through a transaction pooler. A named statement is closed only
/// when the last row that refers to it is dropped, which may be after the transaction ended,
/// so its Close may reach another server session than its Parse did and leave it behind
/// there (where the next client to use that name would fail with 42P05). Every transaction
/// that may name a statement therefore starts by clearing what earlier clients left on the
/// server session it got. A late Close that finds nothing is not an error.
pub(super) const BEGIN_CLEAN: &str = "BEGIN; DEALLOCATE ALL";

/// How many SQL texts' parameter types a connection keeps (more are learnt again).
const MAX_KNOWN_TEXTS: usize = 256;

impl Connection {
    /// Keeps this new connection if its server is what `want` asks for (one pass of `asked`,
    /// the connection string's `target_session_attrs`); asks within what is left of the
    /// connect `deadline` (and never longer than `io_timeout`).
    pub(super) fn settle(
        mut self,
        want: SessionAttrs,
        asked: SessionAttrs,
        deadline: &Deadline,
    ) -> Result<Connection> {
        if !want.needs_check() {
            return Ok(self);
        }
        let left = deadline
            .at
            .saturating_duration_since(Instant::now())
            .min(self.inner.io_timeout);
        let what = format!(
            "connecting to {}: asking the server's state for target_session_attrs",
            self.inner.peer
        );
        let msgs = self
            .inner
            .run(&what, left, self.client.simple_query(ServerState::QUERY))?;
        let state = msgs
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(ServerState::from_texts(
                    r.get(0).unwrap_or_default(),
                    r.get(1).unwrap_or_default(),
                )),
                _ => None,
            })
            .ok_or_else(|| Error::new(ErrorKind::Connect, format!("{what}: no row")))?;
        if want.accepts(state) {
            log::debug!(
                "connected to {} ({}) for target_session_attrs={}",
                self.inner.peer,
                state.describe(),
                asked.as_str()
            );
            return Ok(self);
        }
        Err(Error::new(
            ErrorKind::Connect,
            format!(
                "connecting to {}: the server is a {}, not what target_session_attrs={} asks \
                 for{}",
                self.inner.peer,
                state.describe(),
                asked.as_str(),
                if asked == SessionAttrs::PreferStandby {
                    " first"
                } else {
                    ""
                }
            ),
        ))
    }

    /// Sets the `search_path` of a named namespace on this new connection (nothing for the
    /// default), within what is left of the connect `deadline`. A session keeps it; the App
    /// refuses a named schema through a transaction pooler, where it would not be kept.
    pub(super) fn enter_namespace(
        mut self,
        opts: &ConnectOptions,
        deadline: &Deadline,
    ) -> Result<Connection> {
        let Some(sql) = opts.namespace.session_sql() else {
            return Ok(self);
        };
        let left = deadline
            .at
            .saturating_duration_since(Instant::now())
            .min(self.inner.io_timeout);
        let what = format!(
            "connecting to {}: setting the search_path of the schema",
            self.inner.peer
        );
        let sql = format!("{sql}; SHOW search_path");
        let msgs = self
            .inner
            .run(&what, left, self.client.simple_query(&sql))?;
        let shown = msgs.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        });
        self.inner.search_path =
            Some(shown.ok_or_else(|| Error::new(ErrorKind::Connect, format!("{what}: no row")))?);
        Ok(self)
    }

    /// True when this connection goes through a transaction-pooling PgBouncer.
    pub(crate) fn through_transaction_pooler(&self) -> bool {
        self.unnamed.is_some()
    }

    /// The error for a feature that needs a session, if this connection has none to give.
    pub(super) fn refuse_without_session(&self, what: &str) -> Result<()> {
        if self.through_transaction_pooler() {
            return Err(session_attrs::needs_session(what));
        }
        Ok(())
    }

    /// Runs `fut` (which uses `self.client`) inside BEGIN/COMMIT when a transaction pooler
    /// would otherwise hand its round-trips to different server sessions.
    pub(super) async fn pinned<T>(
        client: &Client,
        wrap: bool,
        fut: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> std::result::Result<T, tokio_postgres::Error> {
        if !wrap {
            return fut.await;
        }
        client.batch_execute(BEGIN_CLEAN).await?;
        match fut.await {
            Ok(v) => {
                client.batch_execute("COMMIT").await?;
                Ok(v)
            }
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK").await;
                Err(e)
            }
        }
    }

    /// Whether a caller's statement must be wrapped by [`pinned`](Self::pinned).
    pub(super) fn needs_pinning(&self) -> bool {
        self.through_transaction_pooler() && !self.inner.in_tx
    }

    /// The parameter types of `sql`, learnt once per connection.
    fn param_types(&mut self, what: &str, sql: &str) -> Result<Vec<Type>> {
        if let Some(types) = self.unnamed.as_ref().and_then(|m| m.get(sql)) {
            return Ok(types.clone());
        }
        let in_tx = self.inner.in_tx;
        let client = &self.client;
        let t = self.inner.io_timeout;
        let types = self.inner.run(what, t, async move {
            // Inside a transaction the pooler keeps one server session, so the named
            // statement that prepare makes is closed (on drop, queued before the ROLLBACK)
            // on the session it was made on.
            if !in_tx {
                client.batch_execute(BEGIN_CLEAN).await?;
            }
            let res = client.prepare(sql).await.map(|s| s.params().to_vec());
            if !in_tx {
                client.batch_execute("ROLLBACK").await?;
            }
            res
        })?;
        if let Some(m) = self.unnamed.as_mut() {
            // SQL built at run time (admin filters) must not grow this without bound.
            if m.len() >= MAX_KNOWN_TEXTS {
                m.clear();
            }
            m.insert(sql.to_owned(), types.clone());
        }
        Ok(types)
    }

    /// Runs `sql` as an unnamed statement and returns its rows.
    pub(super) fn query_unnamed(
        &mut self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let types = self.param_types(what, sql)?;
        let typed: Vec<(&(dyn ToSql + Sync), Type)> = params.iter().copied().zip(types).collect();
        let t = self.inner.io_timeout;
        self.inner
            .run(what, t, self.client.query_typed(sql, &typed))
    }

    /// Runs `sql` as an unnamed statement and returns how many rows it changed.
    pub(super) fn execute_unnamed(
        &mut self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64> {
        let types = self.param_types(what, sql)?;
        let typed: Vec<(&(dyn ToSql + Sync), Type)> = params.iter().copied().zip(types).collect();
        let client = &self.client;
        let t = self.inner.io_timeout;
        self.inner.run(what, t, async move {
            let rows = client
                .query_typed_raw(sql, typed.iter().map(|(p, t)| (*p, t.clone())))
                .await?;
            let mut rows = pin!(rows);
            while let Some(row) = std::future::poll_fn(|cx| rows.as_mut().poll_next(cx)).await {
                row?;
            }
            Ok(rows.rows_affected().unwrap_or(0))
        })
    }
}
