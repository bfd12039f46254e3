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
