//! The web dashboard (feature `web`): [`Dashboard`] serves server-rendered pages of the
//! queue from threads of its own, next to a program's workers or from `postpone dashboard`.
//!
//! Pages: overview (jobs per queue and status, the last hour's throughput as an inline SVG
//! chart), jobs (filters, keyset pages, jump to an id), one job (arguments, attempts and
//! errors, timeline; retry, cancel and abort buttons), workers (stalled ones marked),
//! periodic schedules. No script anywhere: the pages work with JavaScript off and reload
//! themselves with an HTML refresh where the figures move.
//!
//! HTML comes from maud templates (`html.rs`, `pages/`): every value spliced into a page is
//! escaped at compile time, and raw markup has to be written `PreEscaped`.
//!
//! How it fails: every database call goes through the App's pool, so under its
//! `pool_timeout` and `io_timeout`; a database that is down or half-open gives an error
//! page within those deadlines, never a hung request. Changes (retry, cancel, abort) are
//! POST forms carrying a per-process CSRF token, refused in read-only mode; cross-origin
//! POSTs are refused. Access can require a token or basic auth ([`DashboardAuth`]).
//! Request threads are bounded and never wait on a client: one I/O thread reads and writes
//! every connection, each request must arrive within `read_timeout` and its response be
//! written within `response_timeout`, so slow clients cannot hold the others up (see
//! `http.rs`).

mod charts;
mod html;
mod http;
mod mount;
mod pages;
mod queries;

pub use mount::{BodyReader, DashboardHandler, DashboardRequest, DashboardResponse};

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use crate::app::App;
use crate::error::{Error, ErrorKind, Result};
use crate::store;

use http::{Request, Response, Server, ServerOptions};

/// Who may see the dashboard; from [`DashboardAuth::from_env`] or set by the program.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DashboardAuth {
    /// A secret token: sent as `Authorization: Bearer <token>`, or once as `?token=<token>`
    /// in a browser (the dashboard then keeps it in an HTTP-only, same-site cookie).
    Token(String),
    /// HTTP basic authentication with one user name and password.
    Basic {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
}

impl std::fmt::Debug for DashboardAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DashboardAuth::Token(_) => f.write_str("Token(..)"),
            DashboardAuth::Basic { user, .. } => write!(f, "Basic {{ user: {user:?}, .. }}"),
        }
    }
}

/// Environment variable holding a [`DashboardAuth::Token`].
pub const TOKEN_ENV: &str = "POSTPONE_DASHBOARD_TOKEN";
/// Environment variable holding the user of [`DashboardAuth::Basic`].
pub const USER_ENV: &str = "POSTPONE_DASHBOARD_USER";
/// Environment variable holding the password of [`DashboardAuth::Basic`].
pub const PASSWORD_ENV: &str = "POSTPONE_DASHBOARD_PASSWORD";

impl DashboardAuth {
    /// Reads `POSTPONE_DASHBOARD_TOKEN`, or `POSTPONE_DASHBOARD_USER` with
    /// `POSTPONE_DASHBOARD_PASSWORD`; `None` when none is set. Setting a token and a user,
    /// or a user without a password, is an error of kind `Config`.
    pub fn from_env() -> Result<Option<DashboardAuth>> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        match (get(TOKEN_ENV), get(USER_ENV), get(PASSWORD_ENV)) {
            (None, None, None) => Ok(None),
            (Some(t), None, None) => Ok(Some(DashboardAuth::Token(t))),
            (None, Some(user), Some(password)) => Ok(Some(DashboardAuth::Basic { user, password })),
            (Some(_), _, _) => Err(Error::new(
                ErrorKind::Config,
                format!("dashboard auth: set either {TOKEN_ENV} or {USER_ENV} and {PASSWORD_ENV}, not both"),
            )),
            (None, _, _) => Err(Error::new(
                ErrorKind::Config,
                format!("dashboard auth: basic auth needs both {USER_ENV} and {PASSWORD_ENV}"),
            )),
        }
    }
}

