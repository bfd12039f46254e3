//! Waiting for a job's result across processes: [`App::wait`](crate::App::wait) and the
//! [`JobResult`] it returns.
//!
//! A waiter owns one connection of its own (a LISTEN would leak into the pool), listens on
//! the `postpone_done` channel (migration 4 sends the ids of jobs that reach a final status;
//! since migration 10, only of the jobs registered in `postpone_waiters`, as a waiter does),
//! then reads the job's row. While the job is not finished it waits for a notification
//! naming its id (or `*`, for a statement that finished too many jobs to list), at most a
//! poll interval, and reads the row again: the row is the truth, a notification only makes
//! the waiter look sooner, and a lost one costs at most a poll interval.
//!
//! How it fails: the waits between reads and the reads themselves each last at most half the
//! App's `io_timeout`, so a link that goes half-open during the wait is an error within
//! `io_timeout`, never a hang. A job
//! still unfinished at the deadline is an error of kind `Timeout` that names its status; a
//! job that does not exist (or was deleted when it finished, by a worker with
//! `delete_finished`) one of kind `NotFound`.

use std::time::{Duration, Instant, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::conn::Connection;
use crate::error::{fmt_duration, Error, ErrorKind, Result};
use crate::store;
use crate::types::{JobId, JobStatus, RawJson};

/// Longest wait between two reads of the row when no notification comes.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// A job's status with what its task recorded; from [`App::wait`](crate::App::wait) and
/// [`App::job_result`](crate::App::job_result).
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/app")?;
/// use std::time::Duration;
///
/// #[derive(serde::Deserialize)]
/// struct Thumbnail { url: String }
///
/// let id = app.defer("thumbnail", &serde_json::json!({"image": 7}))?;
/// let result = app.wait(id, Duration::from_secs(30))?; // a Timeout error names the status
/// if let Some(error) = result.failure() {
///     return Err(format!("job {id} ended {}: {error}", result.status).into());
/// }
/// let thumb: Thumbnail = result.output_as()?; // what the task gave `job.set_output`
/// println!("{}", thumb.url);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct JobResult {
    /// The job.
    pub id: JobId,
    /// Its status (final, when it comes from `wait`).
    pub status: JobStatus,
    /// The output its task recorded with its success ([`Job::set_output`](crate::Job::set_output)).
    pub output: Option<serde_json::Value>,
    /// The latest progress its task recorded ([`Job::set_progress`](crate::Job::set_progress)).
    pub progress: Option<serde_json::Value>,
    /// When that progress was recorded.
    #[serde(skip)]
    pub progress_at: Option<SystemTime>,
    /// The error of its latest failed attempt, or the reason of a cancel or abort; `None`
    /// when no attempt failed. It is kept whatever the status: a job that succeeded on its
    /// second attempt has the first attempt's error here, so read it together with
    /// [`status`](Self::status) (or [`failure`](Self::failure), which does).
    pub last_error: Option<String>,
    /// The same value as [`last_error`](Self::last_error), under its first name, which read
    /// as the error of the job even when the job had succeeded. Deprecated: kept, with the
    /// same value, for one release (0.2.0), and removed in the release after it.
    #[deprecated(
        since = "0.2.0",
        note = "set on succeeded jobs too (an earlier attempt's error): use `last_error`, or `failure()` for the error of a job that did not succeed"
    )]
    pub error: Option<String>,
}

impl JobResult {
    /// True when the job succeeded.
    pub fn succeeded(&self) -> bool {
        self.status == JobStatus::Succeeded
    }

    /// Why the job did not succeed: [`last_error`](Self::last_error) when its status is
    /// failed, cancelled or aborted, `None` when it succeeded or is not finished.
    ///
    /// ```
    /// # fn show(r: &postpone::JobResult) {
    /// match r.failure() {
    ///     Some(why) => println!("job {} {}: {why}", r.id, r.status),
    ///     None => println!("job {} {}", r.id, r.status),
    /// }
    /// # }
    /// ```
    pub fn failure(&self) -> Option<&str> {
        match self.status {
            JobStatus::Failed | JobStatus::Cancelled | JobStatus::Aborted => {
                self.last_error.as_deref()
            }
            _ => None,
        }
    }

