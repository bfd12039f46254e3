//! The periodic page: each schedule (stored in the database, given to the dashboard by the
//! program, or only seen in the record of deferred instants) with its last and next
//! instants; a stored schedule with its pause or resume and delete buttons, and a form that
//! stores a new schedule (none of them in read-only mode). They post to `/periodic/pause`,
//! `/periodic/resume`, `/periodic/delete` and `/periodic/create` behind the same checks as
//! every other change (auth, origin, CSRF token), and call the admin API.

use super::*;

/// Where a line's schedule comes from.
enum Source<'a> {
    /// A row of `postpone_schedules`.
    Stored(&'a crate::admin::ScheduleInfo),
    /// The program's code (`Dashboard::schedules`).
    Code,
    /// Only the record of deferred instants.
    Recorded,
}

/// One line of the page.
struct Line<'a> {
    task: String,
    id: String,
    /// The cron expression, when known here.
    schedule: Option<String>,
    source: Source<'a>,
    row: Option<&'a queries::PeriodicRow>,
    next: Markup,
}

pub(super) fn periodic(st: &State, done: Option<&str>) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let rows = {
        let mut conn = st.app.connection()?;
        queries::periodic(&mut conn)?
    };
    let stored = st.admin.schedules()?;
    cost.queries += 2;
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
    // Stored schedules, then those known from the program (a stored one with the same task
    // and id replaces it on the workers), then those only the record knows.
    let mut lines: Vec<Line<'_>> = Vec::new();
    for s in &stored {
        let row = rows
            .iter()
            .find(|r| r.task == s.task && r.periodic_id == s.id);
        let next = match s.next_instant {
            Some(n) => in_or_overdue(n),
            None if s.is_paused() => html! { span.dim { "paused" } },
            None => html! { span.dim { "never" } },
        };
        lines.push(Line {
            task: s.task.clone(),
            id: s.id.clone(),
            schedule: Some(s.cron.clone()),
            source: Source::Stored(s),
            row,
            next,
        });
    }
    for s in &st.schedules {
        if lines.iter().any(|l| l.task == s.task() && l.id == s.id) {
            continue;
        }
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
            source: Source::Code,
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
            source: Source::Recorded,
            row: Some(r),
            next,
        });
    }
    // Fixed texts only: a crafted link says nothing else.
    let done_text = match done {
        Some("paused") => {
            Some("Schedule paused: workers stop deferring it within a poll interval.")
        }
        Some("resumed") => Some(
            "Schedule resumed: its next instants are deferred (the paused ones are not caught up).",
        ),
        Some("created") => Some(
            "Schedule stored: every worker that registers its task defers its instants from \
             now on, within a poll interval.",
        ),
        Some("deleted") => Some(
            "Schedule deleted: workers stop deferring it within a poll interval (a schedule \
             with the same task and id in a worker's code applies again there).",
        ),
        _ => None,
    };
    let button = |l: &Line<'_>, path: &str, label: &str, class: &str| -> Markup {
        html! {
            form.inline method="post" action=(st.link(path)) {
                input type="hidden" name="csrf" value=(st.csrf);
                input type="hidden" name="task" value=(l.task);
                input type="hidden" name="id" value=(l.id);
                button name="go" value="1" class=(class) { (label) }
            }
        }
    };
    let action = |l: &Line<'_>, paused: bool| -> Markup {
        html! {
            @if paused {
                (button(l, "/periodic/resume", "Resume", "resume"))
            } @else {
                (button(l, "/periodic/pause", "Pause", "pause"))
            }
            " "
            (button(l, "/periodic/delete", "Delete", "delete"))
        }
    };
    let create = html! {
        h2 { "Store a schedule" }
        p.dim {
            "Every worker that registers the task follows it within a poll interval, from \
             now on; the instants before now are not deferred. A schedule with the task and \
             id of one in a worker's code replaces it while it is stored."
        }
        form #create-schedule method="post" action=(st.link("/periodic/create")) {
            input type="hidden" name="csrf" value=(st.csrf);
            label { "Task " input type="text" name="task" required maxlength="255"; } " "
            label { "Periodic id " input type="text" name="id" maxlength="255"; } " "
            label {
                "Schedule " input type="text" name="cron" required maxlength="255"
                    placeholder="0 9 * * MON-FRI";
            } " "
            label {
                "Time zone " input type="text" name="time_zone" maxlength="255"
                    placeholder="UTC";
            } " "
            label { "Queue " input type="text" name="queue" maxlength="255"; } " "
            label {
                "Arguments (JSON) " input type="text" name="args" maxlength="65536"
                    placeholder="null";
            } " "
            button name="go" value="1" class="create" { "Store" }
        }
    };
    let body = html! {
        h1 { "Periodic schedules" }
        @if let Some(t) = done_text { p.flash { (t) } }
        div #periodic-live data-live="periodic" {
        @if lines.is_empty() {
            p.dim { "No schedule is stored and no periodic instant has been deferred yet." }
        } @else {
            p.dim {
                "Schedules come from the database (stored at runtime: every worker that \
                 registers the task follows them, and they can be paused here) or from the \
                 workers' code. Those known here show their exact next instant; for the others \
                 it is inferred from the distance between the last two instants recorded."
            }
            div.scroll { table #schedules {
                tr { th { "Task" } th { "Periodic id" } th { "Schedule" } th { "Source" }
                     th { "Last instant" }
                     th { "Its job" } th { "Next instant" } th.n { "Instants kept" }
                     @if !st.read_only { th { "Action" } } }
                @for l in &lines {
                    tr {
                        td { (Shown(&l.task)) }
                        td { (Shown(&l.id)) }
                        td {
                            @match &l.schedule {
                                Some(s) => code { (Shown(s)) },
                                None => span.dim { "not known here" },
                            }
                            @if let Source::Stored(s) = l.source {
                                @if let Some(z) = &s.time_zone { br; span.dim { (Shown(z)) } }
                            }
                        }
                        td {
                            @match l.source {
                                Source::Stored(s) if s.is_paused() => { "database " strong.err { "paused" } }
                                Source::Stored(_) => "database",
                                Source::Code => "code",
                                Source::Recorded => span.dim { "record" },
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
                        @if !st.read_only {
                            td {
                                @if let Source::Stored(s) = l.source { (action(l, s.is_paused())) }
                            }
                        }
                    }
                }
            } }
        }
        }
        @if !st.read_only { (create) }
        (cost.footer())
    };
    Ok(st.page(200, "Periodic", "Periodic", Some(30), body))
}

