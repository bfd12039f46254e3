//! The `postpone` command-line tool, run as a process against a real database: every
//! command with its output checked, then bad input to each (exit 2 and a message), and
//! healthcheck's 0 / 1.

mod support;

use std::ffi::OsString;
use std::process::Command;
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;
use postpone::{App, Job, JobId, TaskError, Tasks, Worker};
use serde_json::Value;
use support::*;

const UNREACHABLE: &str = "postgres://postgres@127.0.0.1:1/postgres";

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn run_with<I, S>(url: Option<&str>, args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_postpone"));
    cmd.env_remove("DATABASE_URL").env_remove("RUST_LOG");
    if let Some(u) = url {
        cmd.arg("--database-url").arg(u);
    }
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    if !args.iter().any(|a| a == "--timeout") {
        cmd.arg("--timeout").arg("5s");
    }
    cmd.args(args);
    let o = cmd.output().expect("run postpone");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn run(url: &str, args: &[&str]) -> Out {
    run_with(Some(url), args.iter().copied())
}

/// Runs a command that must succeed; returns its stdout.
fn ok(url: &str, args: &[&str]) -> String {
    let o = run(url, args);
    assert_eq!(o.code, 0, "{args:?}: {o:?}");
    assert!(o.stderr.is_empty(), "{args:?}: {o:?}");
    o.stdout
}

fn json(url: &str, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = ok(url, &a);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

/// Runs a command that must fail with exit 2 and `says` in its one error message.
fn fails(url: Option<&str>, args: &[&str], says: &str) {
    let o = run_with(url, args.iter().copied());
    assert_eq!(o.code, 2, "{args:?}: {o:?}");
    assert!(o.stdout.is_empty(), "{args:?}: {o:?}");
    assert!(o.stderr.starts_with("error: "), "{args:?}: {o:?}");
    assert!(
        o.stderr.contains(says),
        "{args:?}: expected {says:?}: {o:?}"
    );
    assert!(!o.stderr.contains("panicked"), "{args:?}: {o:?}");
}

/// The cells of each line of a table (split on runs of two or more spaces).
fn table(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

fn status_of(url: &str, id: JobId) -> String {
    json(url, &["job", &id.to_string()])["status"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn every_command_against_a_real_database() {
    init_logging();
    let db = TestDb::new();
    let url = db.url();
    let url = url.as_str();

    // Before migrate: unhealthy, and commands say what to do.
    let o = run(url, &["healthcheck"]);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(
        o.stdout
            .starts_with("unhealthy: schema not installed: run `postpone migrate`"),
        "{o:?}"
    );
    fails(
        Some(url),
        &["workers"],
        "schema not installed: run `postpone migrate`",
    );

    assert_eq!(
        ok(url, &["migrate"]),
        "applied migration(s) 1, 2; schema is at version 2\n"
    );
    assert_eq!(ok(url, &["migrate"]), "schema is up to date (version 2)\n");
    assert_eq!(
        json(url, &["migrate"]),
        serde_json::json!({"applied": [], "version": 2})
    );
    assert_eq!(
        ok(url, &["healthcheck"]),
        "ok: database answers, schema version 2\n"
    );
    assert_eq!(
        json(url, &["healthcheck"]),
        serde_json::json!({"healthy": true, "schema_version": 2})
    );

    // defer, with each option.
    assert_eq!(
        ok(
            url,
            &[
                "defer",
                "send_email",
                r#"{"to":"a@b.c"}"#,
                "--queue",
                "emails",
                "--lock",
                "user:1",
                "--priority",
                "5"
            ]
        ),
        "deferred job 1 (send_email)\n"
    );
    assert_eq!(
        json(
            url,
            &["defer", "resize", "--in", "1h", "--queueing-lock", "r1"]
        ),
        serde_json::json!({"id": 2, "status": "todo"})
    );
    fails(
        Some(url),
        &["defer", "resize", "--queueing-lock", "r1"],
        "a job with queueing lock \"r1\" is already waiting",
    );
    // (The refused insert used up id 3.)
    let out = ok(
        url,
        &[
            "defer",
            "cleanup",
            "[1,2]",
            "--at",
            "2030-01-02T03:04:05Z",
            "--priority",
            "-1",
        ],
    );
    assert_eq!(out, "deferred job 4 (cleanup)\n");

    // jobs: a table, newest first; filters; JSON.
    let t = table(&ok(url, &["jobs"]));
    assert_eq!(
        t[0],
        [
            "ID",
            "STATUS",
            "QUEUE",
            "TASK",
            "ATTEMPTS",
            "PRIORITY",
            "SCHEDULED (UTC)",
            "ARGS"
        ]
    );
    assert_eq!(t.len(), 4);
    assert_eq!(
        t[1],
        [
            "4",
            "todo",
            "default",
            "cleanup",
            "0",
            "-1",
            "2030-01-02 03:04:05",
            "[1,2]"
        ]
    );
    assert_eq!(t[2][..4], ["2", "todo", "default", "resize"]);
    assert_eq!(t[3][..6], ["1", "todo", "emails", "send_email", "0", "5"]);
    assert_eq!(t[3][7], r#"{"to":"a@b.c"}"#);
    let t = table(&ok(url, &["jobs", "--status", "todo", "--queue", "emails"]));
    assert_eq!(t.len(), 2);
    assert_eq!(t[1][0], "1");
    assert_eq!(table(&ok(url, &["jobs", "--lock", "user:1"]))[1][0], "1");
    assert_eq!(
        table(&ok(url, &["jobs", "--queueing-lock", "r1"]))[1][0],
        "2"
    );
    assert_eq!(table(&ok(url, &["jobs", "--limit", "1"])).len(), 2);
    assert_eq!(
        ok(url, &["jobs", "--status", "failed,aborted"]),
        "no jobs\n"
    );
    let list = json(url, &["jobs", "--task", "resize"]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["id"], 2);
    assert_eq!(list[0]["args"], Value::Null);
    assert_eq!(list[0]["queueing_lock"], "r1");
    assert_eq!(list[0]["status"], "todo");
    assert!(list[0]["scheduled_at"].as_str().unwrap().ends_with('Z'));

    // job: one job, every field.
    let shown = ok(url, &["job", "1"]);
    for line in [
        "id:              1",
        "task:            send_email",
        "queue:           emails",
        "status:          todo",
        "attempts:        0",
        "priority:        5",
        "lock:            user:1",
        "queueing lock:   -",
        r#"args:            {"to":"a@b.c"}"#,
        "started (UTC):   -",
        "worker:          -",
        "abort requested: no",
        "errors:          none",
    ] {
        assert!(
            shown.lines().any(|l| l == line),
            "missing {line:?} in\n{shown}"
        );
    }
    let d = json(url, &["job", "4"]);
    assert_eq!(d["scheduled_at"], "2030-01-02T03:04:05.000000Z");
    assert_eq!(d["errors"], serde_json::json!([]));

    // cancel, retry, cancel --delete, abort of a waiting job.
    assert_eq!(ok(url, &["cancel", "2"]), "job 2 cancelled\n");
    assert_eq!(status_of(url, JobId(2)), "cancelled");
    fails(
        Some(url),
        &["cancel", "2"],
        "cannot cancel job 2: it is cancelled",
    );
    assert_eq!(ok(url, &["retry", "2"]), "job 2 is waiting again (todo)\n");
    assert_eq!(status_of(url, JobId(2)), "todo");
    assert_eq!(
        ok(url, &["cancel", "2", "--delete"]),
        "job 2 cancelled and deleted\n"
    );
    fails(Some(url), &["job", "2"], "job 2 not found");
    assert_eq!(
        json(url, &["abort", "4"]),
        serde_json::json!({"id": 4, "status": "cancelled", "abort": "cancelled"})
    );

    // stats: one row per queue.
    let t = table(&ok(url, &["stats"]));
    assert_eq!(
        t[0],
        [
            "QUEUE",
            "TODO",
            "SCHEDULED",
            "DOING",
            "SUCCEEDED",
            "FAILED",
            "CANCELLED",
            "ABORTED",
            "OLDEST TODO"
        ]
    );
    assert_eq!(t[1], ["default", "0", "0", "0", "0", "0", "1", "0", "-"]);
    assert_eq!(t[2][..8], ["emails", "1", "0", "0", "0", "0", "0", "0"]);
    let s = json(url, &["stats"]);
    assert_eq!(s[1]["queue"], "emails");
    assert_eq!(s[1]["todo"], 1);
    assert!(s[1]["oldest_todo_age_secs"].as_f64().unwrap() >= 0.0);

    // workers, and abort of a running job.
    assert_eq!(ok(url, &["workers"]), "no workers\n");
    let app = App::connect(url).unwrap();
    let (started_tx, started_rx) = bounded(1);
    let mut tasks = Tasks::new();
    tasks.register("long", move |job: &Job| -> Result<(), TaskError> {
        let _ = started_tx.send(job.id());
        let deadline = Instant::now() + Duration::from_secs(15);
        while !job.should_abort() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    });
    let h = Worker::builder(&app, tasks)
        .name("cli-test-worker")
        .queues(["slow"])
        .concurrency(2)
        .poll_interval(Duration::from_millis(100))
        .spawn()
        .unwrap();
    let out = ok(url, &["defer", "long", "--queue", "slow"]);
    let id: i64 = out
        .strip_prefix("deferred job ")
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(
        started_rx.recv_timeout(Duration::from_secs(5)),
        Ok(JobId(id))
    );
    let t = table(&ok(url, &["workers"]));
    assert_eq!(
        t[0],
        [
            "ID",
            "NAME",
            "HOST",
            "PID",
            "QUEUES",
            "THREADS",
            "RUNNING",
            "HEARTBEAT AGE",
            "STARTED (UTC)"
        ]
    );
    assert_eq!(t.len(), 2);
    assert_eq!(t[1][1], "cli-test-worker");
    assert_eq!(t[1][3], std::process::id().to_string());
    assert_eq!(t[1][4..7], ["slow", "2", "1"]);
    let w = json(url, &["workers"]);
    assert_eq!(w[0]["name"], "cli-test-worker");
    assert!(w[0]["heartbeat_age_secs"].as_f64().unwrap() < 30.0);
    let shown = ok(url, &["job", &id.to_string()]);
    assert!(shown.contains("status:          doing"), "{shown}");
    assert!(
        shown.contains("worker:          cli-test-worker (id "),
        "{shown}"
    );
    assert_eq!(
        ok(url, &["abort", &id.to_string()]),
        format!(
            "job {id}: abort requested; its task sees should_abort() and the job ends aborted\n"
        )
    );
    assert!(wait_until(Duration::from_secs(5), || status_of(
        url,
        JobId(id)
    ) == "aborted"));
    let shown = ok(url, &["job", &id.to_string()]);
    assert!(shown.contains("abort requested: yes"), "{shown}");
    assert!(shown.contains("errors:\n  attempt 1 at "), "{shown}");
    assert!(shown.contains(": aborted on request"), "{shown}");
    let r = h.shutdown(Duration::from_secs(5));
    assert!(r.is_clean(), "{r}");

    // prune: by status, then all finished; waiting jobs stay.
    assert_eq!(
        ok(
            url,
            &["prune", "--older-than", "0s", "--status", "cancelled"]
        ),
        "deleted 1 job(s) and 0 periodic record(s)\n"
    );
    assert_eq!(
        json(url, &["prune", "--older-than", "0s"]),
        serde_json::json!({"jobs_deleted": 1, "periodic_deleted": 0})
    );
    assert_eq!(
        ok(
            url,
            &["prune", "--older-than", "7d", "--status", "failed,aborted"]
        ),
        "deleted 0 job(s) and 0 periodic record(s)\n"
    );
    let t = table(&ok(url, &["jobs"]));
    assert_eq!(t.len(), 2);
    assert_eq!(t[1][..2], ["1", "todo"]);

    // DATABASE_URL works in place of --database-url.
    let o = Command::new(env!("CARGO_BIN_EXE_postpone"))
        .env("DATABASE_URL", url)
        .args(["jobs", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["id"], 1);
}

#[test]
fn bad_input_exits_2_with_a_message() {
    let db = TestDb::new();
    let url = db.url();
    let u = Some(url.as_str());
    ok(&url, &["migrate"]);
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
         VALUES ('q', 'done', 'null', 'succeeded', now());
         INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
         VALUES ('q', 'later', 'null', now() + interval '1 day');",
    )
    .unwrap();
    let (done, waiting) = ("1", "2");

    fails(
        u,
        &["defer", "t", "{not json"],
        "invalid JSON arguments {not json: key must be a string",
    );
    fails(
        u,
        &["defer", "t", "--in", "10x"],
        "invalid value '10x' for '--in <DURATION>'",
    );
    fails(u, &["defer", "t", "--in", "10"], "missing unit");
    fails(u, &["defer", "t", "--at", "tomorrow"], "expected RFC 3339");
    fails(
        u,
        &["defer", "t", "--in", "1m", "--at", "2030-01-01T00:00:00Z"],
        "cannot be used with",
    );
    fails(
        u,
        &["defer", "", "null"],
        "invalid task name: it must not be empty",
    );
    fails(u, &["defer", "t", "--queue", ""], "invalid queue name");
    fails(
        u,
        &["defer", "t", "--priority", "high"],
        "invalid value 'high' for '--priority <PRIORITY>'",
    );
    fails(u, &["defer"], "required arguments were not provided");
    fails(u, &["defer", "t", "\"a\\u0000b\""], "NUL character");
    fails(
        u,
        &["jobs", "--status", "done"],
        "unknown job status \"done\"",
    );
    fails(
        u,
        &["jobs", "--limit", "0"],
        "invalid value '0' for '--limit <LIMIT>'",
    );
    fails(u, &["jobs", "--limit", "many"], "invalid value 'many'");
    fails(
        u,
        &["job", "abc"],
        "invalid job id \"abc\": expected a whole number",
    );
    fails(u, &["job", "99999"], "error: job 99999 not found");
    fails(u, &["job"], "required arguments were not provided");
    fails(u, &["retry", "99999"], "job 99999 not found");
    fails(
        u,
        &["retry", waiting],
        "cannot retry job 2: it is todo; only failed, cancelled or aborted jobs can be retried",
    );
    fails(u, &["retry", "1.5"], "invalid job id");
    fails(u, &["cancel", done], "cannot cancel job 1: it is succeeded");
    fails(u, &["cancel", "99999", "--delete"], "job 99999 not found");
    fails(
        u,
        &["cancel", "--delete"],
        "required arguments were not provided",
    );
    fails(u, &["abort", done], "cannot abort job 1: it is succeeded");
    fails(u, &["abort", "-5"], "unexpected argument '-5'");
    fails(u, &["stats", "extra"], "unexpected argument 'extra'");
    fails(
        u,
        &["workers", "--limit", "3"],
        "unexpected argument '--limit'",
    );
    fails(u, &["prune"], "--older-than <DURATION>");
    fails(u, &["prune", "--older-than", "7x"], "unknown unit \"x\"");
    fails(
        u,
        &["prune", "--older-than", "7d", "--status", "todo"],
        "not a finished one",
    );
    fails(u, &["migrate", "--bogus"], "unexpected argument '--bogus'");
    fails(u, &["frobnicate"], "unrecognized subcommand 'frobnicate'");
    fails(
        u,
        &["--timeout", "soon", "stats"],
        "invalid value 'soon' for '--timeout <DURATION>'",
    );
    fails(u, &["healthcheck", "extra"], "unexpected argument 'extra'");
    fails(None, &[], "Usage: postpone");
    // Arguments that are not UTF-8.
    {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0x66, 0xff, 0x6f]);
        let o = run_with(u, [OsString::from("defer"), bad]);
        assert_eq!(o.code, 2, "{o:?}");
        assert!(o.stderr.starts_with("error: "), "{o:?}");
    }
    // Nothing changed.
    assert_eq!(table(&ok(&url, &["jobs"])).len(), 3);

    // Values another client may store: a number beyond f64, infinite times.
    c.batch_execute(
        "INSERT INTO postpone_jobs (queue, task, args, scheduled_at, created_at)
         VALUES ('q', 'odd', '{\"n\": 1e400}', 'infinity', '-infinity')",
    )
    .unwrap();
    let t = table(&ok(&url, &["jobs", "--task", "odd"]));
    assert_eq!(t[1][3], "odd");
    assert_eq!(t[1][6], "infinity");
    let shown = ok(&url, &["job", "3"]);
    assert!(shown.contains("created (UTC):   -infinity"), "{shown}");
    let v = json(&url, &["job", "3"]);
    assert_eq!(v["scheduled_at"], "infinity");
    assert!(v["args"].as_str().unwrap().contains("\"n\""), "{v}");
    ok(&url, &["stats"]);

    // Servers that cannot be used.
    fails(Some(UNREACHABLE), &["stats"], "cannot reach the database");
    fails(Some(UNREACHABLE), &["migrate"], "Connection refused");
    fails(
        Some("postgres://host:notaport/db"),
        &["jobs"],
        "invalid database url",
    );
    fails(u, &["--timeout", "0s", "stats"], "must be longer than zero");
    let o = run(UNREACHABLE, &["healthcheck"]);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(
        o.stdout.starts_with("unhealthy: cannot reach the database"),
        "{o:?}"
    );
    let o = run(UNREACHABLE, &["healthcheck", "--json"]);
    assert_eq!(o.code, 1, "{o:?}");
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["healthy"], false);
    assert!(v["error"].as_str().unwrap().contains("cannot reach"));
    let o = run("postgres://host:notaport/db", &["healthcheck"]);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stdout.contains("invalid database url"), "{o:?}");
}
