//! The whole story in one program: migrate, defer jobs, work them, wait for them, shut down.
//!
//! ```sh
//! cargo run --example quickstart                        # its own database (see below)
//! DATABASE_URL=postgres://... cargo run --example quickstart   # or one you name
//! ```
//!
//! Without `DATABASE_URL` it uses a database of its own, `postpone_quickstart`, on the server
//! at 127.0.0.1:5432 (user `postgres`), and creates it there first if it is missing: it
//! never installs its tables in the `postgres` maintenance database. With `DATABASE_URL` it
//! uses the database named there, which must exist. Either way it says which before it
//! writes anything.
//!
//! It defers a handful of jobs to the `quickstart` queue, starts a worker with two threads,
//! waits for every job with [`App::wait`] (or until Ctrl-C), shuts the worker down within 5
//! seconds and prints what happened to every job.

use std::error::Error;
use std::io::{self, Write};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use postpone::{App, Job, JobId, JobResult, NewJob, RetryStrategy, TaskError, Tasks, Worker};
use serde::Deserialize;
use serde_json::json;

/// The server used when `DATABASE_URL` is not set.
const LOCAL_SERVER: &str = "postgres://postgres@127.0.0.1:5432";
/// The quickstart's own database on that server.
const OWN_DATABASE: &str = "postpone_quickstart";

/// Where the quickstart writes.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// Its own database on `server`, created if missing.
    Own { server: String, name: String },
    /// The database named by `DATABASE_URL`, as given.
    Given(String),
}

impl Target {
    /// `DATABASE_URL` if set (and not empty), else the quickstart's own database.
    fn from_env(database_url: Option<String>) -> Target {
        match database_url.filter(|u| !u.trim().is_empty()) {
            Some(url) => Target::Given(url),
            None => Target::Own {
                server: LOCAL_SERVER.to_owned(),
                name: OWN_DATABASE.to_owned(),
            },
        }
    }

    fn url(&self) -> String {
        match self {
            Target::Own { server, name } => format!("{server}/{name}"),
            Target::Given(url) => url.clone(),
        }
    }
}

/// Connects to the target, first creating the quickstart's own database if the server says
/// it does not exist. Says what it uses (and creates) before anything is written.
fn connect(target: &Target, out: &mut dyn Write) -> Result<App, Box<dyn Error>> {
    let build = |url: &str| App::builder(url).io_timeout(Duration::from_secs(5)).build();
    match target {
        Target::Given(url) => {
            writeln!(out, "using the database of DATABASE_URL")?;
            Ok(build(url)?)
        }
        Target::Own { server, name } => {
            writeln!(
                out,
                "using database {name} on {server} (set DATABASE_URL to use another)"
            )?;
            match build(&target.url()) {
                Err(e) if e.is_database_missing() => {
                    writeln!(out, "database {name} does not exist yet: creating it")?;
                    create_database(server, name)?;
                    Ok(build(&target.url())?)
                }
                other => Ok(other?),
            }
        }
    }
}

/// `CREATE DATABASE name` on `server`, sent from its maintenance database (connected to,
/// never written in) with the plain `postgres` driver: an App checks for postpone's schema,
/// which that database does not have.
fn create_database(server: &str, name: &str) -> Result<(), Box<dyn Error>> {
    let mut config: postgres::Config = format!("{server}/postgres").parse()?;
    config.connect_timeout(Duration::from_secs(5));
    let mut client = config.connect(postgres::NoTls)?;
    match client.batch_execute(&format!("CREATE DATABASE {name}")) {
        // Another quickstart created it meanwhile.
        Err(e) if e.code() == Some(&postgres::error::SqlState::DUPLICATE_DATABASE) => Ok(()),
        other => Ok(other?),
    }
}

#[derive(Deserialize)]
struct Greeting {
    name: String,
}

/// What the waiting thread, or Ctrl-C, says.
enum Event {
    Interrupted,
    Finished(postpone::Result<Vec<JobResult>>),
}

