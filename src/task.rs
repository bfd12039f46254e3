//! Tasks: the functions workers run, registered by name, and what they return.
//!
//! A task is `Fn(&Job) -> Result<(), TaskError> + Send + Sync`. Its [`TaskError`] says what
//! should happen to the job: retry it (per the task's [`RetryStrategy`], or after an explicit
//! delay), fail it, or cancel it. `?` on an error that is `Send + Sync` (a boxed one and
//! `anyhow::Error` included) and `.into()` on text make a `TaskError` that retries per the
//! strategy (see `task_error.rs`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::job::Job;
// The worker names these through `crate::task`.
use crate::periodic::{PeriodicOptions, Schedules};
use crate::retry::RetryStrategy;
pub(crate) use crate::task_error::{TaskAction, TaskError};
use crate::typed;
use crate::types::{TaskArgs, TaskDefaults};

pub(crate) type TaskFn = dyn Fn(&Job) -> Result<(), TaskError> + Send + Sync;

/// A registered task: its function and options.
pub(crate) struct Registered {
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
    pub(crate) map: HashMap<String, Arc<Registered>>,
    pub(crate) problems: Vec<String>,
    /// The periodic schedules of these tasks, from [`Tasks::periodic`].
    pub(crate) periodic: Schedules,
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
        let task = Arc::new(Registered {
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

    /// Defers `task` on a cron schedule, from every worker given these tasks; each instant
    /// is deferred exactly once, whatever the number of workers and hosts. The task must be
    /// registered in this registry too. A malformed expression is reported when the worker
    /// is spawned (registering never panics).
    ///
    /// `schedule` has 5 fields (`minute hour day-of-month month day-of-week`, as in crontab),
    /// or 6 with a leading seconds field, or is one of `@yearly`, `@annually`, `@monthly`,
    /// `@weekly`, `@daily`, `@midnight`, `@hourly`. Ranges, steps, lists and names
    /// (`MON-FRI`, `JAN`) are accepted, as are `L`, `W` and `#`. Times are UTC unless the
    /// schedule is given a [`time_zone`](PeriodicOptions::time_zone).
    ///
    /// See [`PeriodicOptions`] for the arguments, id, queue and catch-up window.
    pub fn periodic(&mut self, task: impl Into<String>, schedule: &str) -> &mut PeriodicOptions {
        self.periodic.add(task, schedule)
    }

    /// Registers a typed task under its [`NAME`](typed::Task::NAME): its jobs' arguments are
    /// deserialized into [`Task::Args`](typed::Task::Args) before
    /// [`Task::run`](typed::Task::run) is called (arguments that do not
    /// deserialize fail the job without retry). Returns its options to adjust, like
    /// [`register`](Self::register), which stays for closures.
    ///
    /// ```
    /// use postpone::{Job, Task, TaskArgs, TaskError, Tasks};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct SendEmailArgs { to: String }
    /// impl TaskArgs for SendEmailArgs {
    ///     const TASK: &'static str = "send_email";
    /// }
    ///
    /// struct SendEmail { from: String }
    /// impl Task for SendEmail {
    ///     type Args = SendEmailArgs;
    ///     fn run(&self, job: &Job, args: SendEmailArgs) -> Result<(), TaskError> {
    ///         println!("job {}: mail from {} to {}", job.id(), self.from, args.to);
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let mut tasks = Tasks::new();
    /// tasks.add(SendEmail { from: "noreply@example.com".into() });
    /// assert!(tasks.contains("send_email"));
    /// ```
    pub fn add<T: typed::Task>(&mut self, task: T) -> &mut TaskOptions {
        if T::NAME != <T::Args as TaskArgs>::TASK {
            self.problems.push(format!(
                "typed task {:?} has arguments {} whose TaskArgs::TASK is {:?}: app.enqueue would defer them to another task; make the two names equal",
                T::NAME,
                std::any::type_name::<T::Args>(),
                <T::Args as TaskArgs>::TASK
            ));
        }
        self.register(T::NAME, move |job: &Job| {
            let args: T::Args = job.args()?;
            task.run(job, args)
        })
    }

    /// The periodic schedules registered so far.
    pub fn schedules(&self) -> &Schedules {
        &self.periodic
    }
}

impl From<&Tasks> for TaskDefaults {
    fn from(tasks: &Tasks) -> TaskDefaults {
        let mut d = TaskDefaults::default();
        for (name, task) in &tasks.map {
            d.set(
                name.clone(),
                task.options.queue.clone(),
                task.options.priority,
            );
        }
        d
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