/// Builds and starts the web dashboard; from [`Dashboard::new`].
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// let app = postpone::App::connect("postgres://postgres@127.0.0.1/postgres")?;
/// let dashboard = postpone::Dashboard::new(&app)
///     .listen("127.0.0.1:8080")?
///     .read_only(true)
///     .spawn()?;
/// println!("dashboard on {}", dashboard.url());
/// // ... the program runs its workers; on the way out:
/// dashboard.shutdown();
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "call .spawn() to start serving"]
pub struct Dashboard {
    app: App,
    listen: SocketAddr,
    read_only: bool,
    auth: Option<DashboardAuth>,
    threads: usize,
    read_timeout: Duration,
    response_timeout: Duration,
    keep_alive: Duration,
    max_connections: usize,
    stalled_after: Duration,
    schedules: Vec<crate::periodic::PeriodicOptions>,
    base_path: String,
    any_host: bool,
}

impl Dashboard {
    /// A dashboard of `app`'s database.
    pub fn new(app: &App) -> Dashboard {
        Dashboard {
            app: app.clone(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            read_only: false,
            auth: None,
            threads: 4,
            read_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(30),
            keep_alive: Duration::from_secs(15),
            max_connections: 256,
            stalled_after: Duration::ZERO,
            schedules: Vec::new(),
            base_path: String::new(),
            any_host: false,
        }
    }

    /// The periodic schedules registered in `tasks`: the periodic page then shows each
    /// one's cron expression and its exact next instant, even before its first run.
    /// Without them (as from `postpone dashboard`), the next instant is inferred from the
    /// spacing of the last two recorded. Defaults to none.
    pub fn schedules(mut self, tasks: &crate::Tasks) -> Dashboard {
        self.schedules = tasks.periodic.to_vec();
        self
    }

    /// The address to listen on (port 0: any free port, see [`DashboardHandle::addr`]).
    /// Defaults to `127.0.0.1:8080`. An address that does not resolve is an `InvalidInput`
    /// error.
    pub fn listen(mut self, addr: impl ToSocketAddrs) -> Result<Dashboard> {
        self.listen = addr
            .to_socket_addrs()
            .map_err(|e| {
                Error::with_source(ErrorKind::InvalidInput, "dashboard listen address", e)
            })?
            .next()
            .ok_or_else(|| Error::invalid("dashboard listen address: it resolves to nothing"))?;
        Ok(self)
    }

    /// Shows the queue without the retry, cancel and abort buttons, and refuses those
    /// actions. Defaults to false.
    pub fn read_only(mut self, read_only: bool) -> Dashboard {
        self.read_only = read_only;
        self
    }

    /// Requires this token or user and password on every request. Defaults to none (keep
    /// the dashboard on a loopback address then).
    pub fn auth(mut self, auth: Option<DashboardAuth>) -> Dashboard {
        self.auth = auth;
        self
    }

    /// Request threads: at most this many requests are handled at once (32 more wait in a
    /// queue, the next gets a 503). Slow clients and idle connections hold no thread: one
    /// I/O thread reads and writes every connection. Defaults to 4.
    pub fn threads(mut self, threads: usize) -> Dashboard {
        self.threads = threads.max(1);
        self
    }

    /// How long a client may take to send its whole request before the connection is
    /// dropped with a 408. Defaults to 5 s.
    pub fn read_timeout(mut self, timeout: Duration) -> Dashboard {
        self.read_timeout = timeout;
        self
    }

    /// The total deadline of a response, from the request's arrival to the last byte
    /// written: a handler that has not answered by then gets the client a 504, and a client
    /// that reads too slowly to take the response by then has its connection closed.
    /// Defaults to 30 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Dashboard {
        self.response_timeout = timeout;
        self
    }

    /// How long an idle keep-alive connection stays open waiting for its next request.
    /// Defaults to 15 s.
    pub fn keep_alive(mut self, idle: Duration) -> Dashboard {
        self.keep_alive = idle;
        self
    }

    /// Connections open at once, idle ones included; the next is answered 503 and closed.
    /// Defaults to 256.
    pub fn max_connections(mut self, n: usize) -> Dashboard {
        self.max_connections = n.max(1);
        self
    }

    /// Lengthens every worker's lease on the workers page to at least this: a worker is
    /// marked stalled (and its jobs offered for requeueing) once its last heartbeat is older
    /// than its own `stalled_after`, recorded when it registered, or than this when longer.
    /// It never shortens a lease. Defaults to zero: each worker's own.
    pub fn stalled_after(mut self, after: Duration) -> Dashboard {
        self.stalled_after = after;
        self
    }

