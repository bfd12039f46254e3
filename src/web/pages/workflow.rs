//! One workflow's page: its jobs counted by state, then listed in the order of the graph
//! with their states and the jobs each runs after; buttons to cancel or retry the whole.

use super::*;
use crate::workflow::{WorkflowId, WorkflowInfo, WorkflowJob};

/// `GET /workflows/ID`.
pub(super) fn workflow(
    st: &State,
    id: WorkflowId,
    flash: Option<&str>,
    done: Option<&str>,
) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let w = st.admin.workflow(id)?;
    cost.queries += 2;
    let done_text = match done {
        Some("cancelled") => Some("Cancelled: its waiting jobs will not run; running ones are asked to abort."),
        Some("retried") => Some("Retried: its failed, cancelled and aborted jobs wait again, each for the jobs it runs after."),
        _ => None,
    };
    let button = |action: &str, label: &str, enabled: bool| -> Markup {
        html! {
            @if enabled && !st.read_only {
                form.inline method="post" action=(st.link(&format!("/workflows/{}/{action}", w.id))) {
                    input type="hidden" name="csrf" value=(st.csrf);
                    button name="go" value="1" id={ "workflow-" (action) } { (label) }
                }
                " "
            }
        }
    };
    let counts = [
        ("waiting", w.waiting),
        ("running", w.running),
        ("succeeded", w.succeeded),
        ("failed", w.failed),
        ("cancelled", w.cancelled),
        ("aborted", w.aborted),
        ("deleted", w.deleted),
    ];
    let job_link = |x: &JobId| html! { a href=(st.link(&format!("/jobs/{x}"))) { (x) } };
    let body = html! {
        div #workflow-live data-live="workflow" {
        h1 {
            "Workflow " (w.id) " " (Shown(&w.name)) " "
            small { (state(&w)) }
        }
        @if let Some(f) = flash { p.flash.bad { (Shown(f)) } }
        @if let Some(t) = done_text { p.flash { (t) } }
        p #workflow-progress {
            (summary(&w))
            br;
            progress max=(w.total.max(1)) value=(w.finished()) {}
        }
        p {
            (button("cancel", "Cancel workflow", !w.is_finished()))
            (button("retry", "Retry failed part", w.unsuccessful() > 0))
        }
        div.scroll { table.kv {
            tr { th { "Created" } td { (Time(w.created_at)) } }
            tr { th { "Jobs" } td #workflow-total { (w.total) } }
            @for (name, n) in counts {
                tr { th { (name) } td id={ "workflow-" (name) } { (n) } }
            }
        } }
        h2 { "Jobs" }
        div.scroll { table #workflow-jobs {
            tr { th.n { "Id" } th { "Step" } th { "Task" } th { "Queue" } th { "State" }
                 th { "After" } th { "After finished" } th { "Last error" } }
            @for j in &w.jobs {
                tr id={ "workflow-job-" (j.id) } {
                    td.n { (job_link(&j.id)) }
                    td { @match &j.step { Some(s) => (Shown(s)), None => (dash()) } }
                    td { @match &j.task { Some(t) => (Shown(t)), None => (dash()) } }
                    td { @match &j.queue { Some(q) => (Shown(q)), None => (dash()) } }
                    td { (job_state(j)) }
                    td.after {
                        @if j.after.is_empty() { (dash()) }
                        @for (i, x) in j.after.iter().enumerate() { @if i > 0 { ", " } (job_link(x)) }
                    }
                    td.after-finished {
                        @if j.after_finished.is_empty() { (dash()) }
                        @for (i, x) in j.after_finished.iter().enumerate() { @if i > 0 { ", " } (job_link(x)) }
                    }
                    td { @match &j.last_error {
                        Some(e) => (Shown(&cut(e, 120))),
                        None => (dash()),
                    } }
                }
            }
        } }
        @if (w.jobs.len() as u64) < w.total {
            p.dim #workflow-more {
                (w.total - w.jobs.len() as u64) " more jobs not listed (the first "
                (w.jobs.len()) " by id are)."
            }
        }
        }
        (cost.footer())
    };
    Ok(st.page(
        200,
        &format!("Workflow {}", w.id),
        "Jobs",
        if w.is_finished() { None } else { Some(5) },
        body,
    ))
}

/// `POST /workflows/ID/cancel` and `/retry`.
pub(super) fn act_workflow(
    st: &State,
    req: &Request,
    id: WorkflowId,
    action: &str,
) -> Result<Response, Error> {
    if let Some(r) = refusal(st, req) {
        return Ok(r);
    }
    let result = match action {
        "cancel" => st.admin.cancel_workflow(id).map(|_| "cancelled".to_owned()),
        "retry" => st
            .admin
            .retry_workflow(id)
            .and_then(|r| match r.refused.first() {
                Some((job, why)) if r.retried.is_empty() => Err(Error::new(
                    ErrorKind::InvalidState,
                    format!("retrying workflow {id}: job {job} was not retried: {why}"),
                )),
                _ => Ok("retried".to_owned()),
            }),
        _ => return Ok(Response::text(404, "no such action\n")),
    };
    match result {
        Ok(done) => Ok(Response::redirect(
            st.link(&format!("/workflows/{id}?done={done}")),
        )),
        Err(e) if e.kind() == ErrorKind::InvalidState => {
            let mut resp = workflow(st, id, Some(&e.to_string()), None)?;
            resp.status = 409;
            Ok(resp)
        }
        Err(e) => Err(e),
    }
}

/// The workflow's state as a coloured word.
fn state(w: &WorkflowInfo) -> Markup {
    let class = match w.describe() {
        "running" => "doing",
        "succeeded" => "succeeded",
        "cancelled" => "cancelled",
        _ => "failed",
    };
    html! { span class={ "status s-" (class) } { (w.describe()) } }
}

/// A member's state as a coloured word (waiting ones, for their dependencies or not, in the
/// colour of waiting).
fn job_state(j: &WorkflowJob) -> Markup {
    match j.status {
        None => html! { span.dim { "deleted" } },
        Some(JobStatus::Todo) => {
            html! { span.status.s-waiting { (j.describe()) } }
        }
        Some(s) => status(s.as_str()),
    }
}

fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// `3 of 4 finished (1 failed, 0 cancelled, 0 aborted)`.
pub(super) fn summary(w: &WorkflowInfo) -> String {
    format!(
        "{} of {} finished ({} failed, {} cancelled, {} aborted)",
        w.finished(),
        w.total,
        w.failed,
        w.cancelled,
        w.aborted
    )
}

pub(super) fn parse_workflow_id(s: &str) -> Result<WorkflowId, Error> {
    s.trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .map(WorkflowId)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("{s:?} is not a workflow id: use a positive whole number"),
            )
        })
}
