//! Routing, access checks and the pages. Each handler reads what it shows, renders it
//! with `html.rs`, and returns a response; a database error becomes an error page whose
//! status says what kind of failure it was (503 for a database that cannot be reached in
//! time, 404 for a missing job, 409 for an action the job's status does not allow).

use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::html::{self, age, esc, opt_time, page, status, time, url_enc};
use super::http::{Request, Response};
use super::queries::{self, JobQuery};
use super::DashboardAuth;
use crate::admin::Admin;
use crate::app::App;
use crate::error::{Error, ErrorKind};
use crate::job::{JobId, JobStatus};

/// Jobs per page of the jobs list.
const PAGE: i64 = 50;
const TOKEN_COOKIE: &str = "postpone_token";

pub(crate) struct State {
    pub(crate) admin: Admin,
    pub(crate) app: App,
    pub(crate) read_only: bool,
    pub(crate) auth: Option<DashboardAuth>,
    pub(crate) csrf: String,
    pub(crate) stalled_after: Duration,
    /// The overview's figures and when they were read: every viewer within
    /// [`OVERVIEW_FRESH`] shares one read (the counts scan the jobs table).
    pub(crate) overview: Mutex<Option<(Instant, Arc<OverviewData>)>>,
    /// Schedules the program registered, from `Dashboard::schedules`.
    pub(crate) schedules: Vec<crate::periodic::PeriodicOptions>,
}

/// How long the overview's figures are shared between requests.
const OVERVIEW_FRESH: Duration = Duration::from_secs(5);

pub(crate) struct OverviewData {
    counts: Vec<crate::admin::QueueCounts>,
    minutes: Vec<html::Minute>,
    workers: Vec<crate::admin::WorkerInfo>,
    pauses: crate::admin::Pauses,
    took: Duration,
}

impl State {
    /// The overview's figures, read again if older than [`OVERVIEW_FRESH`]; the flag says
    /// whether this call read them. Two requests that find them stale may both read: the
    /// lock is never held across SQL.
    fn overview_data(&self) -> Result<(Arc<OverviewData>, bool), Error> {
        let lock = || self.overview.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, data)) = lock().as_ref() {
            if at.elapsed() < OVERVIEW_FRESH {
                return Ok((data.clone(), false));
            }
        }
        let started = Instant::now();
        let counts = self.admin.counts()?;
        let minutes = {
            let mut conn = self.app.connection()?;
            queries::throughput(&mut conn)?
        };
        let workers = self.admin.workers()?;
        let pauses = self.admin.paused()?;
        let data = Arc::new(OverviewData {
            counts,
            minutes,
            workers,
            pauses,
            took: started.elapsed(),
        });
        *lock() = Some((Instant::now(), data.clone()));
        Ok((data, true))
    }
}

/// What a page cost: its round-trips and its time, shown in its footer.
struct Cost {
    started: Instant,
    queries: u32,
}

impl Cost {
    fn new() -> Cost {
        Cost {
            started: Instant::now(),
            queries: 0,
        }
    }

    fn footer(&self) -> String {
        format!(
            "<p class=dim>{} quer{} in {} ms</p>",
            self.queries,
            if self.queries == 1 { "y" } else { "ies" },
            self.started.elapsed().as_millis()
        )
    }
}

pub(crate) fn handle(st: &State, req: &Request) -> Response {
    if st.auth.is_none() && !req.header("host").is_some_and(is_local_host) {
        // Without auth, a page of another site could reach a loopback dashboard through a
        // host name that it points at 127.0.0.1 (DNS rebinding), read the CSRF token and
        // post. Such a request names that host: refuse any name but an address or localhost.
        return Response::text(
            403,
            "this dashboard has no access control, so it answers only requests addressed to \
             an IP address or localhost; set POSTPONE_DASHBOARD_TOKEN (or a user and password) \
             to serve it under a host name\n",
        );
    }
    if let Some(denied) = check_auth(st, req) {
        return denied;
    }
    let resp = route(st, req).unwrap_or_else(|e| error_page(st, &e));
    resp.header(
        "Content-Security-Policy",
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
    )
}

