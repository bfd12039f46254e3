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
/// The name defaults to the arguments' [`TaskArgs::TASK`], so it is written once. See
/// [`Tasks::add`](crate::Tasks::add) for a full example.
pub trait Task: Send + Sync + 'static {
    /// The arguments of its jobs.
    type Args: TaskArgs + DeserializeOwned;

    /// The name the task is registered and deferred under. Defaults to the arguments'
    /// [`TaskArgs::TASK`] (a different value is reported when the worker is spawned).
    const NAME: &'static str = <Self::Args as TaskArgs>::TASK;

    /// Runs one job. `job` gives its id, attempts, abort flag, output and progress.
    fn run(&self, job: &Job, args: Self::Args) -> Result<(), TaskError>;
}
