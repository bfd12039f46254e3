//! The job selection shared by `jobs` and the bulk commands (`retry`, `cancel`, `delete`,
//! `reschedule`, `priority`): one set of flags, turned into one `JobFilter`.

use std::time::SystemTime;

use clap::Args;
use postpone::{JobFilter, JobId, JobStatus};

use crate::parse;

/// Which jobs: every flag given must match.
#[derive(Debug, Args)]
pub struct Select {
    /// Only these statuses (repeat or comma-separate).
    #[arg(long, value_parser = parse::status, value_delimiter = ',', value_name = "STATUS")]
    pub status: Vec<JobStatus>,
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only this task.
    #[arg(long)]
    pub task: Option<String>,
    /// Only this lock.
    #[arg(long)]
    pub lock: Option<String>,
    /// Only this queueing lock.
    #[arg(long)]
    pub queueing_lock: Option<String>,
    /// Only jobs deferred since TIME (RFC 3339, or an age: 2h means two hours ago).
    #[arg(long, value_parser = parse::time_or_age, value_name = "TIME")]
    pub created_after: Option<SystemTime>,
    /// Only jobs deferred before TIME (RFC 3339, or an age).
    #[arg(long, value_parser = parse::time_or_age, value_name = "TIME")]
    pub created_before: Option<SystemTime>,
    /// Only jobs that finished since TIME (RFC 3339, or an age).
    #[arg(long, value_parser = parse::time_or_age, value_name = "TIME")]
    pub finished_after: Option<SystemTime>,
    /// Only jobs that finished before TIME (RFC 3339, or an age).
    #[arg(long, value_parser = parse::time_or_age, value_name = "TIME")]
    pub finished_before: Option<SystemTime>,
    /// Only jobs with a recorded error containing TEXT (ignoring case).
    #[arg(long, value_name = "TEXT")]
    pub error: Option<String>,
    /// Only jobs deferred with this tag (repeat to require several).
    #[arg(long, value_name = "TAG")]
    pub tag: Vec<String>,
    /// Only the jobs of this batch, its callbacks included.
    #[arg(long, value_parser = parse::batch_id, value_name = "BATCH")]
    pub batch: Option<postpone::BatchId>,
    /// Only the jobs of this workflow.
    #[arg(long, value_parser = parse::workflow_id, value_name = "WORKFLOW")]
    pub workflow: Option<postpone::WorkflowId>,
    /// Only jobs whose arguments contain this JSON (jsonb `@>`: `{"user": 42}` matches every
    /// job whose arguments hold the key user with the value 42). Not indexed.
    #[arg(long, value_parser = parse_json, value_name = "JSON")]
    pub args: Option<serde_json::Value>,
}

fn parse_json(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))
}

impl Select {
    /// The filter, with `id` if one was given.
    pub fn filter(&self, id: Option<JobId>) -> JobFilter {
        let mut f = JobFilter::new();
        if let Some(id) = id {
            f = f.id(id);
        }
        for s in &self.status {
            f = f.status(*s);
        }
        if let Some(v) = &self.queue {
            f = f.queue(v);
        }
        if let Some(v) = &self.task {
            f = f.task(v);
        }
        if let Some(v) = &self.lock {
            f = f.lock(v);
        }
        if let Some(v) = &self.queueing_lock {
            f = f.queueing_lock(v);
        }
        if let Some(t) = self.created_after {
            f = f.created_after(t);
        }
        if let Some(t) = self.created_before {
            f = f.created_before(t);
        }
        if let Some(t) = self.finished_after {
            f = f.finished_after(t);
        }
        if let Some(t) = self.finished_before {
            f = f.finished_before(t);
        }
        if let Some(v) = &self.error {
            f = f.error_contains(v);
        }
        for t in &self.tag {
            f = f.tag(t);
        }
        if let Some(b) = self.batch {
            f = f.batch(b);
        }
        if let Some(w) = self.workflow {
            f = f.workflow(w);
        }
        if let Some(v) = &self.args {
            f = f.args_contain(v.clone());
        }
        f
    }
}