fn route(st: &State, req: &Request) -> Result<Response, Error> {
    let path = req.path.trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match (req.method.as_str(), segments.as_slice()) {
        ("GET" | "HEAD", [] | [""]) => overview(st),
        ("GET" | "HEAD", ["jobs"]) => jobs(st, req),
        ("GET" | "HEAD", ["jobs", id]) => job(st, parse_id(id)?, None, req.param("done")),
        ("POST", ["jobs", id, action]) => act(st, req, parse_id(id)?, action),
        ("POST", ["queues", action]) => act_queue(st, req, action),
        ("GET" | "HEAD", ["workers"]) => workers(st),
        ("GET" | "HEAD", ["periodic"]) => periodic(st),
        ("GET" | "HEAD", ["health"]) => {
            let v = st.admin.check_schema()?;
            Ok(Response::text(200, format!("ok: schema version {v}\n")))
        }
        (_, ["jobs", _, _] | ["queues", _]) => {
            Ok(Response::text(405, "use POST\n").header("Allow", "POST"))
        }
        ("GET" | "HEAD" | "POST", _) => Ok(Response::html(
            404,
            page(
                "Not found",
                "",
                None,
                st.read_only,
                "<h1>Not found</h1><p>No such page. <a href=\"/\">Overview</a></p>",
            ),
        )),
        _ => Ok(Response::text(405, "method not allowed\n").header("Allow", "GET, POST")),
    }
}

fn parse_id(s: &str) -> Result<JobId, Error> {
    s.trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .map(JobId)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("{s:?} is not a job id: use a positive whole number"),
            )
        })
}

fn error_page(st: &State, e: &Error) -> Response {
    let code = match e.kind() {
        ErrorKind::NotFound => 404,
        ErrorKind::InvalidInput => 400,
        ErrorKind::InvalidState | ErrorKind::AlreadyEnqueued => 409,
        ErrorKind::Timeout => 504,
        ErrorKind::Connect
        | ErrorKind::Closed
        | ErrorKind::Shutdown
        | ErrorKind::SchemaMissing
        | ErrorKind::SchemaOutdated => 503,
        _ => 500,
    };
    if code >= 500 {
        log::warn!("dashboard: {e}");
    }
    let hint = match code {
        503 | 504 => {
            "<p>The database did not answer in time or cannot be reached: this page \
                      shows the error instead of waiting. It reloads every 10 s.</p>"
        }
        _ => "",
    };
    let body = format!(
        "<h1>Error</h1><p class=\"flash bad\">{}</p>{hint}<p><a href=\"/\">Overview</a></p>",
        esc(&e.to_string())
    );
    let refresh = if code >= 500 { Some(10) } else { None };
    Response::html(code, page("Error", "", refresh, st.read_only, &body))
}

// --- access --------------------------------------------------------------------------

