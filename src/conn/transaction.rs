//! [`Transaction`]: a transaction on a [`Connection`] that rolls back unless committed.
//!
//! Owns nothing but a borrow of its connection. States: open -> committed or rolled back
//! (by [`Transaction::rollback`] or by the drop). A rollback on drop runs under the
//! connection's `io_timeout`; if it fails the connection is broken or still inside the
//! transaction, and a pool discards it, so the server ends the session and rolls back.
//! Dropped on a thread with a tokio context, which may be driving an async runtime, it
//! makes no round-trip: it severs the connection (the server rolls back as the session
//! ends), so that no drop waits on the network there.

use std::ops::{Deref, DerefMut};

use super::client::Connection;
use crate::error::Result;

/// A transaction on a [`Connection`], from [`Connection::transaction`]: every statement run
/// through it (it derefs to the connection) belongs to the transaction, which
/// [`commit`](Self::commit) ends for good and which is rolled back if the `Transaction` is
/// dropped first (an early `?` return, a panic). Not nested: one at a time per connection.
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// let mut conn = app.connection()?;
/// let mut tx = conn.transaction()?;
/// tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = $1", &[&1i32])?;
/// tx.execute("UPDATE accounts SET balance = balance + 10 WHERE id = $1", &[&2i32])?;
/// tx.commit()?; // without this line, both updates are rolled back here
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Transaction<'a> {
    conn: &'a mut Connection,
    done: bool,
}

impl Connection {
    /// Starts a transaction (`BEGIN`) that is rolled back unless
    /// [`commit`](Transaction::commit) is called. See [`Transaction`].
    pub fn transaction(&mut self) -> Result<Transaction<'_>> {
        self.begin()?;
        Ok(Transaction {
            conn: self,
            done: false,
        })
    }
}

impl Transaction<'_> {
    /// Commits (`COMMIT`). An error (a deferred constraint, a lost link) means the
    /// transaction may not have committed; a timeout leaves it unknown.
    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        self.conn.commit()
    }

    /// Rolls back now (`ROLLBACK`), with the error if that fails.
    pub fn rollback(mut self) -> Result<()> {
        self.done = true;
        self.conn.rollback()
    }
}

impl Deref for Transaction<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if self.done || self.conn.is_broken() {
            return;
        }
        if super::runtime::in_tokio_context() {
            self.conn.sever();
            return;
        }
        if let Err(e) = self.conn.rollback() {
            log::warn!("rolling back a dropped transaction: {e}");
        }
    }
}