    /// The output, deserialized into `T`. An error of kind `InvalidInput` when there is no
    /// output or it does not deserialize, of kind `InvalidState` when the job did not
    /// succeed (the message carries its status and last error).
    pub fn output_as<T: DeserializeOwned>(&self) -> Result<T> {
        if self.status != JobStatus::Succeeded {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!(
                    "job {} has no output: it is {}{}",
                    self.id,
                    self.status,
                    self.last_error
                        .as_deref()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                ),
            ));
        }
        let Some(v) = &self.output else {
            return Err(Error::invalid(format!(
                "job {} succeeded without recording an output (its task never called Job::set_output)",
                self.id
            )));
        };
        T::deserialize(v).map_err(|e| {
            Error::with_source(
                ErrorKind::InvalidInput,
                format!(
                    "the output of job {} does not deserialize into {}",
                    self.id,
                    std::any::type_name::<T>()
                ),
                e,
            )
        })
    }
}

fn json(raw: Option<RawJson>) -> Option<serde_json::Value> {
    raw.map(|RawJson(t)| serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t)))
}

/// Reads the job's row; `None` if there is none.
pub(crate) fn read(conn: &mut Connection, id: JobId) -> Result<Option<JobResult>> {
    let rows = conn.query_cached("reading a job's result", store::JOB_RESULT, &[&id.0])?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let status: String = r.get(0);
    let errors = json(r.get(4));
    let last_error = errors.as_ref().and_then(|e| e.as_array()).and_then(|a| {
        a.last()
            .and_then(|e| e.get("error"))
            .and_then(|e| e.as_str())
            .map(str::to_owned)
    });
    #[allow(deprecated)] // `error` is filled until it is removed.
    Ok(Some(JobResult {
        id,
        status: status.parse()?,
        output: json(r.get(1)),
        progress: json(r.get(2)),
        progress_at: r.get(3),
        error: last_error.clone(),
        last_error,
    }))
}

fn not_found(id: JobId) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!(
            "waiting for job {id}: there is no such job (or it was deleted when it finished, by a worker with delete_finished)"
        ),
    )
}

/// True when a `postpone_done` payload names `id`.
fn names(payload: &str, id: JobId) -> bool {
    payload == "*" || payload.split(',').any(|p| p.parse::<i64>() == Ok(id.0))
}

/// Waits on `conn` (a connection of the waiter's own), listening on `channel` (the done
/// channel of the App's namespace), until job `id` is finished, or `timeout` has passed.
/// `poll` is the longest wait between two reads. The reads and the waits between them each
/// take at most half the connection's `io_timeout`, so that a link that goes half-open is
/// found within `io_timeout`.
pub(crate) fn wait(
    conn: &mut Connection,
    channel: &str,
    id: JobId,
    timeout: Duration,
    poll: Duration,
) -> Result<JobResult> {
    let deadline = Instant::now() + timeout;
    let poll = halve_io_timeout(conn, poll);
    let ctx = |e: Error| e.context(format_args!("waiting for job {id}"));
    conn.listen(channel).map_err(ctx)?;
    // Completions notify only the jobs in postpone_waiters (migration 10). The row goes in
    // after the LISTEN and before the first read: a completion committed before the
    // registration is seen by that read, one that starts after it sees the row. One whose
    // trigger ran just before the registration but which commits just after the read sends
    // nothing: that rare wait ends at the poll. Rows of waiters whose session ended without
    // removing them are cleared here too.
    conn.execute(store::WAITER_INSERT, &[&id.get()])
        .map_err(ctx)?;
    let res = wait_registered(conn, id, deadline, timeout, poll);
    if !conn.is_broken() {
        let _ = conn.execute(store::WAITER_DELETE, &[&id.get()]);
    }
    res
}