fn check_auth(st: &State, req: &Request) -> Option<Response> {
    let auth = st.auth.as_ref()?;
    match auth {
        DashboardAuth::Token(token) => {
            let bearer = req
                .header("authorization")
                .and_then(|h| h.strip_prefix("Bearer "))
                .map(str::trim);
            let cookie = req.header("cookie").and_then(|c| {
                c.split(';').find_map(|kv| {
                    let (k, v) = kv.trim().split_once('=')?;
                    (k == TOKEN_COOKIE).then(|| super::http::parse_pairs(&format!("v={v}")))
                })
            });
            let cookie = cookie.and_then(|p| p.into_iter().next()).map(|(_, v)| v);
            if bearer.is_some_and(|b| same(b, token))
                || cookie.as_deref().is_some_and(|c| same(c, token))
            {
                return None;
            }
            if let Some(t) = req.param("token") {
                if same(t, token) && req.method == "GET" {
                    // Keep it in a cookie and drop it from the address bar.
                    let rest: Vec<String> = req
                        .query
                        .iter()
                        .filter(|(k, _)| k != "token")
                        .map(|(k, v)| format!("{}={}", url_enc(k), url_enc(v)))
                        .collect();
                    let mut to = local_path(&req.path);
                    if !rest.is_empty() {
                        to = format!("{to}?{}", rest.join("&"));
                    }
                    return Some(Response::redirect(to).header(
                        "Set-Cookie",
                        format!(
                            "{TOKEN_COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
                            url_enc(token)
                        ),
                    ));
                }
            }
            Some(Response::text(
                401,
                "the dashboard needs its token: open it once with ?token=... or send \
                 Authorization: Bearer ...\n",
            ))
        }
        DashboardAuth::Basic { user, password } => {
            let ok = req
                .header("authorization")
                .and_then(|h| h.strip_prefix("Basic "))
                .and_then(|b| base64_decode(b.trim()))
                .and_then(|raw| String::from_utf8(raw).ok())
                .and_then(|pair| {
                    let (u, p) = pair.split_once(':')?;
                    // Both compared, whatever the first says.
                    Some(same(u, user) & same(p, password))
                })
                .unwrap_or(false);
            if ok {
                None
            } else {
                Some(
                    Response::text(401, "the dashboard needs a user name and password\n").header(
                        "WWW-Authenticate",
                        "Basic realm=\"postpone\", charset=\"UTF-8\"",
                    ),
                )
            }
        }
    }
}

/// `127.0.0.1:8080`, `[::1]:8080`, `localhost`, `10.0.0.5`: an address or localhost, with
/// or without a port.
fn is_local_host(host: &str) -> bool {
    let digits = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit());
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').is_some_and(|(addr, tail)| {
            addr.parse::<std::net::Ipv6Addr>().is_ok()
                && (tail.is_empty() || tail.strip_prefix(':').is_some_and(digits))
        });
    }
    let name = match host.rsplit_once(':') {
        Some((h, port)) if digits(port) => h,
        _ => host,
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// A path of ours to redirect to: never `//host` (which a browser reads as another site).
fn local_path(p: &str) -> String {
    let p = p.trim_start_matches('/');
    format!(
        "/{}",
        p.split('/').map(url_enc).collect::<Vec<_>>().join("/")
    )
}

/// Compares secrets in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=').as_bytes();
    if s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= val(*c)? << (18 - 6 * i);
        }
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    Some(out)
}

// --- actions -------------------------------------------------------------------------

/// The refusal of a change (read-only, cross-origin, no or a stale form token), if any.
fn refusal(st: &State, req: &Request) -> Option<Response> {
    if st.read_only {
        return Some(Response::text(
            403,
            "the dashboard is read-only: retry, cancel, abort, pause and resume are refused\n",
        ));
    }
    if let (Some(origin), Some(host)) = (req.header("origin"), req.header("host")) {
        let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
        if origin != "null" && origin_host != host {
            return Some(Response::text(403, "cross-origin request refused\n"));
        }
    }
    let form = req.form();
    let token = form
        .iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    if !same(token, &st.csrf) {
        return Some(Response::text(
            403,
            "missing or stale form token: reload the page and try again\n",
        ));
    }
    None
}

/// Pauses or resumes the queue named by the form's `queue` field (every queue without one),
/// then shows the overview again (its figures read afresh).
fn act_queue(st: &State, req: &Request, action: &str) -> Result<Response, Error> {
    if let Some(r) = refusal(st, req) {
        return Ok(r);
    }
    let form = req.form();
    let queue = form
        .iter()
        .find(|(k, _)| k == "queue")
        .map(|(_, v)| v.as_str());
    let res = match (action, queue) {
        ("pause", Some(q)) => st.admin.pause(q).map(drop),
        ("resume", Some(q)) => st.admin.resume(q).map(drop),
        ("pause", None) => st.admin.pause_all().map(drop),
        ("resume", None) => st.admin.resume_all().map(drop),
        _ => return Ok(Response::text(404, "no such action\n")),
    };
    match res {
        Ok(()) => {
            *st.overview.lock().unwrap_or_else(|e| e.into_inner()) = None;
            Ok(Response::redirect("/".to_owned()))
        }
        Err(e) if e.kind() == ErrorKind::InvalidInput => Ok(Response::text(400, format!("{e}\n"))),
        Err(e) => Err(e),
    }
}

