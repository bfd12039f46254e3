//! A job read for display, whatever it holds: [`Admin::job_preview`] cuts its arguments,
//! output and progress to a budget in the database (only the cut crosses the wire), keeps
//! its last attempts' errors, each cut to [`MAX_ERROR_BYTES`](crate::limits::MAX_ERROR_BYTES),
//! its first [`MAX_TAGS`](crate::MAX_TAGS) tags, each cut to
//! [`MAX_NAME_BYTES`](crate::limits::MAX_NAME_BYTES) characters (more can only be written by
//! SQL of one's own), and says how large each value is whole. [`Admin::write_value`] writes one of them whole,
//! a chunk at a time, so a program's memory never holds more than a chunk of it.
//!
//! A chunked read checks that the value did not change between chunks (its md5), so a
//! download never splices two versions of a progress report; a change ends it with an
//! error instead. Each of its round-trips makes the server turn the whole value into text
//! again: [`ValueCursor`] reads it once instead, in one transaction holding a connection
//! (the dashboard's downloads use it while a connection can be spared).

use std::io;

use super::{detail_from_row, not_found, Admin, JobDetail};
use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::job::JobId;
use crate::store;

/// Attempts whose errors a preview keeps (the last ones).
const ERRORS_KEPT: i32 = 50;
/// Bytes of a value a [`ValueCursor`] fetches at a time.
pub(crate) const CHUNK: i32 = 256 * 1024;

/// The start of a JSON value's text, and the size of the whole.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JsonPrefix {
    /// The first characters of the value's JSON text (the whole text when it fits).
    pub text: String,
    /// The size of the whole text, in bytes.
    pub bytes: u64,
}

impl JsonPrefix {
    /// True when [`text`](Self::text) is the whole value.
    pub fn is_whole(&self) -> bool {
        self.text.len() as u64 >= self.bytes
    }
}

/// A job with its large values cut; from [`Admin::job_preview`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct JobPreview {
    /// The job and its history, with `args`, `output` and `progress` left out (`null`,
    /// `None`, `None`: they are the fields below), its last 50 attempts' errors each cut
    /// to 16 KiB, its first 64 tags ([`MAX_TAGS`](crate::MAX_TAGS)) each cut to 255
    /// characters, and its metadata left out (`None`) when it is larger than the budget.
    pub detail: JobDetail,
    /// Its arguments.
    pub args: JsonPrefix,
    /// Its output, if any.
    pub output: Option<JsonPrefix>,
    /// Its latest progress, if any.
    pub progress: Option<JsonPrefix>,
    /// How many errors it has recorded (the detail keeps the last 50).
    pub errors_total: u64,
    /// How many tags it has (the detail keeps the first 64).
    pub tags_total: u64,
}

/// A JSON value of a job that may be large, for [`Admin::write_value`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobValue {
    /// Its arguments.
    Args,
    /// The output its task recorded.
    Output,
    /// The latest progress its task recorded.
    Progress,
}

impl JobValue {
    fn column(self) -> &'static str {
        match self {
            JobValue::Args => "j.args",
            JobValue::Output => "j.output",
            JobValue::Progress => "j.progress",
        }
    }
}