/// Waits for job `id` on `conn` without listening: reads its row every `poll` until it is
/// finished or `deadline` (after a flood of notifications dropped the listening
/// connection).
pub(crate) fn wait_polling(
    conn: &mut Connection,
    id: JobId,
    deadline: Instant,
    timeout: Duration,
    poll: Duration,
) -> Result<JobResult> {
    let poll = halve_io_timeout(conn, poll);
    wait_registered(conn, id, deadline, timeout, poll)
}

/// Gives `conn`'s round-trips half its `io_timeout`, and returns `poll` bounded by that half
/// (see [`wait`]).
fn halve_io_timeout(conn: &mut Connection, poll: Duration) -> Duration {
    let half = (conn.io_timeout() / 2).max(Duration::from_millis(1));
    conn.set_io_timeout(half);
    poll.min(half)
}

fn wait_registered(
    conn: &mut Connection,
    id: JobId,
    deadline: Instant,
    timeout: Duration,
    poll: Duration,
) -> Result<JobResult> {
    let ctx = |e: Error| e.context(format_args!("waiting for job {id}"));
    loop {
        let now_state = read(conn, id).map_err(ctx)?.ok_or_else(|| not_found(id))?;
        if now_state.status.is_finished() {
            return Ok(now_state);
        }
        let now = Instant::now();
        if now >= deadline {
            // A job nobody takes is the usual surprise: say where to look.
            let hint = if now_state.status == JobStatus::Todo {
                "; no job starts before it is due, nor without a running worker that serves its \
                 queue and registers its task (`postpone workers --json` lists each worker's \
                 queues and tasks, `postpone stats` says why due jobs wait)"
            } else {
                ""
            };
            return Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "waiting for job {id}: still {} after {} (the wait's timeout){hint}",
                    now_state.status,
                    fmt_duration(timeout)
                ),
            ));
        }
        let until = now + poll.min(deadline - now);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match conn.wait_notification(left).map_err(ctx)? {
                Some(n) if names(&n.payload, id) => break,
                Some(_) => continue,
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_name_ids_exactly() {
        assert!(names("1,22,333", JobId(22)));
        assert!(!names("1,222,333", JobId(22)));
        assert!(names("*", JobId(5)));
        assert!(!names("", JobId(5)));
    }

    #[allow(deprecated)]
    fn result(status: JobStatus, last_error: Option<&str>) -> JobResult {
        JobResult {
            id: JobId(7),
            status,
            output: None,
            progress: None,
            progress_at: None,
            error: last_error.map(str::to_owned),
            last_error: last_error.map(str::to_owned),
        }
    }

    #[test]
    fn failure_is_the_last_error_of_a_job_that_did_not_succeed() {
        for (status, failure) in [
            (JobStatus::Failed, Some("boom")),
            (JobStatus::Cancelled, Some("boom")),
            (JobStatus::Aborted, Some("boom")),
            (JobStatus::Succeeded, None),
            (JobStatus::Todo, None),
            (JobStatus::Doing, None),
        ] {
            let r = result(status, Some("boom"));
            assert_eq!(r.failure(), failure, "{status}");
            assert_eq!(r.last_error.as_deref(), Some("boom"), "{status}");
        }
        assert_eq!(result(JobStatus::Failed, None).failure(), None);
    }

    #[test]
    fn output_as_explains_what_is_missing() {
        let mut r = result(JobStatus::Failed, Some("boom"));
        let e = r.output_as::<i32>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidState);
        assert!(e.to_string().contains("it is failed (boom)"), "{e}");
        r.status = JobStatus::Succeeded;
        let e = r.output_as::<i32>().unwrap_err();
        assert!(e.to_string().contains("without recording an output"), "{e}");
        r.output = Some(serde_json::json!("x"));
        let e = r.output_as::<i32>().unwrap_err();
        assert!(
            e.to_string().contains("does not deserialize into i32"),
            "{e}"
        );
        r.output = Some(serde_json::json!(3));
        assert_eq!(r.output_as::<i32>().unwrap(), 3);
    }
}
