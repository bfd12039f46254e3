//! [`TaskError`]: what a task returns when it does not succeed, and the action it asks of
//! the worker (retry per the strategy, retry after a delay, fail, cancel).
//!
//! A leaf: jobs, tasks and the worker all use it, and it uses none of them.

use std::fmt;
use std::time::Duration;

/// What a task returns when it does not succeed.
///
/// ```
/// use std::time::Duration;
/// use postpone::TaskError;
///
/// let e = TaskError::retry_in("rate limited", Duration::from_secs(30));
/// assert_eq!(e.to_string(), "rate limited");
/// let e: TaskError = std::io::Error::other("disk full").into(); // retried per strategy
/// assert_eq!(e.message(), "disk full");
/// ```
pub struct TaskError {
    pub(crate) action: TaskAction,
    message: String,
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
    /// Fails the job now, without retry.
    pub fn fail(message: impl fmt::Display) -> TaskError {
        TaskError {
            action: TaskAction::Fail,
            message: message.to_string(),
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
        }
    }

    /// Cancels the job: it ends `cancelled`, not `failed`, and is not retried.
    pub fn cancel(message: impl fmt::Display) -> TaskError {
        TaskError {
            action: TaskAction::Cancel,
            message: message.to_string(),
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
        }
    }

    pub(crate) fn with_action(action: TaskAction, message: String) -> TaskError {
        TaskError { action, message }
    }

    /// The message recorded on the job.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl<E: std::error::Error> From<E> for TaskError {
    fn from(e: E) -> TaskError {
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
            .finish()
    }
}
