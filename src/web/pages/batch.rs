//! One batch's page: its jobs counted by state, how far it got, and its callbacks.

use super::*;
use crate::batch::{BatchId, BatchProgress, CallbackState};

/// `GET /batches/ID`.
pub(super) fn batch(st: &State, id: BatchId) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let p = st.admin.batch(id)?;
    cost.queries += 1;
    let callback = |c: &Option<CallbackState>| -> Markup {
        html! {
            @match c {
                Some(c) => {
                    a href=(st.link(&format!("/jobs/{}", c.id))) { "job " (c.id) }
                    " " (c.describe())
                }
                None => span.dim { "none" },
            }
        }
    };
    let counts = [
        ("waiting", p.waiting),
        ("running", p.running),
        ("succeeded", p.succeeded),
        ("failed", p.failed),
        ("cancelled", p.cancelled),
        ("aborted", p.aborted),
        ("deleted", p.deleted),
    ];
    let body = html! {
        h1 {
            "Batch " (p.id) " "
            small { (status(if p.is_finished() { "finished" } else { "running" })) }
        }
        p #batch-progress {
            (summary(&p))
            br;
            progress max=(p.total.max(1)) value=(p.finished()) {}
        }
        div.scroll { table.kv {
            tr { th { "Created" } td { (Time(p.created_at)) } }
            tr { th { "Jobs" } td #batch-total { (p.total) } }
            @for (name, n) in counts {
                tr { th { (name) } td id={ "batch-" (name) } { (n) } }
            }
            tr { th { "On complete" } td #on-complete { (callback(&p.on_complete)) } }
            tr { th { "On success" } td #on-success { (callback(&p.on_success)) } }
        } }
        (cost.footer())
    };
    Ok(st.page(
        200,
        &format!("Batch {}", p.id),
        "Jobs",
        if p.is_finished() { None } else { Some(5) },
        body,
    ))
}

/// `12 of 40 finished (2 failed, 1 cancelled, 0 aborted)`.
pub(super) fn summary(p: &BatchProgress) -> String {
    format!(
        "{} of {} finished ({} failed, {} cancelled, {} aborted)",
        p.finished(),
        p.total,
        p.failed,
        p.cancelled,
        p.aborted
    )
}

pub(super) fn parse_batch_id(s: &str) -> Result<BatchId, Error> {
    s.trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .map(BatchId)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("{s:?} is not a batch id: use a positive whole number"),
            )
        })
}
