//! Job dependencies as a dependent reads them: [`Dependency`], returned by
//! [`Job::dependency_outputs`](crate::Job::dependency_outputs).
//!
//! The dependencies themselves are given at defer time ([`NewJob::after`](crate::NewJob::after),
//! [`NewJob::after_finished`](crate::NewJob::after_finished)) and kept by the database
//! (schema version 23, `0023_dependencies.sql`): a dependent waits as a `todo` job no claim
//! reaches, and triggers release or cancel it in the statement that records its last
//! dependency's outcome. Nothing here runs on the claim or the finish of a job.

use serde::de::DeserializeOwned;

use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::store;
use crate::types::{JobId, JobStatus};

/// A job that another job was deferred to run after, as that job reads it.
///
/// ```
/// # use postpone::{Job, TaskError};
/// fn report(job: &Job) -> Result<(), TaskError> {
///     let mut rows = 0u64;
///     for dep in job.dependency_outputs()? {
///         // `after` dependencies have all succeeded; their outputs are there if they set one.
///         if let Some(n) = dep.output_as::<u64>()? {
///             rows += n;
///         }
///     }
///     job.set_output(&rows)?;
///     Ok(())
/// }
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Dependency {
    /// Its id.
    pub id: JobId,
    /// Its status now (final, unless an operator retried it since); `None` when its row is
    /// gone and its outcome was not recorded (deleted before it finished).
    pub status: Option<JobStatus>,
    /// The output it recorded with [`Job::set_output`](crate::Job::set_output), if it
    /// succeeded with one and its row is still there (retention and `DeleteJobs` delete it).
    pub output: Option<serde_json::Value>,
}

impl Dependency {
    /// The output deserialized into `T`, or `None` when there is none.
    pub fn output_as<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        match &self.output {
            None => Ok(None),
            Some(v) => T::deserialize(v).map(Some).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "reading the output of job {}: it does not deserialize into {}: {e}",
                        self.id,
                        std::any::type_name::<T>()
                    ),
                )
            }),
        }
    }
}

/// The dependencies of job `id`, by id.
pub(crate) fn read(conn: &mut Connection, id: JobId) -> Result<Vec<Dependency>> {
    let rows = conn.query_cached(
        "reading the dependencies of a job",
        store::JOB_DEPENDENCIES,
        &[&id.0],
    )?;
    Ok(rows
        .iter()
        .map(|r| Dependency {
            id: JobId(r.get(0)),
            status: r
                .get::<_, Option<String>>(1)
                .and_then(|s| s.parse::<JobStatus>().ok()),
            output: r.get(2),
        })
        .collect())
}
