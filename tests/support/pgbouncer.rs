//! A real PgBouncer (Debian's `pgbouncer` package), started by a test on a spare port with a
//! generated configuration, and killed (its directory removed) on drop.
//!
//! Every database name is forwarded (`* = host=... port=...`) to one upstream, which may be
//! the local server or a [`FaultProxy`](super::FaultProxy) in front of it. Authentication is
//! `trust` (the upstream is trust as well). PgBouncer refuses to run as root, so as root it
//! runs as the postgres user. [`PgBouncer::skip_reason`] says why it cannot run here.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use super::cluster::{as_postgres, give_to_postgres, is_root, spare_port, temp_dir, write};

const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// PgBouncer's `pool_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection, for the client's lifetime.
    Session,
    /// A server connection per transaction (or per statement outside one).
    Transaction,
}

impl PoolMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer (stopped and started again on the same port by
/// [`restart`](PgBouncer::restart)).
pub struct PgBouncer {
    dir: PathBuf,
    port: u16,
    mode: PoolMode,
    upstream: String,
    pool_size: usize,
    child: Option<Child>,
}

impl PgBouncer {
    /// Why PgBouncer cannot run here, or None.
    pub fn skip_reason() -> Option<String> {
        if !Path::new(PGBOUNCER).exists() {
            return Some(format!(
                "pgbouncer not installed ({PGBOUNCER} missing; apt-get install pgbouncer, as .ci/run does)"
            ));
        }
        if is_root() {
            if let Some(r) = super::cluster::skip_reason() {
                return Some(format!("pgbouncer must run as the postgres user: {r}"));
            }
        }
        None
    }

    /// Starts PgBouncer in `mode` in front of `upstream` (`host:port`), with at most
    /// `pool_size` server connections per database and user; waits (up to 10 s) until it
    /// listens.
    pub fn start(upstream: &str, mode: PoolMode, pool_size: usize) -> PgBouncer {
        let mut bouncer = PgBouncer {
            dir: temp_dir("pgbouncer"),
            port: spare_port(),
            mode,
            upstream: upstream.to_owned(),
            pool_size,
            child: None,
        };
        write(
            &bouncer.dir.join("users.txt"),
            "\"postgres\" \"\"\n\"root\" \"\"\n",
        );
        bouncer.write_config();
        give_to_postgres(&bouncer.dir);
        bouncer.launch();
        bouncer
    }

    fn write_config(&self) {
        let (host, port) = self
            .upstream
            .rsplit_once(':')
            .expect("upstream is host:port");
        write(
            &self.dir.join("pgbouncer.ini"),
            &format!(
                "[databases]\n* = host={host} port={port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {d}/users.txt\nadmin_users = postgres\n\
                 pool_mode = {mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n\
                 logfile = {d}/pgbouncer.log\npidfile =\nserver_login_retry = 1\n\
                 server_connect_timeout = 5\nquery_wait_timeout = 30\n",
                listen = self.port,
                d = self.dir.display(),
                mode = self.mode.as_str(),
                pool_size = self.pool_size,
            ),
        );
        if is_root() {
            super::cluster::run(
                false,
                Path::new("chown"),
                &[
                    "postgres:",
                    &self.dir.join("pgbouncer.ini").display().to_string(),
                ],
            );
        }
    }

    /// Starts the process on the configured port and waits (up to 10 s) until it listens.
    fn launch(&mut self) {
        let child = as_postgres(Path::new(PGBOUNCER))
            .arg(self.dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting pgbouncer: {e}"));
        self.child = Some(child);
        let listen = self.port;
        let up = super::wait_until(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", listen)).is_ok()
        });
        if !up {
            let status = self.child.as_mut().map(Child::try_wait);
            panic!(
                "pgbouncer did not listen on {listen} within 10 s ({status:?}); its log:\n{}",
                self.log()
            );
        }
    }

    /// Stops the process (SIGTERM: PgBouncer's immediate shutdown, every client and server
    /// connection closed) and waits for it (up to 5 s, then SIGKILL).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // As root the child is runuser and pgbouncer its child: signal pgbouncer itself
        // (runuser, signalled, forwards SIGTERM but then waits 2 s before it returns), and
        // runuser returns once it exits.
        let pid = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id()))
            .ok()
            .and_then(|c| c.split_whitespace().next().map(str::to_owned))
            .unwrap_or_else(|| child.id().to_string());
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        let stopped = super::wait_until(Duration::from_secs(5), || {
            matches!(child.try_wait(), Ok(Some(_)))
        });
        if !stopped {
            let _ = child.kill();
            let _ = child.wait();
        }
        // runuser may return before pgbouncer has closed its socket: a new one started now
        // would fail to listen while the old one still answers.
        let port = self.port;
        let closed = super::wait_until(Duration::from_secs(5), || {
            TcpStream::connect(("127.0.0.1", port)).is_err()
        });
        if !closed {
            eprintln!("pgbouncer: port {port} still answers 5 s after the stop");
        }
    }

    /// Starts it again on the same port after [`stop`](Self::stop), and waits until it
    /// listens.
    pub fn start_again(&mut self) {
        if self.child.is_none() {
            self.launch();
        }
    }

    /// Whether the process runs (started, not stopped through this value).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// If the process ended on its own: how, and the end of its log.
    pub fn exited(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        Some(format!(
            "pgbouncer on {} exited: {status}; its log ends:\n{}",
            self.port,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ))
    }

    /// Points every database at `upstream` (`host:port`), as an operator does after a
    /// failover: rewrites the configuration and sends `RELOAD` on the admin console.
    pub fn set_upstream(&mut self, upstream: &str) -> Result<(), String> {
        self.upstream = upstream.to_owned();
        self.write_config();
        if self.child.is_none() {
            return Ok(());
        }
        let mut admin = postgres::Client::connect(
            &format!(
                "host=127.0.0.1 port={} user=postgres dbname=pgbouncer connect_timeout=5",
                self.port
            ),
            postgres::NoTls,
        )
        .map_err(|e| format!("connecting to the pgbouncer admin console: {e}"))?;
        admin
            .simple_query("RELOAD")
            .map_err(|e| format!("RELOAD on pgbouncer: {e}"))?;
        Ok(())
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its pool mode.
    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// URL of database `dbname` through PgBouncer, as user postgres.
    pub fn url(&self, dbname: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{dbname}", self.port)
    }

    /// Its log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    /// Runs `SHOW <what>` on the admin console and returns the rows as column name ->
    /// value maps.
    pub fn show(&self, what: &str) -> Vec<std::collections::HashMap<String, String>> {
        let mut admin = postgres::Client::connect(
            &format!(
                "host=127.0.0.1 port={} user=postgres dbname=pgbouncer connect_timeout=5",
                self.port
            ),
            postgres::NoTls,
        )
        .unwrap_or_else(|e| panic!("connecting to the pgbouncer admin console: {e}"));
        let mut rows = Vec::new();
        for msg in admin
            .simple_query(&format!("SHOW {what}"))
            .unwrap_or_else(|e| panic!("SHOW {what} on pgbouncer: {e}"))
        {
            if let postgres::SimpleQueryMessage::Row(row) = msg {
                let mut map = std::collections::HashMap::new();
                for (i, col) in row.columns().iter().enumerate() {
                    map.insert(
                        col.name().to_owned(),
                        row.get(i).unwrap_or_default().to_owned(),
                    );
                }
                rows.push(map);
            }
        }
        rows
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
