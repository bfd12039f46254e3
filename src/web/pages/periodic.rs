//! The periodic page: each schedule with its last and next instants.

use super::*;

/// One line of the page: a schedule the program gave or the database recorded.
struct Line<'a> {
    task: String,
    id: String,
    /// The cron expression, when the program gave it.
    schedule: Option<String>,
    row: Option<&'a queries::PeriodicRow>,
    next: Markup,
}

pub(super) fn periodic(st: &State) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let rows = {
        let mut conn = st.app.connection()?;
        queries::periodic(&mut conn)?
    };
    cost.queries += 1;
    let now = SystemTime::now();
    let in_or_overdue = |next: SystemTime| -> Markup {
        html! {
            (Time(next)) " ("
            @match next.duration_since(now) {
                Ok(d) => { "in " (age(d)) }
                Err(e) => span.err { "overdue by " (age(e.duration())) },
            }
            ")"
        }
    };
    // Schedules known from the program, then those only the database knows.
    let mut lines: Vec<Line<'_>> = Vec::new();
    for s in &st.schedules {
        let row = rows
            .iter()
            .find(|r| r.task == s.task() && r.periodic_id == s.id);
        let next = match s.next_after(now) {
            Some(n) => in_or_overdue(n),
            None => html! { span.dim { "never" } },
        };
        lines.push(Line {
            task: s.task().to_owned(),
            id: s.id.clone(),
            schedule: Some(s.schedule().to_owned()),
            row,
            next,
        });
    }
    for r in &rows {
        if lines
            .iter()
            .any(|l| l.task == r.task && l.id == r.periodic_id)
        {
            continue;
        }
        let next = match r.previous {
            Some(prev) => match r.last.duration_since(prev) {
                Ok(step) if !step.is_zero() => {
                    html! { (in_or_overdue(r.last + step)) " " span.dim { "(inferred)" } }
                }
                _ => dash(),
            },
            None => html! { span.dim { "after a second instant" } },
        };
        lines.push(Line {
            task: r.task.clone(),
            id: r.periodic_id.clone(),
            schedule: None,
            row: Some(r),
            next,
        });
    }
    let body = html! {
        h1 { "Periodic schedules" }
        div #periodic-live data-live="periodic" {
        @if lines.is_empty() {
            p.dim { "No periodic instant has been deferred yet." }
        } @else {
            p.dim {
                "Schedules live in the workers' code. Those this dashboard was given show their \
                 exact next instant; for the others it is inferred from the distance between \
                 the last two instants recorded."
            }
            div.scroll { table #schedules {
                tr { th { "Task" } th { "Periodic id" } th { "Schedule" } th { "Last instant" }
                     th { "Its job" } th { "Next instant" } th.n { "Instants kept" } }
                @for l in &lines {
                    tr {
                        td { (Shown(&l.task)) }
                        td { (Shown(&l.id)) }
                        td {
                            @match &l.schedule {
                                Some(s) => code { (Shown(s)) },
                                None => span.dim { "not known here" },
                            }
                        }
                        @match l.row {
                            Some(p) => {
                                td { (Time(p.last)) }
                                td {
                                    @match (p.last_job, &p.last_status) {
                                        (Some(id), Some(s)) => {
                                            a href=(st.link(&format!("/jobs/{id}"))) { (id) } " " (status(s))
                                        }
                                        (Some(id), None) => { (id) " " span.dim { "(deleted)" } }
                                        (None, _) => span.dim { "skipped (a job was still waiting)" },
                                    }
                                }
                                td { (l.next) }
                                td.n { (p.instants) }
                            }
                            None => {
                                td { span.dim { "none yet" } }
                                td {}
                                td { (l.next) }
                                td.n { "0" }
                            }
                        }
                    }
                }
            } }
        }
        }
        (cost.footer())
    };
    Ok(st.page(200, "Periodic", "Periodic", Some(30), body))
}
