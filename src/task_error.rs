//! [`TaskError`]: what a task returns when it does not succeed, and the action it asks of
//! the worker (retry per the strategy, retry after a delay, fail, cancel).
//!
//! `?` converts what `Box<dyn Error + Send + Sync>` can be made from: every error type that
//! is `Send + Sync + 'static`, text (`&str`, `String`), `Box<dyn Error + Send + Sync>`
//! itself, and `anyhow::Error` (anyhow converts itself into that box, so no feature and no
//! dependency on anyhow is needed here). One blanket conversion from `std::error::Error`
//! could not coexist with the ones for boxes and text (the compiler refuses them: the
//! standard library may one day make a box an `Error`); this one covers them all, at the
//! price of errors that are not `Send + Sync + 'static` (a `PoisonError` holding a lock
//! guard), which go through [`TaskError::new`].
//!
//! A leaf: jobs, tasks and the worker all use it, and it uses none of them.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// What a task returns when it does not succeed.
///
/// `?` turns an error into a `TaskError` that retries the job per the task's
/// [`RetryStrategy`](crate::RetryStrategy), its message the error's and its causes':
///
/// ```
/// use std::time::Duration;
/// use postpone::{Job, RetryStrategy, TaskError, Tasks};
///
/// fn lookup(id: i64) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
///     Err(format!("no user {id}").into())
/// }
///
/// let mut tasks = Tasks::new();
/// tasks
///     .register("welcome", |job: &Job| -> Result<(), TaskError> {
///         let id: i64 = job.args()?; // postpone::Error
///         if id < 0 {
///             return Err("a negative id".into()); // text
///         }
///         let _name = lookup(id)?; // Box<dyn Error + Send + Sync>
///         std::fs::read("/etc/welcome.txt")?; // std::io::Error; anyhow::Error works too
///         Ok(())
///     })
///     .retry(RetryStrategy::fixed(Duration::from_secs(5), 3));
///
/// let e = TaskError::retry_in("rate limited", Duration::from_secs(30));
/// assert_eq!(e.to_string(), "rate limited");
/// let e: TaskError = std::io::Error::other("disk full").into(); // retried per strategy
/// assert_eq!(e.message(), "disk full");
/// ```
pub struct TaskError {
    pub(crate) action: TaskAction,
    message: String,
    /// The action stands when the worker is shutting down ([`TaskError::even_on_shutdown`]).
    pub(crate) even_on_shutdown: bool,
}

/// What the worker does with the job after a [`TaskError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskAction {
    /// Retry if the strategy allows another attempt, after the strategy's delay.
    Error,
    /// Retry after this delay, if the strategy allows another attempt.
    RetryIn(Duration),
    /// Fail now, whatever the strategy.
    Fail,
    /// Mark the job cancelled.
    Cancel,
    /// Run again after this delay without using an attempt (a snooze).
    Snooze(Duration),
}

impl TaskError {
    /// An ordinary error: the job is retried per the task's strategy, as after `?`. For
    /// an error `?` does not convert (one that is not `Send + Sync + 'static`, such as the
    /// `PoisonError` of a `lock()`): `.map_err(TaskError::new)?`.
    ///
    /// ```
    /// use std::sync::Mutex;
    /// use postpone::TaskError;
    ///
    /// fn count(m: &Mutex<u64>) -> Result<(), TaskError> {
    ///     *m.lock().map_err(TaskError::new)? += 1;
    ///     Ok(())
    /// }
    /// assert!(count(&Mutex::new(0)).is_ok());
    /// ```
    pub fn new(message: impl fmt::Display) -> TaskError {
        TaskError {
            action: TaskAction::Error,
            message: message.to_string(),
            even_on_shutdown: false,
        }
    }

    /// Fails the job now, without retry. Returned after a shutdown asked the task to stop,
    /// it puts the job back in its queue instead, unless made
    /// [`even_on_shutdown`](Self::even_on_shutdown).
    pub fn fail(message: impl fmt::Display) -> TaskError {
        TaskError {
            action: TaskAction::Fail,
            message: message.to_string(),
            even_on_shutdown: false,
        }
    }

    /// Retries the job as soon as possible, if the task's strategy allows another attempt
    /// (it counts as an attempt; with the default strategy, which allows one, the job fails).
    pub fn retry(message: impl fmt::Display) -> TaskError {
        TaskError::retry_in(message, Duration::ZERO)
    }

    /// Retries the job after `delay`, if the task's strategy allows another attempt.
    pub fn retry_in(message: impl fmt::Display, delay: Duration) -> TaskError {
        TaskError {
            action: TaskAction::RetryIn(delay),
            message: message.to_string(),
            even_on_shutdown: false,
        }
    }

    /// Cancels the job: it ends `cancelled`, not `failed`, and is not retried. Returned after
    /// a shutdown asked the task to stop, it puts the job back in its queue instead, unless
    /// made [`even_on_shutdown`](Self::even_on_shutdown).
    pub fn cancel(message: impl fmt::Display) -> TaskError {
        TaskError {
            action: TaskAction::Cancel,
            message: message.to_string(),
            even_on_shutdown: false,
        }
    }

