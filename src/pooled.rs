//! [`PooledConnection`]: a connection checked out of an App's pool.

use std::ops::{Deref, DerefMut};

use crate::conn::pool::Pooled;
use crate::conn::Connection;

/// A connection checked out of the App's pool; derefs to [`Connection`].
pub struct PooledConnection(Pooled);

impl PooledConnection {
    pub(crate) fn new(conn: Pooled) -> PooledConnection {
        PooledConnection(conn)
    }
}

impl Deref for PooledConnection {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.0
    }
}

impl DerefMut for PooledConnection {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.0
    }
}

impl Drop for PooledConnection {
    fn drop(&mut self) {
        self.0.lend(0);
    }
}

impl std::fmt::Debug for PooledConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}