    /// The path the dashboard is served under (`/admin/queue`): its links and redirects
    /// carry it, and requests outside it get a 404. For [`handler`](Self::handler) mounted
    /// in a program's own server, and the standalone server alike. Defaults to the root.
    pub fn base_path(mut self, path: &str) -> Dashboard {
        let p = path.trim().trim_end_matches('/');
        self.base_path = if p.is_empty() || p.starts_with('/') {
            p.to_owned()
        } else {
            format!("/{p}")
        };
        self
    }

    /// Answers requests addressed to any host name even without a token or user of the
    /// dashboard's own: for a [`handler`](Self::handler) mounted behind the host program's
    /// own access control. Without it (and without [`auth`](Self::auth)), only requests
    /// addressed to an IP address or `localhost` are answered, so that a web page cannot
    /// reach a dashboard through a name pointed at 127.0.0.1 (DNS rebinding). Defaults to
    /// false.
    pub fn any_host(mut self, any: bool) -> Dashboard {
        self.any_host = any;
        self
    }

    /// The dashboard as a plain request-to-response function, to mount in a program's own
    /// web server under [`base_path`](Self::base_path); see [`DashboardHandler`] and
    /// `examples/mounted.rs`. The listener settings (address, threads, timeouts) are then
    /// the host server's business.
    pub fn handler(mut self) -> Result<DashboardHandler> {
        self.check_role();
        Ok(DashboardHandler {
            state: self.state()?,
        })
    }

    /// A role that may not change jobs makes the dashboard read-only.
    fn check_role(&mut self) {
        if !self.read_only && self.app.open_sockets() > 0 {
            if let Some(role) = role_without_writes(&self.app) {
                log::warn!(
                    "dashboard: role {role} may not change jobs (no UPDATE on postpone_jobs): \
                     serving read-only (start it with read_only(true) to say so, or run it \
                     as a role with `postpone grants ROLE --for worker`)"
                );
                self.read_only = true;
            }
        }
    }

    fn state(&self) -> Result<Arc<pages::State>> {
        Ok(Arc::new(pages::State {
            admin: self.app.admin(),
            app: self.app.clone(),
            read_only: self.read_only,
            auth: self.auth.clone(),
            csrf: random_token()?,
            stalled_after: self.stalled_after,
            overview: std::sync::Mutex::new(None),
            schedules: self.schedules.clone(),
            base: self.base_path.clone(),
            any_host: self.any_host,
            downloads: Default::default(),
        }))
    }

    /// Binds the address and starts serving on threads of its own (`postpone-web-*`).
    ///
    /// A dashboard whose database role may not change jobs (a reader's, see
    /// docs/roles.md) serves read-only, and says so once in the log. (A lazy App that has
    /// not connected yet is not asked: the dashboard starts at once, and a change it cannot
    /// make shows the database's refusal.)
    pub fn spawn(mut self) -> Result<DashboardHandle> {
        self.check_role();
        let state = self.state()?;
        let opts = ServerOptions {
            threads: self.threads,
            read_timeout: self.read_timeout,
            response_timeout: self.response_timeout,
            keep_alive: self.keep_alive,
            max_connections: self.max_connections,
        };
        let handler: Arc<dyn Fn(&Request) -> Response + Send + Sync> =
            Arc::new(move |req: &Request| pages::handle(&state, req));
        let server = Server::start(self.listen, opts, handler).map_err(|e| {
            Error::with_source(
                ErrorKind::Other,
                format!("dashboard: listening on {}", self.listen),
                e,
            )
        })?;
        log::info!(
            "dashboard listening on http://{}{}{}",
            server.addr,
            self.base_path,
            if self.read_only { " (read-only)" } else { "" }
        );
        Ok(DashboardHandle {
            addr: server.addr,
            base: self.base_path.clone(),
            server: Some(server),
        })
    }
}

/// The name of the App's role when it may not update jobs; `None` when it may, or when the
/// database cannot tell now (the pages then show the error of each request).
fn role_without_writes(app: &App) -> Option<String> {
    let mut conn = app.connection().ok()?;
    let row = conn
        .query_named(
            "checking the dashboard's privileges",
            store::DASHBOARD_CAN_WRITE,
            &[],
        )
        .ok()?;
    let row = row.first()?;
    (!row.get::<_, bool>(0)).then(|| row.get(1))
}