impl Admin {
    /// Job `id` with its arguments, output and progress cut to their first `max_chars`
    /// characters (see [`JobPreview`]): what a screen shows, at a cost that does not grow
    /// with what the job holds. [`NotFound`](ErrorKind::NotFound) if there is no such job.
    pub fn job_preview(&self, id: JobId, max_chars: usize) -> Result<JobPreview> {
        let max = i32::try_from(max_chars).unwrap_or(i32::MAX);
        let mut conn = self.conn()?;
        let rows = conn.query_named(
            "reading a job",
            store::JOB_PREVIEW,
            &[
                &id.0,
                &max,
                &ERRORS_KEPT,
                &(crate::limits::MAX_NAME_BYTES as i32),
                &(crate::MAX_TAGS as i32),
            ],
        )?;
        let row = rows.first().ok_or_else(|| not_found(id))?;
        let mut detail = detail_from_row(row)?;
        detail.batch_id = row.get::<_, Option<i64>>(35).map(crate::BatchId);
        if row.get::<_, bool>(34) {
            super::read_dependencies(&mut conn, &mut detail)?;
        }
        let prefix = |i: usize| -> Option<JsonPrefix> {
            let text: Option<String> = row.get(i);
            let bytes: Option<i32> = row.get(i + 1);
            Some(JsonPrefix {
                text: text?,
                bytes: bytes.unwrap_or(0).max(0) as u64,
            })
        };
        Ok(JobPreview {
            detail,
            args: prefix(27).unwrap_or(JsonPrefix {
                text: "null".to_owned(),
                bytes: 4,
            }),
            output: prefix(29),
            progress: prefix(31),
            errors_total: row.get::<_, i32>(33).max(0) as u64,
            tags_total: row.get::<_, i32>("tags_total").max(0) as u64,
        })
    }

    /// Writes one value of job `id` to `out` as the database holds it (its JSON text),
    /// 256 KiB per round-trip, and returns how many bytes were written: `Ok(0)` when the
    /// job has no such value (no output yet). [`NotFound`](ErrorKind::NotFound) if there is
    /// no such job. The value is read in one repeatable-read transaction through a cursor,
    /// so what is written is one version of it even while the job records progress, and
    /// the server turns it into text once; the connection is held until the end.
    ///
    /// ```no_run
    /// # fn main() -> postpone::Result<()> {
    /// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
    /// let mut file = std::fs::File::create("args.json").unwrap();
    /// app.admin().write_value(postpone::JobId(7), postpone::JobValue::Args, &mut file)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn write_value(&self, id: JobId, which: JobValue, out: &mut dyn io::Write) -> Result<u64> {
        let Some(mut cursor) = ValueCursor::open(self.conn()?, id, which)? else {
            return Ok(0);
        };
        let mut written = 0u64;
        while let Some(chunk) = cursor.next()? {
            out.write_all(&chunk)
                .map_err(|e| Error::with_source(ErrorKind::Other, "writing a job's value", e))?;
            written += chunk.len() as u64;
        }
        Ok(written)
    }
}

/// Reads one value of a job a chunk at a time, each chunk its own round-trip.
#[derive(Debug)]
pub(crate) struct ValueReader {
    id: JobId,
    which: JobValue,
    /// The size and md5 of the value, once the first chunk has been read.
    seen: Option<(i64, String)>,
    offset: i64,
}

// The dashboard's download reads through it; without the `web` feature only part is used.
#[cfg_attr(not(feature = "web"), allow(dead_code))]
impl ValueReader {
    pub(crate) fn new(id: JobId, which: JobValue) -> ValueReader {
        ValueReader {
            id,
            which,
            seen: None,
            offset: 0,
        }
    }

    /// The size of the whole value in bytes, once known (after the first chunk; `None`
    /// also for a job without this value).
    pub(crate) fn len(&self) -> Option<u64> {
        self.seen.as_ref().map(|(n, _)| (*n).max(0) as u64)
    }

    /// The first read: the size and the first chunk. `Ok(None)` when the job has no such
    /// value (no output yet, say); `NotFound` when there is no such job.
    pub(crate) fn start(&mut self, conn: &mut Connection) -> Result<Option<Vec<u8>>> {
        self.next(conn)
    }

