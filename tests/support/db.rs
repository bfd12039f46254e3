//! An isolated, freshly created database per test, dropped afterwards.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use postgres::config::Host;
use postgres::{Client, NoTls};

use super::FaultProxy;

const DEFAULT_SERVER: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// Database the administrative connection (create/drop/inspect) goes to.
const ADMIN_DB: &str = "postgres";

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Where the server is and who we are on it: from env `DATABASE_URL`
/// (URL or key=value form, TCP host only), else `127.0.0.1:5432`, user `postgres`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpec {
    pub user: String,
    pub password: Option<String>,
    pub host: String,
    pub port: u16,
}

impl ServerSpec {
    pub fn from_env() -> ServerSpec {
        match std::env::var("DATABASE_URL") {
            Ok(url) if !url.trim().is_empty() => ServerSpec::parse(&url),
            _ => ServerSpec::parse(DEFAULT_SERVER),
        }
    }

    /// Keeps host, port, user and password of `conninfo`; the database name
    /// and other parameters are dropped.
    pub fn parse(conninfo: &str) -> ServerSpec {
        let config: postgres::Config = conninfo
            .parse()
            .unwrap_or_else(|e| panic!("cannot parse DATABASE_URL {conninfo:?}: {e}"));
        let host = match config.get_hosts().first() {
            None => "127.0.0.1".to_string(),
            Some(Host::Tcp(h)) => h.clone(),
            Some(other) => panic!("DATABASE_URL must name a TCP host, not {other:?}"),
        };
        ServerSpec {
            user: config.get_user().unwrap_or("postgres").to_string(),
            password: config
                .get_password()
                .map(|p| String::from_utf8_lossy(p).into_owned()),
            host,
            port: config.get_ports().first().copied().unwrap_or(5432),
        }
    }

