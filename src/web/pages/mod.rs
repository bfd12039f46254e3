//! Routing, access checks and the pages. Each handler reads what it shows, renders it
//! with `html.rs`, and returns a response; a database error becomes an error page whose
//! status says what kind of failure it was (503 for a database that cannot be reached in
//! time, 404 for a missing job, 409 for an action the job's status does not allow).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use maud::{html, Markup};

use super::html::{self, age, dash, opt_time, status, url_enc, Frame, Shown, Time};
use super::http::{Request, Response};
use super::queries;
use super::DashboardAuth;
use crate::admin::Admin;
use crate::app::App;
use crate::error::{Error, ErrorKind};
use crate::job::{JobId, JobStatus};

mod auth;
mod batch;
mod job;
mod jobs;
mod overview;
mod periodic;
mod workers;
mod workflow;

use auth::*;
use batch::*;
use job::*;
use jobs::*;
use overview::*;
use periodic::*;
use workers::*;
use workflow::*;

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
    /// The path the dashboard is served under: `""` at the root of its own server.
    pub(crate) base: String,
    /// Requests to any host name are answered (the host program guards access).
    pub(crate) any_host: bool,
    /// Downloads reading through a cursor now, each holding a pooled connection until
    /// its body is sent (at most [`State::cursor_downloads`] at once).
    pub(crate) downloads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// How long the overview's figures are shared between requests.
const OVERVIEW_FRESH: Duration = Duration::from_secs(5);
/// Queues the overview lists, the first by name (paused ones are always listed).
const OVERVIEW_QUEUES: usize = 200;