/// `POST /periodic/pause`, `/periodic/resume` and `/periodic/delete`: the stored schedule
/// named by the form's `task` and `id` fields; `POST /periodic/create`: a new stored
/// schedule from the form's `task`, `id`, `cron`, `time_zone`, `queue` and `args` (JSON)
/// fields, refused if one with that task and id is stored already. Through the admin API,
/// which checks every input.
pub(super) fn act_periodic(st: &State, req: &Request, action: &str) -> Result<Response, Error> {
    if let Some(r) = refusal(st, req) {
        return Ok(r);
    }
    let form = req.form();
    let field = |k: &str| {
        form.iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.as_str())
    };
    let (Some(task), id) = (field("task"), field("id").unwrap_or("")) else {
        return Ok(Response::text(400, "the form names no task\n"));
    };
    let res = match action {
        "pause" => st.admin.pause_schedule(task, id).map(|_| "paused"),
        "resume" => st.admin.resume_schedule(task, id).map(|_| "resumed"),
        "delete" => st.admin.delete_schedule(task, id).map(|_| "deleted"),
        "create" => {
            let filled = |k: &str| field(k).map(str::trim).filter(|v| !v.is_empty());
            let Some(cron) = filled("cron") else {
                return Ok(Response::text(
                    400,
                    "the form gives no schedule (cron expression)\n",
                ));
            };
            let mut new = crate::admin::NewSchedule::new(task, cron).id(id);
            if let Some(z) = filled("time_zone") {
                new = new.time_zone(z);
            }
            if let Some(q) = filled("queue") {
                new = new.queue(q);
            }
            if let Some(a) = filled("args") {
                let value: serde_json::Value = serde_json::from_str(a).map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidInput,
                        format!(
                            "storing a schedule: its arguments are not JSON ({e}); give a JSON \
                             value such as {{\"office\": \"paris\"}}, or leave the field empty \
                             for null"
                        ),
                    )
                })?;
                new = new.args(&value);
            }
            st.admin.create_schedule(&new).map(|_| "created")
        }
        _ => return Ok(Response::text(404, "no such action\n")),
    };
    match res {
        Ok(done) => Ok(Response::redirect(
            st.link(&format!("/periodic?done={done}")),
        )),
        Err(e) => Err(e),
    }
}