fn act(st: &State, req: &Request, id: JobId, action: &str) -> Result<Response, Error> {
    if let Some(r) = refusal(st, req) {
        return Ok(r);
    }
    let result = match action {
        "retry" => st.admin.retry(id).map(|()| "retried"),
        "cancel" => st.admin.cancel(id).map(|()| "cancelled"),
        "abort" => st.admin.abort(id).map(|o| match o {
            crate::AbortOutcome::Requested => "abort-requested",
            _ => "cancelled",
        }),
        _ => return Ok(Response::text(404, "no such action\n")),
    };
    match result {
        Ok(done) => Ok(Response::redirect(format!("/jobs/{id}?done={done}"))),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::InvalidState | ErrorKind::AlreadyEnqueued
            ) =>
        {
            let mut resp = job(st, id, Some(&e.to_string()), None)?;
            resp.status = 409;
            Ok(resp)
        }
        Err(e) => Err(e),
    }
}

// --- pages ---------------------------------------------------------------------------

fn overview(st: &State) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let (data, fresh) = st.overview_data()?;
    if fresh {
        // Counts (and the pauses they show), throughput, workers, pauses.
        cost.queries += 5;
    }
    let (counts, minutes, workers) = (&data.counts, &data.minutes, &data.workers);
    let stalled = workers
        .iter()
        .filter(|w| w.heartbeat_age > st.stalled_after)
        .count();

    let mut b = String::new();
    b.push_str("<h1>Overview</h1><h2>Queues</h2>");
    // A pause button (or resume) for a queue, or for every queue with `None`.
    let flow_button = |queue: Option<&str>, paused: bool| -> String {
        if st.read_only {
            return String::new();
        }
        let (action, label) = if paused {
            ("resume", "Resume")
        } else {
            ("pause", "Pause")
        };
        let (field, id) = match queue {
            Some(q) => (
                format!("<input type=hidden name=queue value=\"{}\">", esc(q)),
                String::new(),
            ),
            None => (String::new(), format!(" id=\"{action}-all\"")),
        };
        format!(
            "<form class=inline method=post action=\"/queues/{action}\">{field}\
             <input type=hidden name=csrf value=\"{}\">\
             <button name=go value=1{id}>{label}{}</button></form>",
            esc(&st.csrf),
            if queue.is_none() { " every queue" } else { "" }
        )
    };
    if let Some(at) = data.pauses.all {
        let _ = write!(
            b,
            "<p class=err>Every queue is paused (since {} UTC): no job starts. {}</p>",
            esc(&crate::admin::rfc3339(at)),
            flow_button(None, true)
        );
    } else {
        let _ = write!(b, "<p>{}</p>", flow_button(None, false));
    }
    if counts.is_empty() {
        b.push_str("<p class=dim>No jobs yet.</p>");
    } else {
        b.push_str(
            "<table><tr><th>Queue</th><th>Due</th><th>Scheduled</th><th>Running</th>\
             <th>Succeeded</th><th>Failed</th><th>Cancelled</th><th>Aborted</th>\
             <th>Oldest due job waits</th><th>Flow</th></tr>",
        );
        let link = |q: &str, s: &str, n: u64| -> String {
            if n == 0 {
                "<td class=\"n dim\">0</td>".to_owned()
            } else {
                format!(
                    "<td class=n><a href=\"/jobs?queue={}&amp;status={s}\">{n}</a></td>",
                    url_enc(q)
                )
            }
        };
        for c in counts {
            let _ = write!(
                b,
                "<tr><td><a href=\"/jobs?queue={}\">{}</a></td>{}{}{}{}{}{}{}<td class=n>{}</td><td>{}</td></tr>",
                url_enc(&c.queue),
                esc(&c.queue),
                link(&c.queue, "todo", c.todo),
                link(&c.queue, "todo", c.scheduled),
                link(&c.queue, "doing", c.doing),
                link(&c.queue, "succeeded", c.succeeded),
                link(&c.queue, "failed", c.failed),
                link(&c.queue, "cancelled", c.cancelled),
                link(&c.queue, "aborted", c.aborted),
                c.oldest_todo_age.map(age).unwrap_or_else(|| "–".to_owned()),
                {
                    // Its own pause can be lifted here; the pause of all, above.
                    let own = data.pauses.queues.iter().any(|p| p.queue.as_deref() == Some(c.queue.as_str()));
                    let mark = if c.paused { "<span class=err>paused</span> " } else { "" };
                    let button = if data.pauses.all.is_some() && !own {
                        String::new()
                    } else {
                        flow_button(Some(&c.queue), own)
                    };
                    format!("{mark}{button}")
                },
            );
        }
        b.push_str("</table>");
    }
    b.push_str("<h2>Last hour</h2>");
    b.push_str(&html::throughput_svg(minutes));
    b.push_str(
        "<p class=dim>Jobs finished per minute (jobs deleted on completion are not counted).</p>",
    );
    let _ = write!(
        b,
        "<h2>Workers</h2><p><a href=\"/workers\">{} registered</a>{}</p>",
        workers.len(),
        if stalled > 0 {
            format!(", <span class=err>{stalled} stalled</span>")
        } else {
            String::new()
        }
    );
    b.push_str(&cost.footer());
    if !fresh {
        b.push_str("<p class=dim>(figures shared with a request of the last 5 s)</p>");
    }
    // A table large enough to make the figures slow is reloaded less often.
    let refresh = if data.took > Duration::from_millis(500) {
        30
    } else {
        10
    };
    Ok(Response::html(
        200,
        page("Overview", "Overview", Some(refresh), st.read_only, &b),
    ))
}

