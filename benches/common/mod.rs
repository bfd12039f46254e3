//! What the benches share: the server they run on and a database of their own on it.
#![allow(dead_code)]

/// host/port/user of DATABASE_URL (default `postgres://postgres@127.0.0.1:5432/postgres`), as
/// a key=value prefix, with its `sslmode` when it names one (`?sslmode=disable`: plain text,
/// as the peers' drivers connect; the default, `prefer`, encrypts when the server offers TLS).
pub fn server() -> String {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let cfg: postgres::Config = url.parse().expect("DATABASE_URL");
    let host = match cfg.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().unwrap_or("postgres").to_owned();
    let ssl = match url.split_once("sslmode=") {
        Some((_, rest)) => {
            let mode: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            format!(" sslmode={mode}")
        }
        None => String::new(),
    };
    format!("host={host} port={port} user={user}{ssl}")
}

/// A fresh database `<prefix>_<pid>`, dropped (with its connections) when this is dropped.
pub struct BenchDb {
    pub name: String,
    admin: postgres::Client,
}

impl BenchDb {
    pub fn create(prefix: &str) -> BenchDb {
        let name = format!("{prefix}_{}", std::process::id());
        let mut admin =
            postgres::Client::connect(&format!("{} dbname=postgres", server()), postgres::NoTls)
                .expect("connect to the postgres database");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        BenchDb { name, admin }
    }

    pub fn url(&self) -> String {
        format!("{} dbname={}", server(), self.name)
    }
}

impl Drop for BenchDb {
    fn drop(&mut self) {
        let _ = self.admin.batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

/// The median of `v` (the mean of the middle two for an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// `--no-ride`: workers record every outcome in a commit of its own
/// (`WorkerBuilder::outcomes_ride_claims(false)`), to compare with the default.
pub fn ride() -> bool {
    !std::env::args().any(|a| a == "--no-ride")
}

/// Whether workers write each job once, with its outcome
/// (`WorkerBuilder::claim_in_outcome_transaction`): `--one-write`, or `POSTPONE_ONE_WRITE=1`
/// in the environment (for scripts that run the benches, such as compare.sh).
pub fn one_write() -> bool {
    std::env::args().any(|a| a == "--one-write")
        || std::env::var("POSTPONE_ONE_WRITE").is_ok_and(|v| v == "1")
}

/// The server a bench runs on, as one line for its output: its version and the settings a
/// comparison depends on, and whether it is a cluster of the bench's own (`--cluster`).
pub fn server_line(own: bool) -> String {
    let mut c =
        postgres::Client::connect(&format!("{} dbname=postgres", server()), postgres::NoTls)
            .expect("connect to the postgres database");
    let row = c
        .query_one(
            "SELECT current_setting('server_version'), current_setting('autovacuum'),
                    current_setting('shared_buffers'), current_setting('synchronous_commit'),
                    current_setting('port')",
            &[],
        )
        .unwrap();
    let (version, av, sb, sc, port): (String, String, String, String, String) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    format!(
        "{{\"what\": \"server\", \"server\": \"{}\", \"version\": \"PostgreSQL {version}\", \"port\": {port}, \"autovacuum\": \"{av}\", \"shared_buffers\": \"{sb}\", \"synchronous_commit\": \"{sc}\"}}",
        if own {
            "a cluster of this run's own (initdb, default settings; benches/cluster.sh)"
        } else {
            "the server named by DATABASE_URL"
        }
    )
}

/// A PostgreSQL cluster of the bench's own with the server's default settings
/// (`benches/cluster.sh start`), stopped and removed when this is dropped. While it lives,
/// `DATABASE_URL` names it, so [`server`] and everything built on it use it.
pub struct OwnCluster {
    dir: String,
}

impl OwnCluster {
    /// Starts the cluster, or explains why it cannot and exits with status 3.
    pub fn start() -> OwnCluster {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/cluster.sh");
        let out = std::process::Command::new(script)
            .arg("start")
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("running {script}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().last().unwrap_or_default();
        let (dir, port) = match line.split_once(' ') {
            Some((d, p)) if out.status.success() => (d.to_owned(), p.trim().to_owned()),
            _ => {
                eprintln!("--cluster: could not start a cluster of our own ({script} start failed, see above)");
                std::process::exit(3);
            }
        };
        // Only the bench's own threads exist yet: nothing else reads the environment.
        std::env::set_var(
            "DATABASE_URL",
            format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable"),
        );
        eprintln!("--cluster: a cluster of our own in {dir}, port {port}");
        OwnCluster { dir }
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/cluster.sh");
        let _ = std::process::Command::new(script)
            .args(["stop", &self.dir])
            .status();
    }
}

/// `--args-kb N` and `--output-kb M` (0 when absent): the realistic jobs' sizes.
pub fn job_sizes() -> (usize, usize) {
    let argv: Vec<String> = std::env::args().collect();
    let get = |flag: &str| {
        argv.windows(2)
            .find(|w| w[0] == flag)
            .map(|w| w[1].parse().unwrap_or_else(|_| panic!("{flag} N (KiB)")))
            .unwrap_or(0)
    };
    (get("--args-kb"), get("--output-kb"))
}

/// `bytes` characters that pglz cannot shorten (hex digits of a xorshift stream), the same
/// for every call: the pad of a realistic job's arguments or output. The peers' jobs get the
/// same kind of text (compare.sh), so no system's rows compress better than another's.
pub fn pad(bytes: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let hex = b"0123456789abcdef";
    (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            hex[(x >> 60) as usize] as char
        })
        .collect()
}

/// The arguments of a realistic job: `{"pad": "<kb KiB of text>"}` (the JSON `null` for 0).
pub fn job_args(kb: usize) -> serde_json::Value {
    if kb == 0 {
        serde_json::Value::Null
    } else {
        serde_json::json!({ "pad": pad(kb * 1024) })
    }
}
