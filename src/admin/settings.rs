//! Settings of the whole installation, one row of `postpone_settings` (schema version 27):
//! [`Admin::max_args_bytes`] and [`Admin::set_max_args_bytes`].
//!
//! The limit on a job's arguments lives in the database, so that it binds every way a job
//! enters: `defer` and its kin from Rust, `postpone defer`, `postpone_defer(...)` and any
//! `INSERT INTO postpone_jobs` written by hand. The jobs table's insert trigger (one run per
//! statement) measures each new row's arguments as the JSON text stored
//! (`octet_length(args::text)`, what a worker receives), and refuses the statement when one
//! is larger than the limit: SQLSTATE 54000, which the library reports as an
//! [`InvalidInput`](crate::ErrorKind::InvalidInput) error naming the size and the limit.
//! Jobs stored before the limit was lowered are left alone.

use super::Admin;
use crate::error::{Error, Result};
use crate::store;

/// The default limit on a job's arguments: 16 MiB of JSON text. A worker holds at most
/// 64 MiB of arguments of jobs it has claimed and not started (its prefetch budget) beside
/// those of its running jobs, so four of the largest jobs fill a budget. Raise it with
/// [`Admin::set_max_args_bytes`].
pub const DEFAULT_MAX_ARGS_BYTES: u64 = 16 << 20;

/// The highest limit that can be set: 1 GiB less a byte, the most PostgreSQL can hold in one
/// text value (larger arguments could not be measured, nor sent to a worker).
pub const MAX_ARGS_BYTES_CEILING: u64 = (1 << 30) - 1;

impl Admin {
    /// The most bytes of JSON text a job's arguments may weigh in this installation
    /// (`postpone_settings.max_args_bytes`; [`DEFAULT_MAX_ARGS_BYTES`] until set).
    pub fn max_args_bytes(&self) -> Result<u64> {
        let mut conn = self.conn()?;
        let rows = conn.query_named(
            "reading the arguments' size limit",
            store::SETTINGS_MAX_ARGS_BYTES,
            &[],
        )?;
        let n: i64 = rows
            .first()
            .map(|r| r.get(0))
            .unwrap_or(DEFAULT_MAX_ARGS_BYTES as i64);
        Ok(n.max(0) as u64)
    }

    /// Sets the most bytes of JSON text a job's arguments may weigh, for every defer of
    /// every client from the next statement on (Rust, the CLI, `postpone_defer` and plain
    /// SQL alike); jobs already stored are not checked. Returns the previous limit.
    ///
    /// Zero, or more than [`MAX_ARGS_BYTES_CEILING`], is an
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) error. Needs `UPDATE` on
    /// `postpone_settings` (the migrator's role; see docs/roles.md). The SQL equivalent is
    /// `UPDATE postpone_settings SET max_args_bytes = N`.
    pub fn set_max_args_bytes(&self, bytes: u64) -> Result<u64> {
        let what = "setting the arguments' size limit";
        if bytes == 0 || bytes > MAX_ARGS_BYTES_CEILING {
            return Err(Error::invalid(format!(
                "{what}: {bytes} bytes is outside 1 to {MAX_ARGS_BYTES_CEILING} (1 GiB less a byte, the most PostgreSQL holds in one text value)"
            )));
        }
        let mut conn = self.conn()?;
        let n = bytes as i64;
        let rows = conn.query_named(what, store::SETTINGS_SET_MAX_ARGS_BYTES, &[&n])?;
        let old: Option<i64> = rows.first().and_then(|r| r.get(0));
        log::info!("arguments' size limit set to {bytes} bytes by the admin API");
        Ok(old.map_or(DEFAULT_MAX_ARGS_BYTES, |o| o.max(0) as u64))
    }
}