    /// The directory holding this server's Unix socket (`.s.PGSQL.<port>`), among those
    /// servers usually put it in; `None` when neither has it.
    pub fn socket_dir(&self) -> Option<&'static str> {
        let file = format!(".s.PGSQL.{}", self.port);
        ["/var/run/postgresql", "/tmp"]
            .into_iter()
            .find(|d| std::path::Path::new(d).join(&file).exists())
    }

    /// `host:port`, e.g. to give to [`FaultProxy::start`].
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// URL of database `dbname` on this server.
    pub fn url(&self, dbname: &str) -> String {
        self.url_at(&self.addr(), dbname)
    }

    /// URL of database `dbname`, with this server's credentials, at `host_port`.
    pub fn url_at(&self, host_port: &str, dbname: &str) -> String {
        let mut userinfo = encode(&self.user);
        if let Some(pw) = &self.password {
            userinfo.push(':');
            userinfo.push_str(&encode(pw));
        }
        format!("postgres://{userinfo}@{host_port}/{}", encode(dbname))
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A fresh database, `postpone_t_<pid>_<counter>_<nanos>`, created from
/// `template0` and dropped (`WITH (FORCE)`) when this value is dropped.
pub struct TestDb {
    name: String,
    server: ServerSpec,
    /// Lazily (re)opened connection to the `postgres` database, for
    /// inspection and for the final DROP.
    admin: Mutex<Option<Client>>,
}

impl TestDb {
    /// A fresh database (see [`TestDb::new`]) and an App of two connections on it, migrated;
    /// logging set up.
    pub fn with_app() -> (TestDb, postpone::App) {
        crate::support::init_logging();
        let db = TestDb::new();
        let app = postpone::App::builder(db.url())
            .pool_size(2)
            .build()
            .expect("an App on the test database");
        app.migrate().expect("migrate");
        (db, app)
    }

    /// Creates a fresh database `postpone_t_<pid>_<counter>_<nanos>` (TEMPLATE template0) on
    /// 127.0.0.1:5432 (or the server named by env DATABASE_URL: keep its host/port/user, replace the dbname).
    pub fn new() -> TestDb {
        let server = ServerSpec::from_env();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!(
            "postpone_t_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst),
            nanos
        );
        let db = TestDb {
            name,
            server,
            admin: Mutex::new(None),
        };
        db.admin_run(|c| {
            c.batch_execute(&format!(
                "CREATE DATABASE {} TEMPLATE template0",
                quote_ident(&db.name)
            ))
        })
        .unwrap_or_else(|e| panic!("cannot create test database {}: {e}", db.name));
        db
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server this database lives on.
    pub fn server(&self) -> &ServerSpec {
        &self.server
    }

    /// `host:port` of the server, e.g. the upstream for [`FaultProxy::start`].
    pub fn server_addr(&self) -> String {
        self.server.addr()
    }

    /// URL of the database, direct to the server.
    pub fn url(&self) -> String {
        self.server.url(&self.name)
    }

    /// URL of this database through the given proxy (same credentials; the
    /// proxy must forward to this database's server).
    pub fn url_via(&self, proxy: &FaultProxy) -> String {
        self.server
            .url_at(&format!("127.0.0.1:{}", proxy.port()), &self.name)
    }

    /// A plain `postgres::Client` connected to this database (for assertions / setup in tests).
    pub fn client(&self) -> Client {
        Client::connect(&self.url(), NoTls)
            .unwrap_or_else(|e| panic!("cannot connect to test database {}: {e}", self.name))
    }

    /// How many jobs of `task` in this database (default schema) have `status`.
    pub fn count_jobs(&self, task: &str, status: &str) -> i64 {
        self.client()
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE task = $1 AND status = $2",
                &[&task, &status],
            )
            .unwrap()
            .get(0)
    }

    /// pids of the client backends connected to this database, except the
    /// caller's own (from pg_stat_activity), in ascending order.
    pub fn backend_pids(&self) -> Vec<i32> {
        self.admin_run(|c| {
            c.query(
                "SELECT pid FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid() \
                   AND backend_type = 'client backend' \
                 ORDER BY pid",
                &[&self.name],
            )
        })
        .unwrap_or_else(|e| panic!("cannot list backends of {}: {e}", self.name))
        .iter()
        .map(|row| row.get(0))
        .collect()
    }

    /// `pg_terminate_backend` on every client backend of this database except
    /// the caller's; returns how many were terminated. Waits (up to 5 s each)
    /// until they are gone, so `backend_pids` no longer lists them.
    pub fn terminate_backends(&self) -> usize {
        let row = self
            .admin_run(|c| {
                c.query_one(
                    "SELECT count(*) FROM ( \
                       SELECT pg_terminate_backend(pid, 5000) AS ok FROM pg_stat_activity \
                       WHERE datname = $1 AND pid <> pg_backend_pid() \
                         AND backend_type = 'client backend' \
                     ) t WHERE ok",
                    &[&self.name],
                )
            })
            .unwrap_or_else(|e| panic!("cannot terminate backends of {}: {e}", self.name));
        let n: i64 = row.get(0);
        usize::try_from(n).unwrap_or(0)
    }

    /// Runs `f` on the admin connection, reconnecting once if it fails
    /// (e.g. the cached connection died).
    fn admin_run<T>(
        &self,
        mut f: impl FnMut(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, postgres::Error> {
        let mut slot = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        let mut last_err = None;
        for _ in 0..2 {
            let usable = matches!(slot.as_ref(), Some(c) if !c.is_closed());
            if !usable {
                match Client::connect(&self.server.url(ADMIN_DB), NoTls) {
                    Ok(c) => *slot = Some(c),
                    Err(e) => {
                        last_err = Some(e);
                        continue;
                    }
                }
            }
            let Some(client) = slot.as_mut() else {
                continue;
            };
            match f(client) {
                Ok(v) => return Ok(v),
                Err(e) => {
                    // Only a broken connection is worth a retry.
                    let broken = client.is_closed();
                    if broken {
                        *slot = None;
                        last_err = Some(e);
                    } else {
                        return Err(e);
                    }
                }
            }
        }
        Err(last_err.expect("an error was recorded"))
    }
}

impl Default for TestDb {
    fn default() -> Self {
        TestDb::new()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let sql = format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(&self.name)
        );
        if let Err(e) = self.admin_run(|c| c.batch_execute(&sql)) {
            eprintln!("TestDb: cannot drop database {}: {e}", self.name);
        }
        // Close the admin connection now rather than leave it to field drop
        // order: one fewer connection held by a finished test.
        let admin = self
            .admin
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(admin);
    }
}

pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}