fn jobs(st: &State, req: &Request) -> Result<Response, Error> {
    if let Some(id) = req.param("id") {
        let id = parse_id(id)?;
        return Ok(Response::redirect(format!("/jobs/{id}")));
    }
    let status_filter = match req.param("status") {
        Some(s) => Some(
            s.parse::<JobStatus>()
                .map_err(|e| Error::new(ErrorKind::InvalidInput, e.to_string()))?
                .as_str()
                .to_owned(),
        ),
        None => None,
    };
    let cursor = |name: &str| -> Result<Option<i64>, Error> {
        req.param(name)
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    Error::new(ErrorKind::InvalidInput, format!("bad {name} cursor {v:?}"))
                })
            })
            .transpose()
    };
    let q = JobQuery {
        queue: req.param("queue").map(str::to_owned),
        task: req.param("task").map(str::to_owned),
        status: status_filter,
        lock: req.param("lock").map(str::to_owned),
        before: cursor("before")?,
        after: cursor("after")?,
    };
    let mut cost = Cost::new();
    let (rows, more) = {
        let mut conn = st.app.connection()?;
        queries::jobs(&mut conn, &q, PAGE)?
    };
    cost.queries += 1;

    let mut b = String::from("<h1>Jobs</h1>");
    // Filters (GET: the address is the state; works without script).
    b.push_str("<form class=filters method=get action=\"/jobs\">");
    for (name, v) in [("queue", &q.queue), ("task", &q.task), ("lock", &q.lock)] {
        let _ = write!(
            b,
            "<label>{name} <input name={name} value=\"{}\" size=14></label>",
            esc(v.as_deref().unwrap_or(""))
        );
    }
    b.push_str("<label>status <select name=status><option value=\"\">any</option>");
    for s in [
        "todo",
        "doing",
        "succeeded",
        "failed",
        "cancelled",
        "aborted",
    ] {
        let sel = if q.status.as_deref() == Some(s) {
            " selected"
        } else {
            ""
        };
        let _ = write!(b, "<option{sel}>{s}</option>");
    }
    b.push_str("</select></label><button>Filter</button> <a href=\"/jobs\">clear</a></form>");
    b.push_str(
        "<form class=filters method=get action=\"/jobs\"><label>Jump to job \
         <input name=id size=10 inputmode=numeric></label><button>Go</button></form>",
    );

    let filters: String = [
        ("queue", &q.queue),
        ("task", &q.task),
        ("status", &q.status),
        ("lock", &q.lock),
    ]
    .iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}&amp;", url_enc(v))))
    .collect();
    let (has_newer, has_older) = if q.after.is_some() && q.before.is_none() {
        (more, !rows.is_empty())
    } else {
        (q.before.is_some(), more)
    };
    let mut nav = String::from("<nav class=pages>");
    if has_newer {
        let _ = write!(nav, "<a href=\"/jobs?{filters}\">« newest</a>");
        if let Some(first) = rows.first() {
            let _ = write!(
                nav,
                "<a href=\"/jobs?{filters}after={}\">‹ newer</a>",
                first.id
            );
        }
    }
    if has_older {
        if let Some(last) = rows.last() {
            let _ = write!(
                nav,
                "<a href=\"/jobs?{filters}before={}\">older ›</a>",
                last.id
            );
        }
    }
    nav.push_str("</nav>");

    if rows.is_empty() {
        b.push_str("<p class=dim>No jobs match.</p>");
    } else {
        b.push_str(&nav);
        b.push_str(
            "<table><tr><th>Id</th><th>Queue</th><th>Task</th><th>Status</th><th>Priority</th>\
             <th>Attempts</th><th>Lock</th><th>Scheduled</th><th>Finished</th><th>Arguments</th></tr>",
        );
        for j in &rows {
            let _ = write!(
                b,
                "<tr><td><a href=\"/jobs/{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td>\
                 <td class=n>{}</td><td class=n>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                esc(&j.queue),
                esc(&j.task),
                status(&j.status),
                j.priority,
                j.attempts,
                esc(j.lock.as_deref().unwrap_or("")),
                time(j.scheduled_at),
                opt_time(j.finished_at),
                esc(&j.args),
                id = j.id,
            );
        }
        b.push_str("</table>");
        b.push_str(&nav);
    }
    b.push_str(&cost.footer());
    Ok(Response::html(
        200,
        page("Jobs", "Jobs", None, st.read_only, &b),
    ))
}