    /// The next chunk; `Ok(None)` at the end. A value that changed since the first chunk
    /// is an `InvalidState` error.
    pub(crate) fn next(&mut self, conn: &mut Connection) -> Result<Option<Vec<u8>>> {
        if let Some((len, _)) = &self.seen {
            if self.offset >= *len {
                return Ok(None);
            }
        }
        let sql = format!(
            "SELECT octet_length(t.v), md5(t.v),
                    substring(convert_to(t.v, 'UTF8') FROM ($2::bigint + 1)::int FOR $3::int)
               FROM postpone_jobs j CROSS JOIN LATERAL (SELECT {}::text AS v) t
              WHERE j.id = $1",
            self.which.column()
        );
        let rows = conn.query_named(
            "reading a job's value",
            &sql,
            &[&self.id.0, &self.offset, &CHUNK],
        )?;
        let Some(row) = rows.first() else {
            return Err(not_found(self.id));
        };
        let len: Option<i32> = row.get(0);
        let (Some(len), Some(md5)) = (len, row.get::<_, Option<String>>(1)) else {
            return Ok(None);
        };
        match &self.seen {
            None => self.seen = Some((i64::from(len), md5)),
            Some((_, was)) if *was != md5 => {
                return Err(Error::new(
                    ErrorKind::InvalidState,
                    format!(
                        "reading job {}'s value: it changed while it was read",
                        self.id
                    ),
                ))
            }
            Some(_) => {}
        }
        let chunk: Vec<u8> = row.get(2);
        self.offset += chunk.len() as i64;
        if chunk.is_empty() {
            return Ok(None);
        }
        Ok(Some(chunk))
    }
}

/// Reads one value of a job through a cursor, in one read-only repeatable-read transaction:
/// the server turns the value into text once and keeps it (as bytes) for the cursor, and
/// each chunk is a `FETCH`. The snapshot makes the chunks one version of the value. The
/// connection is held until the end: dropped before it, the connection is in a transaction,
/// so the pool discards it (its session, transaction and cursor end with it).
pub(crate) struct ValueCursor {
    conn: crate::PooledConnection,
    /// The size of the whole value in bytes.
    len: u64,
    done: bool,
}

impl std::fmt::Debug for ValueCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueCursor")
            .field("len", &self.len)
            .field("done", &self.done)
            .finish()
    }
}

impl ValueCursor {
    /// Opens the cursor over value `which` of job `id`: `Ok(None)` when the job has no such
    /// value; `NotFound` when there is no such job.
    pub(crate) fn open(
        mut conn: crate::PooledConnection,
        id: JobId,
        which: JobValue,
    ) -> Result<Option<ValueCursor>> {
        conn.begin()?;
        conn.batch_execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")?;
        let col = which.column();
        let rows = conn.query_named(
            "reading a job's value",
            &format!("SELECT octet_length({col}::text) FROM postpone_jobs j WHERE j.id = $1"),
            &[&id.0],
        )?;
        let Some(row) = rows.first() else {
            return Err(not_found(id));
        };
        let Some(len) = row.get::<_, Option<i32>>(0) else {
            conn.commit()?;
            return Ok(None);
        };
        // The id is a number and the column one of three names: nothing to quote.
        conn.batch_execute(&format!(
            "DECLARE postpone_value NO SCROLL CURSOR FOR
             WITH t AS MATERIALIZED (
                 SELECT convert_to({col}::text, 'UTF8') AS b FROM postpone_jobs j WHERE j.id = {id})
             SELECT substring(t.b FROM g * {CHUNK} + 1 FOR {CHUNK})
               FROM t, generate_series(0, greatest(octet_length(t.b) - 1, 0) / {CHUNK}) AS g
              ORDER BY g",
            id = id.0
        ))?;
        Ok(Some(ValueCursor {
            conn,
            len: len.max(0) as u64,
            done: false,
        }))
    }

    /// The size of the whole value in bytes.
    #[cfg_attr(not(feature = "web"), allow(dead_code))]
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The next chunk; `Ok(None)` at the end, when the transaction is committed and the
    /// connection can go back to its pool.
    pub(crate) fn next(&mut self) -> Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        let rows =
            self.conn
                .query_named("reading a job's value", "FETCH 1 FROM postpone_value", &[])?;
        if let Some(row) = rows.first() {
            let chunk: Vec<u8> = row.get(0);
            if !chunk.is_empty() {
                return Ok(Some(chunk));
            }
        }
        self.done = true;
        self.conn.commit()?;
        Ok(None)
    }
}
