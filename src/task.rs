//! Tasks: the functions workers run, registered by name, and what they return.
//!
//! A task is `Fn(&Job) -> Result<(), TaskError> + Send + Sync`. Its [`TaskError`] says what
//! should happen to the job: retry it (per the task's [`RetryStrategy`], or after an explicit
//! delay), fail it, or cancel it. Any `std::error::Error` converts into a `TaskError` that
//! retries per the strategy, so `?` works on ordinary errors.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::job::Job;
use crate::retry::RetryStrategy;

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

pub(crate) type TaskFn = dyn Fn(&Job) -> Result<(), TaskError> + Send + Sync;

/// A registered task: its function and options.
pub(crate) struct Task {
    pub(crate) func: Box<TaskFn>,
    pub(crate) options: TaskOptions,
}

/// Per-task options, set on the value [`Tasks::register`] returns.
///
/// ```
/// use std::time::Duration;
/// use postpone::{RetryStrategy, Tasks};
///
/// let mut tasks = Tasks::new();
/// tasks
///     .register("resize", |_job| Ok(()))
///     .retry(RetryStrategy::exponential(Duration::from_secs(1), 5))
///     .timeout(Duration::from_secs(300));
/// ```
#[derive(Clone, Debug, Default)]
pub struct TaskOptions {
    pub(crate) retry: RetryStrategy,
    pub(crate) timeout: Option<Duration>,
    pub(crate) queue: Option<String>,
    pub(crate) priority: Option<i32>,
}

impl TaskOptions {
    /// How failed attempts are retried. Defaults to [`RetryStrategy::never`].
    pub fn retry(&mut self, strategy: RetryStrategy) -> &mut TaskOptions {
        self.retry = strategy;
        self
    }

    /// After this long, [`Job::should_abort`] turns true for the running job, so a task that
    /// checks it can stop (the worker never kills a thread). Defaults to no timeout.
    pub fn timeout(&mut self, timeout: Duration) -> &mut TaskOptions {
        self.timeout = Some(timeout);
        self
    }

    /// The queue used when this task is deferred through an App that knows these tasks
    /// ([`AppBuilder::task_defaults`](crate::AppBuilder::task_defaults)) and no queue is given.
    /// Defaults to `"default"`.
    pub fn queue(&mut self, queue: impl Into<String>) -> &mut TaskOptions {
        self.queue = Some(queue.into());
        self
    }

    /// The priority used likewise when none is given. Defaults to 0.
    pub fn priority(&mut self, priority: i32) -> &mut TaskOptions {
        self.priority = Some(priority);
        self
    }
}

/// The registry of tasks a worker can run, by name.
///
/// ```
/// use postpone::{Job, TaskError, Tasks};
///
/// let mut tasks = Tasks::new();
/// tasks.register("add", |job: &Job| -> Result<(), TaskError> {
///     let (a, b): (i64, i64) = job.args()?;
///     println!("{}", a + b);
///     Ok(())
/// });
/// assert!(tasks.contains("add"));
/// ```
#[derive(Default)]
pub struct Tasks {
    pub(crate) map: HashMap<String, Arc<Task>>,
    pub(crate) problems: Vec<String>,
    /// Cron schedules, from [`Tasks::periodic`] (in `periodic.rs`).
    pub(crate) periodic: Vec<crate::periodic::PeriodicOptions>,
}

impl fmt::Debug for Tasks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&String> = self.map.keys().collect();
        names.sort();
        f.debug_struct("Tasks").field("names", &names).finish()
    }
}

impl Tasks {
    /// An empty registry.
    pub fn new() -> Tasks {
        Tasks::default()
    }

    /// Registers `f` under `name` and returns its options to adjust. A name that is empty or
    /// registered twice is reported by [`Worker::builder(..).spawn()`](crate::WorkerBuilder::spawn)
    /// as an error (registering never panics).
    pub fn register<F>(&mut self, name: impl Into<String>, f: F) -> &mut TaskOptions
    where
        F: Fn(&Job) -> Result<(), TaskError> + Send + Sync + 'static,
    {
        let name = name.into();
        if name.trim().is_empty() {
            self.problems
                .push("a task was registered with an empty name".into());
        } else if self.map.contains_key(&name) {
            self.problems
                .push(format!("task {name:?} is registered twice"));
        }
        let task = Arc::new(Task {
            func: Box::new(f),
            options: TaskOptions::default(),
        });
        self.map.insert(name.clone(), task);
        let entry = self.map.get_mut(&name).expect("just inserted");
        &mut Arc::get_mut(entry).expect("not shared yet").options
    }

    /// True when a task of that name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.map.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// The options of a registered task.
    pub fn options(&self, name: &str) -> Option<&TaskOptions> {
        self.map.get(name).map(|t| &t.options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_convert_with_their_cause_chain() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("uploading")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e: TaskError = Outer(std::io::Error::other("broken pipe")).into();
        assert_eq!(e.message(), "uploading: broken pipe");
        assert_eq!(e.action, TaskAction::Error);
    }

    #[test]
    fn registry_records_bad_names_instead_of_panicking() {
        let mut t = Tasks::new();
        t.register("a", |_| Ok(())).priority(3).queue("q");
        t.register("a", |_| Ok(()));
        t.register(" ", |_| Ok(()));
        assert_eq!(t.problems.len(), 2);
        assert_eq!(t.names(), vec![" ", "a"]);
        assert_eq!(t.options("a").unwrap().priority, None);
    }

    #[test]
    fn constructors_set_actions() {
        assert_eq!(TaskError::fail("x").action, TaskAction::Fail);
        assert_eq!(TaskError::cancel("x").action, TaskAction::Cancel);
        assert_eq!(
            TaskError::retry("x").action,
            TaskAction::RetryIn(Duration::ZERO)
        );
    }
}