fn job(
    st: &State,
    id: JobId,
    problem: Option<&str>,
    done: Option<&str>,
) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let d = st.admin.job(id)?;
    cost.queries += 1;
    let j = &d.job;
    let mut b = String::new();
    let _ = write!(
        b,
        "<h1>Job {} <small>{}</small></h1>",
        j.id,
        status(j.status.as_str())
    );
    if let Some(p) = problem {
        let _ = write!(b, "<p class=\"flash bad\">{}</p>", esc(p));
    }
    // Fixed texts only: a crafted link cannot make the page say anything else.
    let done_text = match done {
        Some("retried") => Some("Retried: the job is waiting again."),
        Some("cancelled") => Some("Cancelled: the job will not run."),
        Some("abort-requested") => {
            Some("Abort requested: the task is told and the job ends aborted.")
        }
        _ => None,
    };
    if let Some(t) = done_text {
        let _ = write!(b, "<p class=flash>{t}</p>");
    }

    if !st.read_only {
        b.push_str("<p>");
        let mut button = |action: &str, label: &str, enabled: bool| {
            if enabled {
                let _ = write!(
                    b,
                    "<form class=inline method=post action=\"/jobs/{}/{action}\">\
                     <input type=hidden name=csrf value=\"{}\">\
                     <button name=go value=1 id=\"{action}\">{label}</button></form> ",
                    j.id,
                    esc(&st.csrf)
                );
            }
        };
        let s = j.status;
        button(
            "retry",
            "Retry",
            matches!(
                s,
                JobStatus::Failed | JobStatus::Cancelled | JobStatus::Aborted
            ),
        );
        button("cancel", "Cancel", s == JobStatus::Todo);
        button(
            "abort",
            "Abort",
            s == JobStatus::Doing && !j.abort_requested,
        );
        b.push_str("</p>");
    }

    b.push_str("<table>");
    let mut row = |k: &str, v: String| {
        let _ = write!(b, "<tr><th>{k}</th><td>{v}</td></tr>");
    };
    row(
        "Queue",
        format!(
            "<a href=\"/jobs?queue={}\">{}</a>",
            url_enc(&j.queue),
            esc(&j.queue)
        ),
    );
    row(
        "Task",
        format!(
            "<a href=\"/jobs?task={}\">{}</a>",
            url_enc(&j.task),
            esc(&j.task)
        ),
    );
    row("Priority", j.priority.to_string());
    row("Attempts", j.attempts.to_string());
    row(
        "Lock",
        j.lock
            .as_deref()
            .map(|l| format!("<a href=\"/jobs?lock={}\">{}</a>", url_enc(l), esc(l)))
            .unwrap_or_default(),
    );
    row(
        "Queueing lock",
        esc(j.queueing_lock.as_deref().unwrap_or("")),
    );
    let worker = match (j.worker_id, &d.worker_name) {
        (Some(w), Some(name)) => format!("{} (id {w})", esc(name)),
        (Some(w), None) => format!("id {w} <span class=dim>(no longer registered)</span>"),
        (None, _) => String::new(),
    };
    row("Worker", worker);
    row(
        "Periodic",
        match (&d.periodic_id, d.periodic_instant) {
            (Some(pid), Some(at)) => format!(
                "instant {}{}",
                time(at),
                if pid.is_empty() {
                    String::new()
                } else {
                    format!(" (id {})", esc(pid))
                }
            ),
            _ => String::new(),
        },
    );
    if j.abort_requested {
        row("Abort", "requested".to_owned());
    }
    b.push_str("</table>");

    let args = pretty_json(j.args.get());
    let _ = write!(b, "<h2>Arguments</h2><pre id=args>{}</pre>", esc(&args));
    if let Some(output) = &d.output {
        let text = pretty_json(&output.to_string());
        let _ = write!(b, "<h2>Output</h2><pre id=output>{}</pre>", esc(&text));
    }
    if let Some(progress) = &d.progress {
        let text = pretty_json(&progress.to_string());
        let when = d
            .progress_at
            .map(|at| format!(" <small>(at {})</small>", esc(&time(at))))
            .unwrap_or_default();
        let _ = write!(
            b,
            "<h2>Progress{when}</h2><pre id=progress>{}</pre>",
            esc(&text)
        );
    }

    // Timeline: every instant the row and its errors record, in order.
    let mut events: Vec<(SystemTime, String)> = vec![(j.created_at, "deferred".to_owned())];
    if j.scheduled_at > j.created_at {
        events.push((j.scheduled_at, "scheduled to run".to_owned()));
    }
    for e in &d.errors {
        if let Some(at) = e.at {
            events.push((at, format!("attempt {} ended with an error", e.attempt)));
        }
    }
    if let Some(t) = j.started_at {
        events.push((t, format!("attempt {} started", j.attempts)));
    }
    if let Some(t) = j.finished_at {
        events.push((t, format!("finished: {}", j.status)));
    }
    events.sort_by_key(|e| e.0);
    b.push_str(
        "<h2>Timeline</h2><table><tr><th>When</th><th>After deferral</th><th>What</th></tr>",
    );
    for (at, what) in &events {
        let since = at.duration_since(j.created_at).unwrap_or_default();
        let _ = write!(
            b,
            "<tr><td>{}</td><td class=n>+{}</td><td>{}</td></tr>",
            time(*at),
            age(since),
            esc(what)
        );
    }
    b.push_str("</table>");

    b.push_str("<h2>Attempts with errors</h2>");
    if d.errors.is_empty() {
        b.push_str("<p class=dim>None.</p>");
    } else {
        b.push_str("<table id=errors><tr><th>Attempt</th><th>When</th><th>Error</th></tr>");
        for e in &d.errors {
            let _ = write!(
                b,
                "<tr><td class=n>{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
                e.attempt,
                opt_time(e.at),
                esc(&e.error)
            );
        }
        b.push_str("</table>");
    }
    b.push_str(&cost.footer());
    let active = matches!(j.status, JobStatus::Todo | JobStatus::Doing);
    Ok(Response::html(
        200,
        page(
            &format!("Job {}", j.id),
            "Jobs",
            if active { Some(5) } else { None },
            st.read_only,
            &b,
        ),
    ))
}

