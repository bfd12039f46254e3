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

/// A running PgBouncer.
pub struct PgBouncer {
    dir: PathBuf,
    port: u16,
    mode: PoolMode,
    child: Child,
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
        let (host, port) = upstream.rsplit_once(':').expect("upstream is host:port");
        let dir = temp_dir("pgbouncer");
        let listen = spare_port();
        write(&dir.join("users.txt"), "\"postgres\" \"\"\n\"root\" \"\"\n");
        write(
            &dir.join("pgbouncer.ini"),
            &format!(
                "[databases]\n* = host={host} port={port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {d}/users.txt\nadmin_users = postgres\n\
                 pool_mode = {mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n\
                 logfile = {d}/pgbouncer.log\npidfile =\nserver_login_retry = 1\n\
                 server_connect_timeout = 5\nquery_wait_timeout = 30\n",
                d = dir.display(),
                mode = mode.as_str()
            ),
        );
        give_to_postgres(&dir);
        let child = as_postgres(Path::new(PGBOUNCER))
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting pgbouncer: {e}"));
        let mut bouncer = PgBouncer {
            dir,
            port: listen,
            mode,
            child,
        };
        let up = super::wait_until(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", listen)).is_ok()
        });
        if !up {
            let log =
                std::fs::read_to_string(bouncer.dir.join("pgbouncer.log")).unwrap_or_default();
            let status = bouncer.child.try_wait();
            panic!(
                "pgbouncer did not listen on {listen} within 10 s ({status:?}); its log:\n{log}"
            );
        }
        bouncer
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
        // As root the child is runuser; pgbouncer is its child and ends with it on SIGTERM
        // only, so signal the whole process group we know: runuser forwards SIGTERM.
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let stopped = super::wait_until(Duration::from_secs(5), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