pub(crate) struct OverviewData {
    /// The first [`OVERVIEW_QUEUES`] queues by name (and every paused one).
    counts: Vec<crate::admin::QueueCounts>,
    /// Whether more queues have jobs than `counts` holds.
    more_queues: bool,
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
        let mut counts = self.admin.stats_first(
            crate::admin::StatsBy::Queue,
            None,
            Some(OVERVIEW_QUEUES as i64 + 1),
        )?;
        // Paused queues past the first ones are kept: a pause is always seen.
        let mut more_queues = false;
        let mut n = 0;
        counts.retain(|c| {
            n += 1;
            let keep = n <= OVERVIEW_QUEUES || c.paused;
            more_queues |= !keep;
            keep
        });
        let workers = self.admin.workers()?;
        let pauses = self.admin.paused()?;
        let data = Arc::new(OverviewData {
            counts,
            more_queues,
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

    fn footer(&self) -> Markup {
        html! {
            p.dim.footer {
                (self.queries) " quer" (if self.queries == 1 { "y" } else { "ies" })
                " in " (self.started.elapsed().as_millis()) " ms"
            }
        }
    }
}

impl State {
    /// A path of the dashboard as a link: under its base path.
    pub(crate) fn link(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn frame(&self) -> Frame<'_> {
        Frame {
            base: &self.base,
            read_only: self.read_only,
        }
    }

    /// A whole page: the frame around `body`.
    pub(crate) fn page(
        &self,
        status: u16,
        title: &str,
        active: &str,
        refresh: Option<u32>,
        body: Markup,
    ) -> Response {
        let markup = html::page(&self.frame(), title, active, refresh, body);
        Response::html(status, markup.into_string())
    }
}

/// The checks a request meets before its page: the local-host guard and the auth
/// (`gate`), and those of a change (`refusal`: read-only, origin, CSRF); each as the status
/// it would be answered with, `None` when it passes. The fuzz targets' way in.
#[cfg(feature = "fuzzing")]
pub(crate) fn checks(st: &State, req: &Request) -> (Option<u16>, Option<u16>) {
    let gate =
        if st.auth.is_none() && !st.any_host && !req.header("host").is_some_and(is_local_host) {
            Some(403)
        } else {
            check_auth(st, req).map(|r| r.status)
        };
    (gate, refusal(st, req).map(|r| r.status))
}

/// [`auth::local_path`] and [`auth::base64_decode`], for the fuzz targets.
#[cfg(feature = "fuzzing")]
pub(crate) fn helpers(s: &str) -> (String, Option<Vec<u8>>, bool) {
    (local_path(s), base64_decode(s), is_local_host(s))
}

pub(crate) fn handle(st: &State, req: &Request) -> Response {
    if !st.base.is_empty() {
        // Routes see the path under the base path.
        let Some(rest) = req.path.strip_prefix(st.base.as_str()) else {
            return Response::text(404, "not under the dashboard's base path\n");
        };
        if !(rest.is_empty() || rest.starts_with('/')) {
            return Response::text(404, "not under the dashboard's base path\n");
        }
        let mut inner = req.clone();
        inner.path = if rest.is_empty() {
            "/".to_owned()
        } else {
            rest.to_owned()
        };
        return handle_under_base(st, &inner);
    }
    handle_under_base(st, req)
}

fn handle_under_base(st: &State, req: &Request) -> Response {
    if st.auth.is_none() && !st.any_host && !req.header("host").is_some_and(is_local_host) {
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
        "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; \
         img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    )
}

fn route(st: &State, req: &Request) -> Result<Response, Error> {
    let path = req.path.trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match (req.method.as_str(), segments.as_slice()) {
        ("GET" | "HEAD", [] | [""]) => overview(st, req),
        ("GET" | "HEAD", ["jobs"]) => jobs(st, req),
        ("GET" | "HEAD", ["jobs", id]) => job(st, parse_id(id)?, None, req.param("done")),
        ("POST", ["jobs", "bulk"]) => bulk(st, req),
        ("GET" | "HEAD", ["jobs", id, file]) if file.ends_with(".json") => {
            download(st, parse_id(id)?, file)
        }
        ("POST", ["jobs", id, action]) => act(st, req, parse_id(id)?, action),
        ("POST", ["queues", action]) => act_queue(st, req, action),
        ("GET" | "HEAD", ["batches", id]) => batch(st, parse_batch_id(id)?),
        ("GET" | "HEAD", ["workflows", id]) => {
            workflow(st, parse_workflow_id(id)?, None, req.param("done"))
        }
        ("POST", ["workflows", id, action]) => {
            act_workflow(st, req, parse_workflow_id(id)?, action)
        }
        ("GET" | "HEAD", ["workers"]) => workers(st, req.param("done")),
        ("POST", ["workers", action]) => act_workers(st, req, action),
        ("GET" | "HEAD", ["periodic"]) => periodic(st, req.param("done")),
        ("POST", ["periodic", action]) => act_periodic(st, req, action),
        ("GET" | "HEAD", ["static", "live.js"]) => Ok(Response {
            status: 200,
            headers: vec![("Content-Type", "text/javascript; charset=utf-8".to_owned())],
            body: super::http::Body::Full(html::LIVE_JS.as_bytes().to_vec()),
        }),
        ("GET" | "HEAD", ["health"]) => {
            let v = st.admin.check_schema()?;
            Ok(Response::text(200, format!("ok: schema version {v}\n")))
        }
        (
            _,
            ["jobs", _, _] | ["queues", _] | ["workers", _] | ["periodic", _] | ["workflows", _, _],
        ) => {
            Ok(Response::text(405, "use POST\n").header("Allow", "POST"))
        }
        ("GET" | "HEAD" | "POST", _) => Ok(st.page(
            404,
            "Not found",
            "",
            None,
            html! { h1 { "Not found" } p { "No such page. " a href=(st.link("/")) { "Overview" } } },
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
        // Another session holds the job's row locked: a conflict to retry, not a gateway's.
        _ if e.sqlstate() == Some("55P03") => 409,
        ErrorKind::NotFound => 404,
        ErrorKind::InvalidInput => 400,
        ErrorKind::InvalidState | ErrorKind::AlreadyEnqueued => 409,
        ErrorKind::Timeout => 504,
        ErrorKind::Connect
        | ErrorKind::DatabaseMissing
        | ErrorKind::Closed
        | ErrorKind::Shutdown
        | ErrorKind::SchemaMissing
        | ErrorKind::SchemaOutdated => 503,
        _ => 500,
    };
    if code >= 500 {
        log::warn!("dashboard: {e}");
    }
    let body = html! {
        h1 { "Error" }
        p.flash.bad { (Shown(&e.to_string())) }
        @if matches!(code, 503 | 504) {
            p {
                "The database did not answer in time or cannot be reached: this page shows \
                 the error instead of waiting. It reloads every 10 s."
            }
        }
        p { a href=(st.link("/")) { "Overview" } }
    };
    let refresh = if code >= 500 { Some(10) } else { None };
    st.page(code, "Error", "", refresh, body)
}

// --- access --------------------------------------------------------------------------