fn workers(st: &State) -> Result<Response, Error> {
    let mut cost = Cost::new();
    let ws = st.admin.workers()?;
    cost.queries += 1;
    let mut b = String::from("<h1>Workers</h1>");
    if ws.is_empty() {
        b.push_str("<p class=dim>No worker is registered.</p>");
    } else {
        let _ = write!(
            b,
            "<p class=dim>Marked stalled: no heartbeat for more than {}.</p>\
             <table><tr><th>Id</th><th>Name</th><th>Host</th><th>Pid</th><th>Queues</th>\
             <th>Concurrency</th><th>Heartbeat age</th><th>Claimed</th><th>Started</th></tr>",
            age(st.stalled_after)
        );
        for w in &ws {
            let stalled = w.heartbeat_age > st.stalled_after;
            let queues = match &w.queues {
                None => "<span class=dim>all</span>".to_owned(),
                Some(q) => q.iter().map(|q| esc(q)).collect::<Vec<_>>().join(", "),
            };
            let _ = write!(
                b,
                "<tr{}><td class=n>{}</td><td>{}</td><td>{}</td><td class=n>{}</td><td>{queues}</td>\
                 <td class=n>{}</td><td class=n>{}{}</td><td class=n>{}</td><td>{}</td></tr>",
                if stalled { " class=stalled" } else { "" },
                w.id,
                esc(&w.name),
                esc(&w.host),
                w.pid,
                w.concurrency,
                age(w.heartbeat_age),
                if stalled { " <strong class=err>stalled</strong>" } else { "" },
                w.claimed,
                time(w.started_at),
            );
        }
        b.push_str("</table>");
    }
    b.push_str(&cost.footer());
    Ok(Response::html(
        200,
        page("Workers", "Workers", Some(10), st.read_only, &b),
    ))
}

