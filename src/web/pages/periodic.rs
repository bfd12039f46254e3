//! The periodic page: each schedule with its last and next instants.

use super::*;

pub(super) fn periodic(st: &State) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let rows = {
        let mut conn = st.app.connection()?;
        queries::periodic(&mut conn)?
    };
    cost.queries += 1;
    let now = SystemTime::now();
    let in_or_overdue = |next: SystemTime| -> String {
        let when = match next.duration_since(now) {
            Ok(d) => format!("in {}", age(d)),
            Err(e) => format!("<span class=err>overdue by {}</span>", age(e.duration())),
        };
        format!("{} ({when})", time(next))
    };
    // Schedules known from the program, then those only the database knows.
    let mut lines: Vec<(
        String,
        String,
        String,
        Option<&queries::PeriodicRow>,
        String,
    )> = Vec::new();
    for s in &st.schedules {
        let row = rows
            .iter()
            .find(|r| r.task == s.task() && r.periodic_id == s.id);
        let next = match s.next_after(now) {
            Some(n) => in_or_overdue(n),
            None => "<span class=dim>never</span>".to_owned(),
        };
        lines.push((
            s.task().to_owned(),
            s.id.clone(),
            format!("<code>{}</code>", esc(s.schedule())),
            row,
            next,
        ));
    }
    for r in &rows {
        if lines.iter().any(|l| l.0 == r.task && l.1 == r.periodic_id) {
            continue;
        }
        let next = match r.previous {
            Some(prev) => match r.last.duration_since(prev) {
                Ok(step) if !step.is_zero() => {
                    format!(
                        "{} <span class=dim>(inferred)</span>",
                        in_or_overdue(r.last + step)
                    )
                }
                _ => "<span class=dim>–</span>".to_owned(),
            },
            None => "<span class=dim>after a second instant</span>".to_owned(),
        };
        lines.push((
            r.task.clone(),
            r.periodic_id.clone(),
            "<span class=dim>not known here</span>".to_owned(),
            Some(r),
            next,
        ));
    }
    let mut b = String::from("<h1>Periodic schedules</h1>");
    if lines.is_empty() {
        b.push_str("<p class=dim>No periodic instant has been deferred yet.</p>");
    } else {
        b.push_str(
            "<p class=dim>Schedules live in the workers' code. Those this dashboard was given \
             show their exact next instant; for the others it is inferred from the distance \
             between the last two instants recorded.</p>\
             <table><tr><th>Task</th><th>Periodic id</th><th>Schedule</th><th>Last instant</th>\
             <th>Its job</th><th>Next instant</th><th>Instants kept</th></tr>",
        );
        for (task, id, schedule, row, next) in &lines {
            let (last, job, kept) = match row {
                Some(p) => (
                    time(p.last),
                    match (p.last_job, &p.last_status) {
                        (Some(id), Some(s)) => {
                            format!("<a href=\"/jobs/{id}\">{id}</a> {}", status(s))
                        }
                        (Some(id), None) => format!("{id} <span class=dim>(deleted)</span>"),
                        (None, _) => {
                            "<span class=dim>skipped (a job was still waiting)</span>".to_owned()
                        }
                    },
                    p.instants.to_string(),
                ),
                None => (
                    "<span class=dim>none yet</span>".to_owned(),
                    String::new(),
                    "0".to_owned(),
                ),
            };
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td><td>{schedule}</td><td>{last}</td><td>{job}</td>\
                 <td>{next}</td><td class=n>{kept}</td></tr>",
                esc(task),
                esc(id),
            );
        }
        b.push_str("</table>");
    }
    b.push_str(&cost.footer());
    Ok(Response::html(
        200,
        page("Periodic", "Periodic", Some(30), st.read_only, &b),
    ))
}