/// A running dashboard; stops when [`shutdown`](Self::shutdown) is called or it is dropped.
#[derive(Debug)]
pub struct DashboardHandle {
    addr: SocketAddr,
    base: String,
    server: Option<Server>,
}

impl DashboardHandle {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, with the base path if one was set.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.addr, self.base)
    }

    /// Stops accepting connections, lets the requests in progress finish (each bounded by
    /// the response timeout), closes idle connections and joins the threads.
    pub fn shutdown(mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
    }

    /// Serves until the process ends (for a program whose only job is the dashboard).
    pub fn wait(mut self) {
        if let Some(s) = self.server.take() {
            s.wait();
        }
    }
}

impl Drop for DashboardHandle {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
    }
}

/// 32 random bytes as hex, from the operating system's generator.
fn random_token() -> Result<String> {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; 32];
    SystemRandom::new().fill(&mut bytes).map_err(|_| {
        Error::new(
            ErrorKind::Other,
            "dashboard: no random bytes for the CSRF token",
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The fuzz targets' way into the dashboard (src/fuzzing.rs): `bytes` parsed as a request
/// the way the server reads a socket, then the access checks of three dashboards (no auth,
/// a token, basic auth). Oracles: a request let through a token or basic dashboard carries
/// its secret; a read-only dashboard refuses every change.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_request(bytes: &[u8]) {
    use std::sync::OnceLock;
    const TOKEN: &str = "s3cretTok";
    const PASSWORD: &str = "pAssw0rd";
    static STATES: OnceLock<Vec<Arc<pages::State>>> = OnceLock::new();
    let states = STATES.get_or_init(|| {
        let app = App::builder("postgres://fuzz@127.0.0.1:1/fuzz")
            .lazy(true)
            .build()
            .expect("a lazy App needs no server");
        let base = Dashboard::new(&app);
        vec![
            base.clone().state().expect("a dashboard state"),
            base.clone()
                .auth(Some(DashboardAuth::Token(TOKEN.into())))
                .state()
                .expect("a dashboard state"),
            base.read_only(true)
                .auth(Some(DashboardAuth::Basic {
                    user: "admin".into(),
                    password: PASSWORD.into(),
                }))
                .state()
                .expect("a dashboard state"),
        ]
    });
    let raw = String::from_utf8_lossy(bytes);
    for req in http::requests_from_bytes(bytes).into_iter().flatten() {
        let _ = (req.param("status"), req.header("host"), req.form());
        fuzz_checks(states, &req, &raw, TOKEN, PASSWORD);
    }
}

#[cfg(feature = "fuzzing")]
fn fuzz_checks(
    states: &[Arc<pages::State>],
    req: &Request,
    raw: &str,
    token: &str,
    password: &str,
) {
    for (i, st) in states.iter().enumerate() {
        let (gate, refusal) = pages::checks(st, req);
        if gate.is_none() && st.auth.is_some() {
            // Let in: the secret is in the request, plainly or encoded (cookie, query,
            // base64 of basic auth).
            let secret = if i == 1 { token } else { password };
            let basic = req
                .header("authorization")
                .and_then(|h| h.strip_prefix("Basic "))
                .and_then(|b| pages::helpers(b.trim()).1)
                .map(|raw| String::from_utf8_lossy(&raw).into_owned())
                .unwrap_or_default();
            let decoded = req
                .query
                .iter()
                .map(|(_, v)| v.as_str())
                .chain(req.headers.values().map(String::as_str))
                .any(|v| {
                    v.contains(secret)
                        || http::parse_pairs(&format!("v={v}"))
                            .iter()
                            .any(|(_, d)| d.contains(secret))
                });
            assert!(
                raw.contains(secret) || basic.contains(secret) || decoded,
                "dashboard {i} let in a request without its secret: {raw:?}"
            );
        }
        if st.read_only {
            assert!(
                refusal.is_some(),
                "a read-only dashboard let a change through: {raw:?}"
            );
        }
    }
}

/// See [`fuzz_request`]: the access code's helpers on one text.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_auth_texts(s: &str) {
    let (path, _, _) = pages::helpers(s);
    assert!(
        path.starts_with('/') && !path.starts_with("//") && !path.starts_with("/\\"),
        "redirect {path:?} (from {s:?}) may leave the site"
    );
}