fn periodic(st: &State) -> Result<Response, Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
        assert!(!same("", "a"));
    }

    #[test]
    fn base64_decodes_basic_credentials() {
        assert_eq!(base64_decode("dXNlcjpwYXNz").unwrap(), b"user:pass");
        assert_eq!(base64_decode("YTpi").unwrap(), b"a:b");
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert!(base64_decode("***").is_none());
    }

    #[test]
    fn only_addresses_and_localhost_are_local_hosts() {
        for ok in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "[::1]:80",
            "localhost:8080",
            "LOCALHOST",
            "10.1.2.3:1",
        ] {
            assert!(is_local_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "[::1",
            "",
            "localhost.evil:80",
        ] {
            assert!(!is_local_host(bad), "{bad}");
        }
    }

    #[test]
    fn redirects_stay_on_this_site() {
        assert_eq!(local_path("//evil.example/x"), "/evil%2Eexample/x");
        assert_eq!(local_path("/jobs/1"), "/jobs/1");
    }
}

/// Indents JSON text two spaces a level, keeping every value's text as stored (numbers too
/// large for a float stay exact).
fn pretty_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = text.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                // An empty object or array stays on one line.
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                if matches!(chars.peek(), Some('}') | Some(']')) {
                    out.push(chars.next().unwrap_or(' '));
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod pretty_tests {
    use super::pretty_json;

    #[test]
    fn pretty_json_indents_and_keeps_numbers_and_strings_exact() {
        assert_eq!(
            pretty_json(r#"{"a": [1, 18446744073709551616], "b": {"s": "x, {y}: \"z\""}, "e": []}"#),
            "{\n  \"a\": [\n    1,\n    18446744073709551616\n  ],\n  \"b\": {\n    \"s\": \"x, {y}: \\\"z\\\"\"\n  },\n  \"e\": []\n}"
        );
        assert_eq!(pretty_json("null"), "null");
    }
}
