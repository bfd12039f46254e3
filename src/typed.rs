//! Typed tasks: the [`Task`] trait, for tasks that are a value with a name and an argument
//! type rather than a closure registered under a string.
//!
//! A typed task is registered with [`Tasks::add`](crate::Tasks::add), and its jobs are
//! deferred with [`App::enqueue`](crate::App::enqueue), which takes the task name from the
//! arguments' [`TaskArgs::TASK`]. The worker deserializes the stored arguments into
//! [`Task::Args`] before calling [`Task::run`]; arguments that do not deserialize fail the
//! job without retry, with a message naming the task and the type.

use serde::de::DeserializeOwned;

use crate::job::Job;
use crate::task_error::TaskError;
use crate::types::TaskArgs;

/// A task as a type: a name, an argument type, and the code to run.
///
/// The name defaults to the arguments' [`TaskArgs::TASK`], so it is written once. A task
/// value may hold what its jobs share (a client, a configuration):
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// use postpone::{App, Job, Task, TaskArgs, TaskError, Tasks, Worker};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Resize { image: u64, width: u32 }
/// impl TaskArgs for Resize { const TASK: &'static str = "resize"; }
///
/// struct Resizer { bucket: String }
/// impl Task for Resizer {
///     type Args = Resize;
///     fn run(&self, job: &Job, args: Resize) -> Result<(), TaskError> {
///         if args.width == 0 {
///             return Err(TaskError::fail("width 0")); // no retry
///         }
///         println!("{}: image {} to {} px, attempt {}", self.bucket, args.image,
///                  args.width, job.attempts());
///         Ok(())
///     }
/// }
///
/// let app = App::connect("postgres://postgres@127.0.0.1/app")?;
/// let mut tasks = Tasks::new();
/// tasks.add(Resizer { bucket: "images".into() });
/// app.enqueue(&Resize { image: 7, width: 320 })?; // the task's name comes from the type
/// let handle = Worker::builder(&app, tasks).spawn()?;
/// # Ok(())
/// # }
/// ```
pub trait Task: Send + Sync + 'static {
    /// The arguments of its jobs.
    type Args: TaskArgs + DeserializeOwned;

    /// The name the task is registered and deferred under. Defaults to the arguments'
    /// [`TaskArgs::TASK`] (a different value is reported when the worker is spawned).
    const NAME: &'static str = <Self::Args as TaskArgs>::TASK;

    /// Runs one job. `job` gives its id, attempts, abort flag, output and progress.
    fn run(&self, job: &Job, args: Self::Args) -> Result<(), TaskError>;
}
