//! Temporary PostgreSQL clusters of our own: a primary made with `initdb`, a streaming
//! standby made with `pg_basebackup`, each in a temporary directory on a spare port, run as
//! the `postgres` OS user when the tests run as root (initdb and postgres refuse root).
//!
//! Start, stop (fast or immediate), promote. A cluster is stopped (immediate) and its
//! directory removed on drop, also when the test fails. [`skip_reason`] says why a machine
//! cannot run them (no server binaries, root without `runuser`); the caller prints it with
//! [`skip`] and returns: a skip is never a silent pass.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

static DIRS: AtomicUsize = AtomicUsize::new(0);

/// Says why a test (or part of it) did not run, on stderr directly so that the test harness
/// does not swallow it.
pub fn skip(reason: &str) {
    let _ = writeln!(std::io::stderr(), "skipping: {reason}");
}

/// The newest server `bin` directory under /usr/lib/postgresql/*/ that has `initdb` and
/// `pg_ctl`.
pub fn postgres_bin() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pg_ctl").exists()).then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

/// Whether `program` is on the PATH.
pub fn which(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Why clusters of our own cannot be built here (None: they can, `postgres_bin()` is Some).
pub fn skip_reason() -> Option<String> {
    let Some(bin) = postgres_bin() else {
        return Some("initdb not installed (no /usr/lib/postgresql/*/bin/initdb)".into());
    };
    if !bin.join("pg_basebackup").exists() {
        return Some(format!("no pg_basebackup in {}", bin.display()));
    }
    if is_root() {
        if !which("runuser") {
            return Some("running as root without runuser (initdb refuses to run as root)".into());
        }
        let ok = Command::new("runuser")
            .args(["-u", "postgres", "--", "true"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Some(
                "running as root and `runuser -u postgres` fails (no postgres user?)".into(),
            );
        }
    }
    None
}

/// A command that runs `program` as the postgres user when we are root.
pub fn as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Runs a program (as the postgres user when `as_pg` and we are root); panics with its
/// output if it fails.
pub fn run(as_pg: bool, program: &Path, args: &[&str]) {
    let mut cmd = if as_pg {
        as_postgres(program)
    } else {
        Command::new(program)
    };
    cmd.args(args);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}\n{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes a file, panicking with its path on failure.
pub fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Appends to a file, panicking with its path on failure.
pub fn append(path: &Path, text: &str) {
    let mut old = std::fs::read_to_string(path).unwrap_or_default();
    old.push_str(text);
    write(path, &old);
}

/// A TCP port that was free a moment ago on 127.0.0.1.
pub fn spare_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A fresh directory `postpone-<tag>-<pid>-<n>-<nanos>` under the temp dir, owned by the
/// postgres user when we are root (mode 700).
pub fn temp_dir(tag: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "postpone-{tag}-{}-{}-{nanos}",
        std::process::id(),
        DIRS.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// Gives `dir` (recursively) to the postgres user when we are root, and mode 700.
pub fn give_to_postgres(dir: &Path) {
    let d = dir.display().to_string();
    if is_root() {
        run(false, Path::new("chown"), &["-R", "postgres:", &d]);
    }
    run(false, Path::new("chmod"), &["700", &d]);
}

/// A cluster in a temporary directory, stopped and removed on drop.
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    running: bool,
}

impl Cluster {
    /// A directory and a port for a new cluster; nothing is created in it yet. The caller
    /// may put files (certificates) in [`dir`](Self::dir), then calls [`init`](Self::init).
    pub fn prepare(tag: &str) -> Cluster {
        let bin = postgres_bin().expect("checked by skip_reason: server binaries installed");
        Cluster {
            dir: temp_dir(tag),
            bin,
            port: spare_port(),
            running: false,
        }
    }

    /// A new primary: [`prepare`](Self::prepare) then [`init`](Self::init) with replication
    /// allowed from this machine, then [`start`](Self::start).
    pub fn primary(tag: &str) -> Cluster {
        Cluster::primary_with(tag, "", "")
    }

    /// [`primary`](Self::primary) with more settings and pg_hba.conf lines (e.g. listen on
    /// the host side of a network namespace's link too).
    pub fn primary_with(tag: &str, conf: &str, hba: &str) -> Cluster {
        let mut c = Cluster::prepare(tag);
        c.init(
            &format!("wal_level = replica\nmax_wal_senders = 5\nwal_keep_size = 64MB\n{conf}"),
            &format!(
                "local all all trust\nlocal replication all trust\n\
                 host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n{hba}"
            ),
        );
        c.start();
        c
    }

    /// A streaming standby of `primary` (pg_basebackup -R, which writes
    /// `standby.signal` and `primary_conninfo`), on its own port, started.
    pub fn standby_of(primary: &Cluster, tag: &str) -> Cluster {
        let mut c = Cluster::prepare(tag);
        c.reseed_from(primary.port);
        c
    }

    /// The directory that holds everything of this cluster.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `file` in [`dir`](Self::dir), as a string.
    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// URL of database `dbname` as user postgres over TCP.
    pub fn url(&self, dbname: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{dbname}", self.port)
    }

    /// A plain client to database `dbname` over the cluster's Unix socket.
    pub fn client(&self, dbname: &str) -> postgres::Client {
        postgres::Client::connect(
            &format!(
                "host={} port={} user=postgres dbname={dbname} connect_timeout=5",
                self.dir.display(),
                self.port
            ),
            postgres::NoTls,
        )
        .unwrap_or_else(|e| panic!("connecting to the test cluster on {}: {e}", self.port))
    }

    /// Gives the directory to the postgres user, runs initdb (trust, UTF8), appends our
    /// settings (port, 127.0.0.1 only, socket in [`dir`](Self::dir), fsync off, few
    /// connections) and `conf` to postgresql.conf, and writes `hba` as pg_hba.conf.
    pub fn init(&mut self, conf: &str, hba: &str) {
        give_to_postgres(&self.dir);
        let data = self.data().display().to_string();
        run(
            true,
            &self.bin.join("initdb"),
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        self.append_conf(conf);
        write(&self.data().join("pg_hba.conf"), hba);
    }

    fn append_conf(&self, conf: &str) {
        append(
            &self.data().join("postgresql.conf"),
            &format!(
                "\n# postpone test cluster\nport = {}\nlisten_addresses = '127.0.0.1'\n\
                 unix_socket_directories = '{}'\nfsync = off\nsynchronous_commit = off\n\
                 full_page_writes = off\nmax_connections = 40\nshared_buffers = 16MB\n{conf}\n",
                self.port,
                self.dir.display()
            ),
        );
    }

    fn pg_ctl(&self, args: &[&str]) {
        let data = self.data().display().to_string();
        let mut all = vec!["-D", data.as_str()];
        all.extend_from_slice(args);
        run(true, &self.bin.join("pg_ctl"), &all);
    }

    /// Starts the server and waits until it accepts connections (up to 30 s).
    pub fn start(&mut self) {
        let log = self.path("log");
        self.running = true;
        self.pg_ctl(&["-l", &log, "-w", "-t", "30", "start"]);
    }

    /// Stops the server: `fast` (sessions are told 57P01) or `immediate` (no goodbye, as a
    /// crash looks to clients).
    pub fn stop(&mut self, mode: &str) {
        self.pg_ctl(&["-m", mode, "-w", "-t", "30", "stop"]);
        self.running = false;
    }

    /// Restarts the server: `fast` or `immediate` (a crash and its recovery), and waits until
    /// it accepts connections again (up to 30 s).
    pub fn restart(&mut self, mode: &str) {
        let log = self.path("log");
        self.pg_ctl(&["-m", mode, "-l", &log, "-w", "-t", "30", "restart"]);
        self.running = true;
    }

    /// Makes this cluster, stopped or not, a fresh streaming standby of `primary` on the same
    /// port: stops it (immediate), removes its data directory, copies `primary` with
    /// pg_basebackup and starts it. An old primary comes back this way after a failover.
    pub fn reseed_from(&mut self, primary_port: u16) {
        if self.running {
            self.stop("immediate");
        }
        let data = self.data();
        let _ = std::fs::remove_dir_all(&data);
        give_to_postgres(&self.dir);
        let data = data.display().to_string();
        run(
            true,
            &self.bin.join("pg_basebackup"),
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary_port.to_string(),
                "-U",
                "postgres",
                "-D",
                &data,
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
        );
        self.append_conf("");
        self.start();
    }

    /// Whether the server process is running, as far as this value knows (started and not
    /// stopped through it).
    pub fn running(&self) -> bool {
        self.running
    }

    /// Promotes a standby to primary and waits until it accepts writes.
    pub fn promote(&self) {
        self.pg_ctl(&["-w", "-t", "30", "promote"]);
    }

    /// Whether the server is in recovery (a standby), asked over its Unix socket.
    pub fn in_recovery(&self) -> bool {
        self.client("postgres")
            .query_one("SELECT pg_is_in_recovery()", &[])
            .expect("asking pg_is_in_recovery")
            .get(0)
    }

    /// Waits until the standby has replayed everything the primary has written (up to
    /// `timeout`); returns whether it caught up.
    pub fn wait_caught_up(&self, primary: &Cluster, timeout: Duration) -> bool {
        let lsn: String = primary
            .client("postgres")
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .expect("reading the primary's WAL position")
            .get(0);
        let mut standby = self.client("postgres");
        super::wait_until(timeout, || {
            standby
                .query_one(
                    "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                    &[&lsn],
                )
                .is_ok_and(|r| r.get::<_, Option<bool>>(0) == Some(true))
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running {
            let data = self.data().display().to_string();
            let _ = as_postgres(&self.bin.join("pg_ctl"))
                .args(["-D", &data, "-m", "immediate", "-w", "stop"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
