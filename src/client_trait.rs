//! [`DeferClient`]: where a job can be deferred inside the caller's own transaction or session.
//!
//! `postgres::GenericClient` is sealed upstream, so postpone's own connection types cannot
//! implement it. This trait is implemented for every `GenericClient` (a `postgres::Client`,
//! a `postgres::Transaction`) and for postpone's [`Connection`], [`Transaction`] and
//! [`PooledConnection`], so that [`defer_in`](crate::JobBuilder::defer_in) and
//! [`defer_batch_in`](crate::App::defer_batch_in) take any of them.

use postgres::types::ToSql;
use postgres::{GenericClient, Row};

use crate::conn::{Connection, Transaction};
use crate::error::{Error, Result};
use crate::pooled::PooledConnection;

mod sealed {
    pub trait Sealed {}
}

/// A client a job can be inserted with, in its own transaction or session: any
/// `postgres::GenericClient`, or a postpone [`Connection`], [`Transaction`] or
/// [`PooledConnection`]. Sealed: it cannot be implemented outside postpone.
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// let mut conn = app.connection()?;
/// let mut tx = conn.transaction()?;
/// tx.execute("CREATE TEMP TABLE orders (id int)", &[])?;
/// app.job("ship_order").defer_in(&mut *tx, &serde_json::json!({"order": 1}))?;
/// tx.commit()?;
/// # Ok(())
/// # }
/// ```
pub trait DeferClient: sealed::Sealed {
    /// Runs `sql` and returns its rows (`what` names the operation in errors).
    #[doc(hidden)]
    fn run_query(
        &mut self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>>;
}

impl<C: GenericClient> sealed::Sealed for C {}

impl<C: GenericClient> DeferClient for C {
    fn run_query(
        &mut self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        self.query(sql, params)
            .map_err(|e| Error::from_client(what, e))
    }
}

impl sealed::Sealed for Connection {}

impl DeferClient for Connection {
    fn run_query(
        &mut self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        self.query(sql, params)
            .map_err(|e| e.context(format_args!("{what}")))
    }
}

impl sealed::Sealed for Transaction<'_> {}

impl DeferClient for Transaction<'_> {
    fn run_query(
        &mut self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        (**self).run_query(what, sql, params)
    }
}

impl sealed::Sealed for PooledConnection {}

impl DeferClient for PooledConnection {
    fn run_query(
        &mut self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        (**self).run_query(what, sql, params)
    }
}

/// The former name of [`DeferClient`], kept so that code naming it still compiles: every
/// [`DeferClient`] is one.
#[deprecated(note = "renamed `DeferClient` (the worker's executor threads are unrelated)")]
pub trait Executor: DeferClient {}

#[allow(deprecated)]
impl<C: DeferClient + ?Sized> Executor for C {}