    /// Runs the job again after `delay` without using an attempt: its attempt count is
    /// given back, no error is recorded, and the job counts one more snooze (shown as
    /// `snoozes` by the admin API). For work that is not ready yet (a resource busy, a
    /// result not available), not for failures. The delay is clamped to
    /// 100 years. A job whose abort was requested ends
    /// aborted instead; a job whose queueing lock another waiting job holds ends
    /// cancelled (that job does the work).
    ///
    /// ```
    /// use std::time::Duration;
    /// use postpone::TaskError;
    ///
    /// let e = TaskError::snooze(Duration::from_secs(60));
    /// assert_eq!(e.to_string(), "snoozed for 60s");
    /// ```
    pub fn snooze(delay: Duration) -> TaskError {
        TaskError {
            action: TaskAction::Snooze(delay),
            message: format!("snoozed for {}", crate::error::fmt_duration(delay)),
            even_on_shutdown: false,
        }
    }

    /// Makes this error's action stand even when the worker is shutting down: the job is
    /// failed, cancelled or retried (its attempt counted) as the error says, instead of going
    /// back to its queue with its attempt given back. Without it, a job interrupted by a
    /// shutdown (`should_abort()` true because of it, see
    /// [`AbortReason::Shutdown`](crate::AbortReason::Shutdown)) goes back to its queue
    /// whatever its task returned: a `fail` returned then is taken for the answer to
    /// `should_abort`, not for a verdict on the job. Outside a shutdown it changes nothing.
    ///
    /// ```
    /// use postpone::{Job, TaskError};
    ///
    /// fn charge(job: &Job) -> Result<(), TaskError> {
    ///     let card: String = job.args()?;
    ///     if card.is_empty() {
    ///         // A verdict on the job, whenever it comes.
    ///         return Err(TaskError::fail("no card on file").even_on_shutdown());
    ///     }
    ///     if job.should_abort() {
    ///         // Not a verdict: on a shutdown the job runs again later.
    ///         return Err(TaskError::fail("stopped"));
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn even_on_shutdown(mut self) -> TaskError {
        self.even_on_shutdown = true;
        self
    }

    pub(crate) fn with_action(action: TaskAction, message: String) -> TaskError {
        TaskError {
            action,
            message,
            even_on_shutdown: false,
        }
    }

    /// The message recorded on the job.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl<E> From<E> for TaskError
where
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    /// An ordinary error (retried per the task's strategy) whose message is the error's,
    /// followed by each of its causes that it does not already show.
    fn from(e: E) -> TaskError {
        let e: Box<dyn StdError + Send + Sync> = e.into();
        let mut message = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            let text = s.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = s.source();
        }
        TaskError {
            action: TaskAction::Error,
            message,
            even_on_shutdown: false,
        }
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskError")
            .field("action", &self.action)
            .field("message", &self.message)
            .field("even_on_shutdown", &self.even_on_shutdown)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a cause, as libraries build them.
    #[derive(Debug)]
    struct Lookup(std::io::Error);

    impl fmt::Display for Lookup {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("looking up the user")
        }
    }

    impl StdError for Lookup {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    fn boxed() -> Result<(), Box<dyn StdError + Send + Sync>> {
        Err(Box::new(Lookup(std::io::Error::other(
            "connection refused",
        ))))
    }

    fn with_anyhow() -> anyhow::Result<()> {
        use anyhow::Context;
        Err(anyhow::anyhow!("connection refused")).context("looking up the user")
    }

    /// Each form a task writes, through `?` or `.into()` in a function shaped as a task.
    fn task(form: &str) -> Result<(), TaskError> {
        match form {
            "text" => return Err("no such user".into()),
            "string" => return Err(format!("no user {}", 42).into()),
            "question mark on text" => Err("no such user")?,
            "boxed" => boxed()?,
            "anyhow" => with_anyhow()?,
            "io" => Err(std::io::Error::other("disk full"))?,
            _ => {}
        }
        Ok(())
    }

    #[test]
    fn the_errors_tasks_write_retry_per_the_strategy_with_their_causes() {
        for (form, message) in [
            ("text", "no such user"),
            ("string", "no user 42"),
            ("question mark on text", "no such user"),
            ("boxed", "looking up the user: connection refused"),
            ("anyhow", "looking up the user: connection refused"),
            ("io", "disk full"),
        ] {
            let e = task(form).unwrap_err();
            assert_eq!(e.action, TaskAction::Error, "{form}");
            assert_eq!(e.message(), message, "{form}");
        }
    }

    #[test]
    fn an_error_that_is_not_send_goes_through_new() {
        let m = std::sync::Mutex::new(0u32);
        let _ = std::panic::catch_unwind(|| {
            let _guard = m.lock().unwrap();
            panic!("poisons the lock");
        });
        let e = m.lock().map_err(TaskError::new).unwrap_err();
        assert_eq!(e.action, TaskAction::Error);
        assert!(e.message().contains("poisoned"), "{e}");
    }
}