fn main() -> Result<(), Box<dyn Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let target = Target::from_env(std::env::var("DATABASE_URL").ok());
    let (tx, rx) = mpsc::channel();
    let interrupt = tx.clone();
    ctrlc::set_handler(move || {
        let _ = interrupt.send(Event::Interrupted);
    })?;
    run(&target, &mut io::stdout(), tx, rx)?;
    Ok(())
}

/// A job the quickstart deferred: its id, what it is, and how it ended.
type Outcome = (JobId, &'static str, JobResult);

/// The quickstart itself; returns the results of the jobs it waited for (none after
/// Ctrl-C).
fn run(
    target: &Target,
    out: &mut dyn Write,
    events_tx: Sender<Event>,
    events: Receiver<Event>,
) -> Result<Vec<Outcome>, Box<dyn Error>> {
    let app = connect(target, out)?;
    let applied = app.migrate()?;
    writeln!(out, "schema ready (migrations applied now: {applied:?})")?;

    // Defer: one by one, with options, and a batch in one round-trip.
    let mut jobs: Vec<(JobId, &'static str)> = vec![
        (
            app.job("greet")
                .queue("quickstart")
                .defer(&json!({"name": "Ada"}))?,
            "greet Ada",
        ),
        (
            app.job("greet")
                .queue("quickstart")
                .priority(10)
                .defer(&json!({"name": "Grace"}))?,
            "greet Grace, priority 10",
        ),
        (
            app.job("greet")
                .queue("quickstart")
                .schedule_in(Duration::from_secs(2))
                .defer(&json!({"name": "Barbara"}))?,
            "greet Barbara, in 2 s",
        ),
        (
            app.job("flaky").queue("quickstart").defer(&json!({}))?,
            "flaky, retried",
        ),
    ];
    let batch: Vec<NewJob> = ["Edsger", "Donald", "Frances"]
        .iter()
        .map(|n| NewJob::new("greet", &json!({ "name": n })).map(|j| j.queue("quickstart")))
        .collect::<postpone::Result<_>>()?;
    for id in app.defer_batch(&batch)? {
        jobs.push((id, "greet, from a batch"));
    }
    writeln!(out, "deferred {} jobs", jobs.len())?;

    // Tasks: plain functions of &Job; a retry strategy per task.
    let mut tasks = Tasks::new();
    tasks.register("greet", |job: &Job| -> Result<(), TaskError> {
        let g: Greeting = job.args()?;
        println!("  job {}: hello, {}!", job.id(), g.name);
        Ok(())
    });
    tasks
        .register("flaky", |job: &Job| -> Result<(), TaskError> {
            if job.attempts() < 2 {
                // Any error retries as the task's strategy says (below: 500 ms later);
                // TaskError::fail, ::retry_in, ::cancel say otherwise explicitly.
                let e = io::Error::other(format!("attempt {} fails on purpose", job.attempts()));
                return Err(e.into());
            }
            println!(
                "  job {}: succeeded on attempt {}",
                job.id(),
                job.attempts()
            );
            Ok(())
        })
        // Up to 3 attempts, 500 ms apart.
        .retry(RetryStrategy::fixed(Duration::from_millis(500), 3));

    let handle = Worker::builder(&app, tasks)
        .concurrency(2)
        .queues(["quickstart"])
        .spawn()?;
    writeln!(
        out,
        "worker {} started; Ctrl-C stops it early",
        handle.name()
    )?;

    // Wait for every job with App::wait, on a thread of its own so that Ctrl-C can cut the
    // wait short; 30 s in all.
    let waiter = app.clone();
    let ids: Vec<JobId> = jobs.iter().map(|(id, _)| *id).collect();
    thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        let results = ids
            .iter()
            .map(|id| waiter.wait(*id, deadline.saturating_duration_since(Instant::now())))
            .collect();
        let _ = events_tx.send(Event::Finished(results));
    });
    let results = match events.recv()? {
        Event::Interrupted => {
            writeln!(out, "Ctrl-C: stopping")?;
            Vec::new()
        }
        Event::Finished(results) => results?,
    };

    let report = handle.shutdown(Duration::from_secs(5));
    writeln!(out, "worker {report}")?;
    let mut done = Vec::new();
    for ((id, what), r) in jobs.into_iter().zip(results) {
        let why = match (r.failure(), &r.last_error) {
            (Some(e), _) => format!(": {e}"),
            (None, Some(e)) => format!(" (after a failed attempt: {e})"),
            (None, None) => String::new(),
        };
        writeln!(out, "job {id:>4}  {what:<26} {}{why}", r.status)?;
        done.push((id, what, r));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    //! Run by `cargo test` (the example is built with `test = true`), against the server
    //! of the test suite: `DATABASE_URL`'s, else 127.0.0.1:5432.

    use super::*;

    /// The server the tests use, as a URL without a database.
    fn server() -> String {
        match std::env::var("DATABASE_URL") {
            Ok(url) if url.starts_with("postgres") => match url.rfind('/') {
                Some(i) if i > url.find("://").map_or(0, |s| s + 2) => url[..i].to_owned(),
                _ => url,
            },
            _ => LOCAL_SERVER.to_owned(),
        }
    }

    /// A database name of the test's own, dropped (with its connections) when done.
    struct Scratch {
        server: String,
        name: String,
    }

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let s = Scratch {
                server: server(),
                name: format!("postpone_quickstart_test_{tag}_{}", std::process::id()),
            };
            s.drop_database();
            s
        }

        fn target(&self) -> Target {
            Target::Own {
                server: self.server.clone(),
                name: self.name.clone(),
            }
        }

        fn maintenance(&self) -> postgres::Client {
            postgres::Client::connect(&format!("{}/postgres", self.server), postgres::NoTls)
                .unwrap()
        }

        fn exists(&self) -> bool {
            let rows = self
                .maintenance()
                .query(
                    "SELECT 1 FROM pg_database WHERE datname = $1",
                    &[&self.name],
                )
                .unwrap();
            !rows.is_empty()
        }

        fn drop_database(&self) {
            self.maintenance()
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ))
                .unwrap();
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            self.drop_database();
        }
    }

    /// Installed into the `postgres` maintenance database when DATABASE_URL was unset (10
    /// tables, 17 functions, 3 triggers there).
    #[test]
    fn without_database_url_it_uses_a_database_of_its_own_not_postgres() {
        let own = Target::from_env(None);
        assert_eq!(
            own,
            Target::Own {
                server: "postgres://postgres@127.0.0.1:5432".into(),
                name: "postpone_quickstart".into()
            }
        );
        assert_eq!(
            own.url(),
            "postgres://postgres@127.0.0.1:5432/postpone_quickstart"
        );
        assert_eq!(Target::from_env(Some(" ".into())), own, "empty is unset");
        let given = "postgres://me@db.example/shop";
        assert_eq!(
            Target::from_env(Some(given.into())),
            Target::Given(given.into())
        );
    }

    #[test]
    fn its_own_database_is_created_if_missing_and_it_says_so_first() {
        let scratch = Scratch::new("create");
        assert!(!scratch.exists());
        let mut out = Vec::new();
        let app = connect(&scratch.target(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(&format!("using database {} on ", scratch.name)),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "database {} does not exist yet: creating it",
                scratch.name
            )),
            "{text}"
        );
        assert!(scratch.exists());
        drop(app);
        // The second time it is simply used.
        let mut out = Vec::new();
        let app = connect(&scratch.target(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("creating"), "{text}");
        drop(app);
    }

    #[test]
    fn it_runs_every_job_to_the_end_and_waits_with_app_wait() {
        let scratch = Scratch::new("run");
        let (tx, rx) = mpsc::channel();
        let mut out = Vec::new();
        let done = run(&scratch.target(), &mut out, tx, rx).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(done.len(), 7, "{text}");
        for (id, what, r) in &done {
            assert!(r.succeeded(), "job {id} ({what}): {r:?}\n{text}");
            assert_eq!(r.failure(), None);
        }
        let flaky = done
            .iter()
            .find(|(_, what, _)| what.starts_with("flaky"))
            .unwrap();
        assert_eq!(
            flaky.2.last_error.as_deref(),
            Some("attempt 1 fails on purpose")
        );
        assert!(
            text.contains("(after a failed attempt: attempt 1 fails on purpose)"),
            "{text}"
        );
        assert!(text.contains("worker "), "{text}");
    }
}
