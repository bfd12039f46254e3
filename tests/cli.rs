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
    fails_with(url, args, 2, says)
}

/// Runs a command that must fail with exit `code` and `says` in its one error message.
fn fails_with(url: Option<&str>, args: &[&str], code: i32, says: &str) {
    let o = run_with(url, args.iter().copied());
    assert_eq!(o.code, code, "{args:?}: {o:?}");
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

/// `user@host:port/db` as the tool names the database of `url`.
fn db_name(url: &str) -> String {
    let c: postgres::Config = url.parse().unwrap();
    let host = match &c.get_hosts()[0] {
        postgres::config::Host::Tcp(h) => h.clone(),
        _ => unreachable!(),
    };
    format!(
        "{}@{host}:{}/{}",
        c.get_user().unwrap(),
        c.get_ports()[0],
        c.get_dbname().unwrap()
    )
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
    fails_with(
        Some(url),
        &["workers"],
        7,
        "schema not installed: run `postpone migrate`",
    );
    // It names the database, so that the migrate it advises reaches the one meant.
    fails_with(
        Some(url),
        &["jobs"],
        7,
        &format!("error: database {}: schema not installed", db_name(url)),
    );

    let v = postpone::SCHEMA_VERSION;
    // Every migration from 1 to the latest (their numbers may have gaps).
    let applied = ok(url, &["migrate"]);
    assert!(
        applied.starts_with("applied migration(s) 1, 2, ")
            && applied.ends_with(&format!(", {v}; schema is at version {v}\n")),
        "{applied}"
    );
    assert_eq!(
        ok(url, &["migrate"]),
        format!("schema is up to date (version {v})\n")
    );
    assert_eq!(
        json(url, &["migrate"]),
        serde_json::json!({"applied": [], "version": v})
    );
    assert_eq!(
        ok(url, &["healthcheck"]),
        format!("ok: database answers, schema version {v}\n")
    );
    assert_eq!(
        json(url, &["healthcheck"]),
        serde_json::json!({"healthy": true, "schema_version": v, "supported_version": v,
                           "database": db_name(url)})
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
    fails_with(
        Some(url),
        &["defer", "resize", "--queueing-lock", "r1"],
        4,
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
            "FINISHED (UTC)",
            "DURATION",
            "LOCK",
            "LAST ERROR",
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
            "-",
            "-",
            "-",
            "-",
            "[1,2]"
        ]
    );
    assert_eq!(t[2][..4], ["2", "todo", "default", "resize"]);
    assert_eq!(t[3][..6], ["1", "todo", "emails", "send_email", "0", "5"]);
    assert_eq!(t[3][9..], ["user:1", "-", r#"{"to":"a@b.c"}"#]);
    let t = table(&ok(url, &["jobs", "--status", "todo", "--queue", "emails"]));
    assert_eq!(t.len(), 2);
    assert_eq!(t[1][0], "1");
    assert_eq!(table(&ok(url, &["jobs", "--lock", "user:1"]))[1][0], "1");
    assert_eq!(
        table(&ok(url, &["jobs", "--queueing-lock", "r1"]))[1][0],
        "2"
    );
    // A cut listing says so, and how to go on.
    let t = table(&ok(url, &["jobs", "--limit", "1"]));
    assert_eq!(t.len(), 3);
    assert_eq!(
        t[2],
        ["-- 1 job(s) shown; more match: add --after id:desc:4:4 (or --all)"]
    );
    assert_eq!(
        ok(url, &["jobs", "--status", "failed,aborted"]),
        "no jobs\n"
    );
    let list = json(url, &["jobs", "--task", "resize"]);
    assert_eq!(list["next_cursor"], Value::Null);
    let list = list["jobs"].as_array().unwrap();
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
    fails_with(
        Some(url),
        &["cancel", "2"],
        4,
        "cannot cancel job 2: it is cancelled",
    );
    assert_eq!(ok(url, &["retry", "2"]), "job 2 is waiting again (todo)\n");
    assert_eq!(status_of(url, JobId(2)), "todo");
    assert_eq!(
        ok(url, &["cancel", "2", "--delete"]),
        "job 2 cancelled and deleted\n"
    );
    fails_with(Some(url), &["job", "2"], 3, "job 2 not found");
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
            "FAIL%",
            "P50",
            "P95",
            "P99",
            "OLDEST TODO"
        ]
    );
    assert_eq!(
        t[1],
        ["default", "0", "0", "0", "0", "0", "1", "0", "-", "-", "-", "-", "-"]
    );
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
            "LEASE",
            "STATE",
            "STARTED (UTC)"
        ]
    );
    assert_eq!(t.len(), 4);
    assert!(t[2][0].starts_with("-- RUNNING: "), "{t:?}");
    assert!(t[3][0].starts_with("-- LEASE: "), "{t:?}");
    // The worker's own stalled_after (the tests' fast workers use 30 s, the default).
    assert_eq!(t[1][8], "30.0s");
    assert_eq!(t[1][9], "live");
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
            "job {id}: abort requested; a running task sees should_abort(), and the job ends aborted (without running, if no thread has started it yet)\n"
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
        serde_json::json!({"jobs_deleted": 1, "periodic_deleted": 0, "groups_deleted": 0})
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
    assert_eq!(v["jobs"][0]["id"], 1);
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
    fails_with(u, &["job", "99999"], 3, "error: job 99999 not found");
    fails(u, &["job"], "required arguments were not provided");
    fails_with(u, &["retry", "99999"], 3, "job 99999 not found");
    fails_with(
        u,
        &["retry", waiting],
        4,
        "cannot retry job 2: it is todo; only failed, cancelled or aborted jobs can be retried",
    );
    fails(u, &["retry", "1.5"], "invalid job id");
    fails_with(
        u,
        &["cancel", done],
        4,
        "cannot cancel job 1: it is succeeded",
    );
    fails_with(
        u,
        &["cancel", "99999", "--delete"],
        3,
        "job 99999 not found",
    );
    fails(u, &["cancel", "--delete"], "give a job id, or select jobs");
    fails_with(
        u,
        &["abort", done],
        4,
        "cannot abort job 1: it is succeeded",
    );
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
    // The number is printed exactly as stored, not rounded or quoted.
    let raw = ok(&url, &["job", "3", "--json"]);
    assert!(raw.contains("\"args\": {\"n\": 1e400}"), "{raw}");
    assert!(raw.contains("\"scheduled_at\": \"infinity\""), "{raw}");
    ok(&url, &["stats"]);

    // Servers that cannot be used.
    fails_with(
        Some(UNREACHABLE),
        &["stats"],
        5,
        "cannot reach the database",
    );
    fails_with(Some(UNREACHABLE), &["migrate"], 5, "Connection refused");
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

/// Runs with extra environment variables (and no `--database-url` unless in `args`).
fn run_env(env: &[(&str, &str)], args: &[&str]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_postpone"));
    cmd.env_remove("DATABASE_URL").env_remove("RUST_LOG");
    for k in [
        "PGHOST",
        "PGPORT",
        "PGUSER",
        "PGPASSWORD",
        "PGDATABASE",
        "PGSSLMODE",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.args(args).output().expect("run postpone");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn migrated() -> (TestDb, String) {
    let db = TestDb::new();
    let url = db.url();
    ok(&url, &["migrate"]);
    (db, url)
}

#[test]
fn listings_say_when_cut_and_cursors_page_through_everything_once() {
    let (db, url) = migrated();
    let url = url.as_str();
    db.client()
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args, priority, scheduled_at)
             SELECT 'q', 't' || (i % 3), jsonb_build_object('i', i), i % 4,
                    now() + (i % 7) * interval '1 minute'
               FROM generate_series(1, 130) i",
        )
        .unwrap();
    // The default limit is 50: the table and the JSON say more match.
    let out = ok(url, &["jobs"]);
    let last = out.lines().last().unwrap();
    assert_eq!(
        last,
        "-- 50 job(s) shown; more match: add --after id:desc:81:81 (or --all)"
    );
    assert_eq!(out.lines().count(), 52);
    let v = json(url, &["jobs"]);
    assert_eq!(v["jobs"].as_array().unwrap().len(), 50);
    assert_eq!(v["next_cursor"], "id:desc:81:81");

    // Every sort pages through all 130 jobs exactly once, in order.
    for (sort, dir) in [
        ("id", "--desc"),
        ("id", "--asc"),
        ("scheduled", "--asc"),
        ("priority", "--desc"),
    ] {
        let mut seen: Vec<i64> = Vec::new();
        let mut keys: Vec<Value> = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut args = vec!["jobs", "--sort", sort, dir, "--limit", "17"];
            if let Some(c) = &cursor {
                args.push("--after");
                args.push(c);
            }
            let v = json(url, &args);
            for j in v["jobs"].as_array().unwrap() {
                seen.push(j["id"].as_i64().unwrap());
                keys.push(match sort {
                    "scheduled" => j["scheduled_at"].clone(),
                    "priority" => j["priority"].clone(),
                    _ => j["id"].clone(),
                });
            }
            match v["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, (1..=130).collect::<Vec<_>>(), "{sort} {dir}");
        let ordered = keys.windows(2).all(|w| {
            let c = match (w[0].as_i64(), w[1].as_i64()) {
                (Some(a), Some(b)) => a.cmp(&b),
                _ => w[0].as_str().unwrap().cmp(w[1].as_str().unwrap()),
            };
            if dir == "--desc" {
                c.is_ge()
            } else {
                c.is_le()
            }
        });
        assert!(ordered, "{sort} {dir}: {keys:?}");
    }

    // --all streams every page: one table, and one JSON document.
    let out = ok(url, &["jobs", "--all", "--limit", "40"]);
    assert_eq!(out.lines().count(), 131, "{out}");
    assert!(!out.contains("more match"));
    let v = json(url, &["jobs", "--all", "--limit", "40", "--task", "t1"]);
    assert_eq!(v["jobs"].as_array().unwrap().len(), 44);
    assert_eq!(v["next_cursor"], Value::Null);
    // An explicit limit, and its bounds.
    assert_eq!(
        json(url, &["jobs", "--limit", "130"])["next_cursor"],
        Value::Null
    );
    fails(
        Some(url),
        &["jobs", "--limit", "10001"],
        "invalid value '10001' for '--limit <LIMIT>'",
    );
    // A cursor of another sort, or garbage, is refused.
    fails(
        Some(url),
        &["jobs", "--sort", "scheduled", "--after", "id:desc:81:81"],
        "it was made for sort id desc, this listing is sorted scheduled asc",
    );
    fails(Some(url), &["jobs", "--after", "x"], "invalid cursor \"x\"");
}

#[test]
fn jobs_filter_by_time_error_text_and_show_finished_duration_and_last_error() {
    let (db, url) = migrated();
    let url = url.as_str();
    db.client()
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args, status, lock, attempts, created_at,
                                        started_at, finished_at, errors)
             VALUES ('q', 'old', '1', 'failed', 'L', 2, now() - interval '3 days',
                     now() - interval '3 days', now() - interval '3 days' + interval '1500 ms',
                     '[{\"attempt\": 1, \"error\": \"first\"},
                       {\"attempt\": 2, \"error\": \"SMTP Timeout at relay\"}]'),
                    ('q', 'new', '2', 'succeeded', NULL, 1, now() - interval '1 hour',
                     now() - interval '1 hour', now() - interval '1 hour' + interval '2 s', NULL),
                    ('q', 'waiting', '3', 'todo', NULL, 0, now(), NULL, NULL, NULL)",
        )
        .unwrap();
    let ids = |args: &[&str]| -> Vec<i64> {
        json(url, args)["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(ids(&["jobs", "--created-after", "2h"]), vec![3, 2]);
    assert_eq!(ids(&["jobs", "--created-before", "1d"]), vec![1]);
    assert_eq!(ids(&["jobs", "--finished-after", "1d"]), vec![2]);
    assert_eq!(
        ids(&["jobs", "--finished-before", "2030-01-01T00:00:00Z"]),
        vec![2, 1]
    );
    assert_eq!(ids(&["jobs", "--error", "smtp timeout"]), vec![1]);
    assert_eq!(ids(&["jobs", "--error", "first"]), vec![1]);
    assert_eq!(ids(&["jobs", "--error", "nowhere"]), Vec::<i64>::new());
    // Sorting by finished time lists finished jobs only.
    assert_eq!(ids(&["jobs", "--sort", "finished"]), vec![1, 2]);
    let t = table(&ok(url, &["jobs", "--status", "failed"]));
    assert_eq!(
        t[1][7..11],
        [t[1][7].as_str(), "1.5s", "L", "SMTP Timeout at relay"]
    );
    let v = json(url, &["jobs", "--status", "failed"]);
    assert_eq!(v["jobs"][0]["last_error"], "SMTP Timeout at relay");
    fails(
        Some(url),
        &["jobs", "--created-after", "yesterday"],
        "expected RFC 3339 (2030-01-02T03:04:05Z) or an age",
    );
}

#[test]
fn bulk_retry_cancel_delete_reach_every_match_with_a_dry_run() {
    let (db, url) = migrated();
    let url = url.as_str();
    db.client()
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
             SELECT 'q', 'mail', 'null', 'failed', now() FROM generate_series(1, 2500);
             INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
             SELECT 'q', 'other', 'null', 'failed', now() FROM generate_series(1, 5);
             INSERT INTO postpone_jobs (queue, task, args, status, started_at)
             VALUES ('q', 'mail', 'null', 'doing', now());
             -- Two failed jobs of one queueing lock, a third waiting: none may be retried.
             INSERT INTO postpone_jobs (queue, task, args, status, queueing_lock)
             VALUES ('q', 'mail', 'null', 'failed', 'ql'), ('q', 'mail', 'null', 'failed', 'ql'),
                    ('q', 'mail', 'null', 'todo', 'ql');",
        )
        .unwrap();
    // A dry run counts every match (far past any listing limit) and changes nothing.
    assert_eq!(
        ok(
            url,
            &["retry", "--task", "mail", "--status", "failed", "--dry-run"]
        ),
        "dry run: 2502 job(s) match; 2500 would be retried, 2 skipped\n"
    );
    assert_eq!(
        json(url, &["stats"])[0]["failed"],
        2507,
        "a dry run changed something"
    );
    let r = json(url, &["retry", "--task", "mail", "--status", "failed"]);
    assert_eq!(
        r,
        serde_json::json!({"action": "retry", "dry_run": false, "matched": 2502,
                           "changed": 2500, "skipped": 2})
    );
    let s = json(url, &["stats", "--by", "task"]);
    assert_eq!(
        (s[0]["task"].clone(), s[0]["queue"].clone()),
        (Value::Null, "mail".into())
    );
    assert_eq!(
        (s[0]["todo"].clone(), s[0]["failed"].clone()),
        (2501.into(), 2.into())
    );
    assert_eq!(s[1]["failed"], 5);
    // Cancel by selection: waiting ones only; the running one is skipped.
    assert_eq!(
        ok(url, &["cancel", "--task", "mail"]),
        "2504 job(s) matched; 2501 cancelled, 3 skipped\n"
    );
    // cancel --delete by selection removes waiting jobs only; delete removes any not running.
    assert_eq!(
        ok(url, &["cancel", "--delete", "--task", "mail"]),
        "0 job(s) matched; 0 deleted, 0 skipped\n"
    );
    assert_eq!(
        ok(url, &["delete", "--queue", "q", "--dry-run"]),
        "dry run: 2509 job(s) match; 2508 would be deleted, 1 skipped\n"
    );
    assert_eq!(
        ok(url, &["delete", "--queue", "q"]),
        "2509 job(s) matched; 2508 deleted, 1 skipped\n"
    );
    let left = json(url, &["jobs"]);
    assert_eq!(left["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(left["jobs"][0]["status"], "doing");
    let doing = left["jobs"][0]["id"].as_i64().unwrap().to_string();
    fails_with(
        Some(url),
        &["delete", &doing],
        4,
        "a running job cannot be deleted; abort it first",
    );
    // A selection is required, and an id excludes one.
    fails(Some(url), &["retry"], "give a job id, or select jobs");
    fails(Some(url), &["delete", "1", "--queue", "q"], "not both");
    fails(
        Some(url),
        &["cancel", "--delete", "--status", "failed"],
        "removes waiting jobs only",
    );
}

#[test]
fn reschedule_and_priority_change_waiting_jobs_only() {
    let (_db, url) = migrated();
    let url = url.as_str();
    ok(url, &["defer", "a"]);
    ok(url, &["defer", "b", "--queue", "other"]);
    assert_eq!(
        ok(url, &["reschedule", "1", "--at", "2031-02-03T04:05:06Z"]),
        "job 1 is due at 2031-02-03 04:05:06 UTC\n"
    );
    assert_eq!(
        json(url, &["job", "1"])["scheduled_at"],
        "2031-02-03T04:05:06.000000Z"
    );
    assert_eq!(
        ok(url, &["priority", "1", "--to", "-3"]),
        "job 1 has priority -3\n"
    );
    assert_eq!(json(url, &["job", "1"])["priority"], -3);
    assert_eq!(
        ok(url, &["priority", "--queue", "other", "--to", "9"]),
        "1 job(s) matched; 1 reprioritised, 0 skipped\n"
    );
    let r = json(url, &["reschedule", "--queue", "other", "--in", "2h"]);
    assert_eq!(r["changed"], 1);
    let j = json(url, &["job", "2"]);
    assert_eq!(j["priority"], 9);
    ok(url, &["cancel", "2"]);
    fails_with(
        Some(url),
        &["reschedule", "2", "--in", "1m"],
        4,
        "cannot reschedule job 2: it is cancelled; only waiting (todo) jobs can be rescheduled",
    );
    fails_with(
        Some(url),
        &["priority", "99", "--to", "1"],
        3,
        "job 99 not found",
    );
    fails(Some(url), &["reschedule", "1"], "--in <DURATION>");
}

/// Dependencies from the command line: `defer --after/--after-finished`, and a waiting
/// dependent shown as such by `jobs`, `job` and `stats`.
#[test]
fn defer_after_and_the_views_of_a_waiting_dependent() {
    let (_db, url) = migrated();
    let url = url.as_str();
    ok(url, &["defer", "a"]);
    ok(url, &["defer", "b"]);
    assert_eq!(
        ok(
            url,
            &["defer", "c", "--after", "1", "--after-finished", "2"]
        ),
        "deferred job 3 (c)\n"
    );
    let listed = table(&ok(url, &["jobs"]));
    let row = listed.iter().find(|r| r[0] == "3").expect("job 3 listed");
    assert_eq!(row[6], "after dependencies", "{listed:?}");
    let shown = ok(url, &["job", "3"]);
    assert!(
        shown.contains("runs after")
            && shown.contains("jobs 1 (todo), 2 (todo, any outcome) (waiting for them)"),
        "{shown}"
    );
    assert!(shown.contains("after dependencies"), "{shown}");
    assert!(ok(url, &["job", "1"]).contains("dependents"));
    let stats = ok(url, &["stats"]);
    assert!(
        stats.contains("-- waiting for dependencies: default (1 job(s)"),
        "{stats}"
    );
    assert_eq!(json(url, &["stats"])[0]["waiting_for_dependencies"], 1);
    assert_eq!(
        json(url, &["job", "3"])["dependencies"][1]["any_outcome"],
        true
    );
    fails_with(
        Some(url),
        &["defer", "d", "--after", "99"],
        3,
        "job 99 does not exist",
    );
}

/// `postpone workflow ID` lists a workflow's jobs with their states and dependencies;
/// `workflow cancel` ends its waiting jobs, `workflow retry` puts them back, in order.
#[test]
fn workflow_shows_cancels_and_retries_a_whole_workflow() {
    let (_db, url) = migrated();
    let url = url.as_str();
    let app = App::connect(url).unwrap();
    let mut wf = app.workflow("nightly");
    let a = wf
        .step(postpone::NewJob::new("fetch", &1).unwrap())
        .name("fetch")
        .add();
    let b = wf
        .step(postpone::NewJob::new("parse", &2).unwrap())
        .after([&a])
        .add();
    wf.step(postpone::NewJob::new("report", &3).unwrap())
        .after_finished([&a, &b])
        .add();
    let run = wf.insert().unwrap();
    let id = run.id.to_string();
    let [ja, jb, jc] = [run.jobs[0], run.jobs[1], run.jobs[2]];

    let shown = ok(url, &["workflow", &id]);
    assert!(
        shown.contains(&format!("workflow:      {id} \"nightly\"")),
        "{shown}"
    );
    assert!(
        shown.contains("finished:      0 of 3 (3 pending)"),
        "{shown}"
    );
    let rows = table(&shown[shown.find("ID ").unwrap()..]);
    assert_eq!(rows[0][..5], ["ID", "STEP", "TASK", "QUEUE", "STATE"]);
    assert_eq!(
        rows[1][..5],
        [
            ja.to_string(),
            "fetch".into(),
            "fetch".into(),
            "default".into(),
            "waiting".into()
        ]
    );
    assert!(rows[2].contains(&"parse".to_owned()), "{rows:?}");
    assert!(rows[2].contains(&ja.to_string()), "{rows:?}");
    assert!(rows[3].contains(&format!("{ja},{jb}")), "{rows:?}");
    assert!(ok(url, &["job", &jb.to_string()]).contains(&format!("postpone workflow {id}")));
    let j = json(url, &["workflow", &id]);
    assert_eq!(j["total"], 3);
    assert_eq!(j["jobs"][1]["after"][0], ja.get());
    assert_eq!(j["jobs"][2]["after_finished"][1], jb.get());
    assert_eq!(j["jobs"][1]["waiting_for_dependencies"], true);
    assert_eq!(json(url, &["jobs"])["jobs"][0]["workflow_id"], run.id.get());
    let listed = json(url, &["jobs", "--workflow", &id]);
    let listed: Vec<i64> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect();
    assert_eq!(listed, [jc.get(), jb.get(), ja.get()]);
    assert!(json(url, &["jobs", "--workflow", "77"])["jobs"]
        .as_array()
        .unwrap()
        .is_empty());

    assert_eq!(
        ok(url, &["workflow", "cancel", &id]),
        format!("workflow {id}: 3 waiting jobs cancelled, 0 running jobs asked to abort\n")
    );
    for job in [ja, jb, jc] {
        assert_eq!(status_of(url, job), "cancelled");
    }
    assert_eq!(json(url, &["workflow", &id])["cancelled"], 3);
    assert_eq!(
        ok(url, &["workflow", "retry", &id]),
        format!("workflow {id}: 3 jobs back to waiting ({ja},{jb},{jc})\n")
    );
    let rows = table(&ok(url, &["workflow", &id]));
    let states: Vec<&str> = rows
        .iter()
        .skip_while(|r| r.first().map(String::as_str) != Some("ID"))
        .skip(1)
        .map(|r| r[4].as_str())
        .collect();
    assert_eq!(
        states,
        [
            "waiting",
            "waiting for dependencies",
            "waiting for dependencies"
        ],
        "{rows:?}"
    );
    assert_eq!(
        json(url, &["workflow", "retry", &id])["retried"],
        serde_json::json!([])
    );
    fails_with(
        Some(url),
        &["workflow", "999"],
        3,
        "workflow 999 does not exist",
    );
    fails_with(
        Some(url),
        &["workflow", "cancel", "x"],
        2,
        "invalid workflow id",
    );
}

/// `postpone defer --expires-in`: the deadline in `jobs` (a column only when a listed job
/// has one), `job` and `--json`; a job past it ends expired, and `stats` counts it.
#[test]
fn defer_expires_in_and_the_deadline_in_the_views() {
    let (db, url) = migrated();
    let url = url.as_str();
    assert!(!ok(url, &["jobs"]).contains("EXPIRES"));
    assert_eq!(
        ok(url, &["defer", "code", "--expires-in", "10m"]),
        "deferred job 1 (code)\n"
    );
    ok(url, &["defer", "plain"]);
    let listed = table(&ok(url, &["jobs", "--sort", "id"]));
    assert_eq!(listed[0][7], "EXPIRES (UTC)", "{listed:?}");
    let row = listed.iter().find(|r| r[0] == "1").expect("job 1 listed");
    assert!(row[7].starts_with("20"), "{listed:?}");
    let row = listed.iter().find(|r| r[0] == "2").expect("job 2 listed");
    assert_eq!(row[7], "-", "{listed:?}");
    assert!(ok(url, &["job", "1"]).contains("expires (UTC)"));
    assert!(json(url, &["job", "1"])["expires_at"].is_string());
    assert!(json(url, &["job", "2"])["expires_at"].is_null());
    fails(
        Some(url),
        &["defer", "code", "--in", "1h", "--expires-in", "10m"],
        "invalid expiry",
    );
    // Past its deadline, the sweep of `postpone_expire` (a worker's) ends it.
    let mut c = db.client();
    c.batch_execute(
        "UPDATE postpone_jobs SET expires_at = now() - interval '1 second' WHERE id = 1;
         SELECT * FROM postpone_expire(10, NULL);",
    )
    .unwrap();
    assert_eq!(status_of(url, JobId::from(1)), "cancelled");
    assert_eq!(json(url, &["job", "1"])["expired"], true);
    assert!(ok(url, &["jobs", "--sort", "id"]).contains("(expired)"));
    let stats = ok(url, &["stats"]);
    assert!(
        stats.contains("-- expired: default (1 of its CANCELLED job(s)"),
        "{stats}"
    );
    assert_eq!(json(url, &["stats"])[0]["expired"], 1);
}

/// `postpone priority 2 10` was refused (only `--to 10` was known): the form people guess
/// after an id is accepted, negative numbers included; the two forms together, or neither,
/// are usage errors that show both.
#[test]
fn priority_takes_the_new_priority_after_the_id_or_with_to() {
    let (_db, url) = migrated();
    let url = url.as_str();
    ok(url, &["defer", "a"]);
    ok(url, &["defer", "b"]);
    assert_eq!(ok(url, &["priority", "1", "10"]), "job 1 has priority 10\n");
    assert_eq!(json(url, &["job", "1"])["priority"], 10);
    assert_eq!(ok(url, &["priority", "1", "-4"]), "job 1 has priority -4\n");
    assert_eq!(
        ok(url, &["priority", "2", "--to", "3"]),
        "job 2 has priority 3\n"
    );
    let r = json(url, &["priority", "2", "8"]);
    assert_eq!(r["id"], 2, "{r}");
    assert_eq!(json(url, &["job", "2"])["priority"], 8);
    fails(
        Some(url),
        &["priority", "1", "2", "--to", "3"],
        "cannot be used with",
    );
    fails(Some(url), &["priority", "1"], "postpone priority <ID> <N>");
    fails(
        Some(url),
        &["priority", "--queue", "default", "5"],
        "postpone priority [SELECTION OPTIONS] --to <N>",
    );
    assert_eq!(json(url, &["job", "1"])["priority"], -4, "nothing changed");
}

/// clap's usage errors under `--json` carried their terminal text (the `error:` prefix, the
/// usage block, the pointer to --help, several lines) inside the JSON message. The message
/// is one plain line now, even when colours are forced.
#[test]
fn usage_errors_under_json_are_one_plain_line() {
    for (args, code, message) in [
        (
            &["--json", "frobnicate"][..],
            "invalid_subcommand",
            "unrecognized subcommand 'frobnicate'",
        ),
        (
            &["--json", "priority", "2", "10", "--to", "3"],
            "argument_conflict",
            "the argument '[N]' cannot be used with '--to <N>'",
        ),
        (
            &["--json", "priority", "2"],
            "missing_required_argument",
            "the following required arguments were not provided: <N>",
        ),
        (
            &["jobs", "--status", "done", "--json"],
            "value_validation",
            "invalid value 'done' for '--status <STATUS>': unknown job status",
        ),
    ] {
        let o = run_env(&[("CLICOLOR_FORCE", "1"), ("TERM", "xterm-256color")], args);
        assert_eq!(o.code, 2, "{args:?}: {o:?}");
        assert!(o.stdout.is_empty(), "{args:?}: {o:?}");
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {o:?}");
        let v: Value = serde_json::from_str(o.stderr.trim())
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {o:?}"));
        assert_eq!(v["error"]["code"], code, "{args:?}: {o:?}");
        assert_eq!(v["error"]["exit_code"], 2, "{args:?}: {o:?}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.starts_with(message), "{args:?}: {m:?}");
        for terminal in ["error:", "Usage:", "--help", "\n", "\u{1b}"] {
            assert!(!m.contains(terminal), "{args:?}: {terminal:?} in {m:?}");
        }
    }
}

#[test]
fn stalled_jobs_are_listed_requeued_or_failed_and_dead_workers_forgotten() {
    let (db, url) = migrated();
    let url = url.as_str();
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_workers (id, name, host, concurrency, last_heartbeat)
         VALUES (900, 'ghost', 'h', 1, now() - interval '1 hour'),
                (901, 'alive', 'h', 4, now());
         INSERT INTO postpone_jobs (queue, task, args, status, worker_id, attempts, started_at)
         VALUES ('q', 'a', 'null', 'doing', 900, 1, now()),
                ('q', 'b', 'null', 'doing', 900, 1, now()),
                ('q', 'c', 'null', 'doing', 901, 1, now()),
                ('q', 'd', 'null', 'doing', 777, 1, now());",
    )
    .unwrap();
    // workers: the ghost is stale; claimed jobs per worker.
    let t = table(&ok(url, &["workers"]));
    assert_eq!(t[1][..2], ["900", "ghost"]);
    assert_eq!(
        (t[1][6].as_str(), t[1][8].as_str(), t[1][9].as_str()),
        ("2", "-", "STALE")
    );
    assert_eq!((t[2][6].as_str(), t[2][9].as_str()), ("1", "live"));
    let w = json(url, &["workers", "--stale-after", "2h"]);
    assert_eq!(
        (w[0]["stale"].clone(), w[0]["claimed"].clone()),
        (false.into(), 2.into())
    );
    // stalled: the ghost's jobs and the orphan (worker 777 gone).
    let t = table(&ok(url, &["stalled"]));
    let ids: Vec<&str> = t[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(ids, ["1", "2", "4"]);
    assert_eq!(
        ok(url, &["stalled", "--requeue", "--dry-run"]),
        "dry run: 3 stalled job(s) would be requeued\n"
    );
    assert_eq!(json(url, &["stalled"]).as_array().unwrap().len(), 3);
    // An abort recorded for a stalled job survives the requeue: it ends aborted.
    c.batch_execute("UPDATE postpone_jobs SET abort_requested = true WHERE id = 2")
        .unwrap();
    assert_eq!(
        json(url, &["stalled", "--requeue"]),
        serde_json::json!({"dry_run": false, "jobs": 3, "workers": 0})
    );
    assert_eq!(status_of(url, JobId(2)), "aborted");
    let j = json(url, &["job", "1"]);
    assert_eq!(
        (j["status"].clone(), j["attempts"].clone()),
        ("todo".into(), 1.into())
    );
    assert!(j["errors"][0]["error"]
        .as_str()
        .unwrap()
        .contains("requeued by an operator: its worker (id 900)"));
    assert_eq!(ok(url, &["stalled"]), "no stalled jobs\n");
    assert_eq!(status_of(url, JobId(3)), "doing");
    // --fail ends them failed.
    c.batch_execute("UPDATE postpone_jobs SET status = 'doing', worker_id = 900 WHERE id = 1")
        .unwrap();
    assert_eq!(
        ok(url, &["stalled", "--fail", "--forget-workers"]),
        "1 stalled job(s) failed; 1 dead worker(s) forgotten\n"
    );
    assert_eq!(status_of(url, JobId(1)), "failed");
    let w = json(url, &["workers"]);
    assert_eq!(w.as_array().unwrap().len(), 1);
    assert_eq!(w[0]["name"], "alive");
    fails(Some(url), &["stalled", "--dry-run"], "--dry-run goes with");
    fails(
        Some(url),
        &["stalled", "--requeue", "--fail"],
        "cannot be used with",
    );
}

#[test]
fn healthcheck_checks_live_workers_and_lag_for_probes() {
    let (db, url) = migrated();
    let url = url.as_str();
    let mut c = db.client();
    let o = run(url, &["healthcheck", "--min-workers", "1"]);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(
        o.stdout.contains(
            "0 live worker(s) (heartbeat within their lease), fewer than --min-workers 1"
        ),
        "{o:?}"
    );
    c.batch_execute(
        "INSERT INTO postpone_workers (name, queues, last_heartbeat)
         VALUES ('w1', '{mail}', now()), ('w2', NULL, now() - interval '1 hour');
         INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
         VALUES ('mail', 't', 'null', now() - interval '10 minutes'),
                ('img', 't', 'null', now());",
    )
    .unwrap();
    let out = ok(
        url,
        &["healthcheck", "--min-workers", "1", "--queue", "mail"],
    );
    // w1 serves mail only, and w2 is stale: nobody serves img.
    let o = run(
        url,
        &["healthcheck", "--min-workers", "1", "--queue", "img"],
    );
    assert_eq!(o.code, 1, "{o:?}");
    assert!(
        out.starts_with(&format!(
            "ok: database answers, schema version {}, 1 live worker(s)",
            postpone::SCHEMA_VERSION
        )),
        "{out}"
    );
    let o = run(url, &["healthcheck", "--min-workers", "2"]);
    assert_eq!(o.code, 1, "{o:?}");
    let o = run(url, &["healthcheck", "--max-lag", "5m"]);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stdout.contains("longer than --max-lag 5m00s"), "{o:?}");
    let out = ok(url, &["healthcheck", "--max-lag", "5m", "--queue", "img"]);
    assert!(out.contains(", lag "), "{out}");
    let v = json(
        url,
        &["healthcheck", "--max-lag", "1h", "--min-workers", "1"],
    );
    assert_eq!(v["healthy"], true);
    assert_eq!(v["live_workers"], 1);
    assert!(v["lag_secs"].as_f64().unwrap() >= 600.0, "{v}");
    // A job due at -infinity is an infinite lag, and still no crash.
    c.batch_execute("UPDATE postpone_jobs SET scheduled_at = '-infinity' WHERE queue = 'img'")
        .unwrap();
    let o = run(url, &["healthcheck", "--max-lag", "1h", "--queue", "img"]);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stdout.contains("waited infinite"), "{o:?}");
}

#[test]
fn a_newer_schema_is_refused_everywhere_with_both_versions_and_exit_8() {
    let (db, url) = migrated();
    let url = url.as_str();
    db.client()
        .batch_execute(
            "INSERT INTO postpone_migrations (version, name) VALUES (99, 'from the future');
             ALTER TABLE postpone_jobs DROP CONSTRAINT postpone_jobs_status_check;
             INSERT INTO postpone_jobs (queue, task, args, status) VALUES ('q', 't', '1', 'paused')",
        )
        .unwrap();
    let says = &format!(
        "the database schema is at version 99, newer than this postpone (version {})",
        postpone::SCHEMA_VERSION
    );
    for args in [
        &["jobs"][..],
        &["stats"],
        &["workers"],
        &["retry", "--status", "failed"],
        &["defer", "t"],
        &["migrate"],
        &["migrate", "--print"],
    ] {
        fails_with(Some(url), args, 8, says);
    }
    let o = run(url, &["healthcheck"]);
    assert_eq!(o.code, 8, "{o:?}");
    assert!(o.stdout.starts_with(&format!("unhealthy: {says}")), "{o:?}");
    let o = run(url, &["healthcheck", "--json"]);
    assert_eq!(o.code, 8, "{o:?}");
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(
        (v["healthy"].clone(), v["supported_version"].clone()),
        (false.into(), postpone::SCHEMA_VERSION.into())
    );
    // Nothing was inserted by the refused defer.
    let n: i64 = db
        .client()
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

#[test]
fn tables_without_a_migration_record_are_explained_not_a_dead_end() {
    let (db, url) = migrated();
    let url = url.as_str();
    db.client()
        .batch_execute("DROP TABLE postpone_migrations")
        .unwrap();
    let says = "postpone's tables exist but no migration is recorded";
    let o = run(url, &["healthcheck"]);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stdout.contains(says), "{o:?}");
    fails_with(Some(url), &["migrate"], 7, says);
    fails_with(Some(url), &["jobs"], 7, says);
    // Tables that differ from this postpone's are not adopted; the message says how.
    let mut c = db.client();
    c.batch_execute(
        "DROP INDEX postpone_jobs_due_idx; ALTER TABLE postpone_jobs ADD COLUMN note text",
    )
    .unwrap();
    fails_with(
        Some(url),
        &["migrate", "--adopt"],
        7,
        &format!("differ from this postpone's version {} (missing: index CREATE INDEX postpone_jobs_due_idx ON postpone_jobs USING btree (priority DESC, scheduled_at, id) WHERE ((status = 'todo'::text) AND (blocked_by IS NULL) AND (expires_at IS NULL)); unexpected: column postpone_jobs.note text); nothing was changed", postpone::SCHEMA_VERSION),
    );
    assert!(run(url, &["healthcheck"]).stdout.contains(says));
    // Put back as they were, they are adopted, and all is well.
    c.batch_execute(
        "ALTER TABLE postpone_jobs DROP COLUMN note;
         CREATE INDEX postpone_jobs_due_idx ON postpone_jobs (priority DESC, scheduled_at, id)
           WHERE status = 'todo' AND blocked_by IS NULL AND expires_at IS NULL",
    )
    .unwrap();
    assert_eq!(
        ok(url, &["migrate", "--adopt"]),
        format!(
            "adopted the existing tables: schema recorded at version {}\n",
            postpone::SCHEMA_VERSION
        )
    );
    assert_eq!(
        ok(url, &["healthcheck"]),
        format!(
            "ok: database answers, schema version {}\n",
            postpone::SCHEMA_VERSION
        )
    );
    assert_eq!(
        ok(url, &["migrate"]),
        format!(
            "schema is up to date (version {})\n",
            postpone::SCHEMA_VERSION
        )
    );
    fails_with(
        Some(url),
        &["migrate", "--adopt"],
        4,
        &format!(
            "nothing to adopt: migrations are recorded (version {})",
            postpone::SCHEMA_VERSION
        ),
    );
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'postpone_adopt_scratch'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "the scratch schema was left behind");
}

#[test]
fn migrate_print_shows_the_missing_sql_and_changes_nothing() {
    let db = TestDb::new();
    let url = db.url();
    let script = ok(&url, &["migrate", "--print"]);
    assert!(
        script.starts_with(&format!(
            "-- postpone schema migrations 1..{}",
            postpone::SCHEMA_VERSION
        )),
        "{script}"
    );
    assert!(script.contains("CREATE TABLE postpone_jobs"));
    assert!(script.trim_end().ends_with("COMMIT;"));
    assert!(run(&url, &["healthcheck"])
        .stdout
        .contains("schema not installed"));
    // The script works as printed.
    db.client().batch_execute(&script).unwrap();
    assert_eq!(
        ok(&url, &["migrate"]),
        format!(
            "schema is up to date (version {})\n",
            postpone::SCHEMA_VERSION
        )
    );
    assert_eq!(
        ok(&url, &["migrate", "--print"]),
        format!(
            "-- postpone: the schema is current (version {}); nothing to run\n",
            postpone::SCHEMA_VERSION
        )
    );
    // --all needs no database at all.
    assert_eq!(ok(UNREACHABLE, &["migrate", "--print", "--all"]), script);
}

#[test]
fn timeout_bounds_migrate_behind_a_held_migration_lock() {
    let db = TestDb::new();
    let url = db.url();
    let mut holder = db.client();
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&0x706f_7374_706f_6e65_i64])
        .unwrap();
    let t = Instant::now();
    let o = run(&url, &["migrate", "--timeout", "2s"]);
    let took = t.elapsed();
    assert_eq!(o.code, 5, "{o:?}");
    assert!(o.stderr.contains("gave up after 2s (the timeout)"), "{o:?}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    holder
        .execute(
            "SELECT pg_advisory_unlock($1)",
            &[&0x706f_7374_706f_6e65_i64],
        )
        .unwrap();
    ok(&url, &["migrate"]);
}

#[test]
fn json_piped_into_a_closed_reader_exits_0_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    let (db, url) = migrated();
    db.client()
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args)
             SELECT 'q', 't', jsonb_build_object('pad', repeat('x', 400)) FROM generate_series(1, 2000)",
        )
        .unwrap();
    for args in [
        &["jobs", "--json", "--limit", "2000"][..],
        &["jobs", "--json", "--all"],
        &["jobs", "--all"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_postpone"))
            .env_remove("RUST_LOG")
            .arg("--database-url")
            .arg(&url)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 100];
        stdout.read_exact(&mut first).unwrap();
        drop(stdout); // as `head -c 100` does
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
        assert!(
            o.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn defer_keeps_the_callers_json_exactly() {
    let (db, url) = migrated();
    let url = url.as_str();
    let args = r#"{"big": 18446744073709551616, "precise": 0.1000000000000000055511151231257827, "neg": -1e-400}"#;
    ok(url, &["defer", "t", args]);
    let stored: String = db
        .client()
        .query_one("SELECT args::text FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert!(stored.contains("\"big\": 18446744073709551616"), "{stored}");
    assert!(
        stored.contains("\"precise\": 0.1000000000000000055511151231257827"),
        "{stored}"
    );
    // ... and shows it so: in the table, the detail and the JSON.
    let out = ok(url, &["job", "1", "--json"]);
    assert!(out.contains("18446744073709551616"), "{out}");
    assert!(
        out.contains("0.1000000000000000055511151231257827"),
        "{out}"
    );
    assert!(ok(url, &["job", "1"]).contains("18446744073709551616"));
    fails(
        Some(url),
        &["defer", "t", "[1,]"],
        "invalid JSON arguments [1,]",
    );
}

#[test]
fn control_characters_are_escaped_in_tables_but_kept_in_json() {
    let (db, url) = migrated();
    let url = url.as_str();
    db.client()
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args, status, finished_at, errors)
             VALUES (E'q\\nfake row', E'evil\\u001b[2J', '\"x\"', 'failed', now(),
                     jsonb_build_array(jsonb_build_object('attempt', 1,
                         'error', E'line1\\nline2\\u001b]0;title\\u0007')))",
        )
        .unwrap();
    let out = ok(url, &["jobs"]);
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.contains("q\\nfake row") && out.contains("evil\\x1b[2J"),
        "{out}"
    );
    let out = ok(url, &["job", "1"]);
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert!(
        out.contains("attempt 1 at -: line1\\nline2\\x1b]0;title\\x07"),
        "{out}"
    );
    for args in [&["stats"][..], &["stats", "--by", "task"]] {
        let out = ok(url, args);
        assert!(
            !out.contains('\u{1b}') && out.lines().count() == 2,
            "{out:?}"
        );
    }
    // JSON keeps the exact text (escaped the JSON way).
    let v = json(url, &["job", "1"]);
    assert_eq!(v["task"], "evil\u{1b}[2J");
    assert_eq!(v["errors"][0]["error"], "line1\nline2\u{1b}]0;title\u{7}");
    // An error message that echoes input is escaped too.
    let o = run(url, &["defer", "t", "\u{1b}[2J"]);
    assert_eq!(o.code, 2);
    assert!(!o.stderr.contains('\u{1b}'), "{o:?}");
}

#[test]
fn one_bad_row_never_breaks_stats() {
    let (db, url) = migrated();
    let url = url.as_str();
    db.client()
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args, scheduled_at)
             VALUES ('bad', 't', 'null', '-infinity'), ('good', 't', 'null', now());
             INSERT INTO postpone_jobs (queue, task, args, status, started_at, finished_at)
             VALUES ('good', 't', 'null', 'succeeded', '-infinity', now()),
                    ('good', 't', 'null', 'succeeded', now() - interval '2 s', now()),
                    ('good', 't', 'null', 'failed', now() - interval '4 s', 'infinity')",
        )
        .unwrap();
    let t = table(&ok(url, &["stats"]));
    assert_eq!(t[1][0], "bad");
    assert_eq!(t[1][12], "infinite");
    assert_eq!(
        t[2][..9],
        ["good", "1", "0", "0", "2", "1", "0", "0", "33.3"]
    );
    assert_eq!(t[2][9], "2.0s");
    let v = json(url, &["stats", "--window", "1h"]);
    assert_eq!(v[1]["succeeded"], 2);
    // The failed job finished at +infinity: inside no window... but counted without one.
    assert_eq!(v[1]["failed"], 1);
    assert!(v[0]["oldest_todo_age_secs"].as_f64().unwrap() > 1e15);
    assert!(
        (v[1]["run_time_p50_secs"].as_f64().unwrap() - 2.0).abs() < 0.1,
        "{v}"
    );
}

#[test]
fn exit_codes_are_distinct_and_errors_are_json_under_json() {
    let (_db, url) = migrated();
    let url = url.as_str();
    for (args, code, name) in [
        (&["job", "5", "--json"][..], 3, "not_found"),
        (&["--json", "job", "abc"], 2, "value_validation"),
        (&["retry", "--json"], 2, "usage"),
    ] {
        let o = run(url, args);
        assert_eq!(o.code, code, "{args:?}: {o:?}");
        assert!(o.stdout.is_empty(), "{o:?}");
        let v: Value =
            serde_json::from_str(o.stderr.trim()).unwrap_or_else(|e| panic!("{e}: {o:?}"));
        assert_eq!(v["error"]["code"], name, "{o:?}");
        assert_eq!(v["error"]["exit_code"], code, "{o:?}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    ok(url, &["defer", "t"]);
    let o = run(url, &["retry", "1", "--json"]);
    assert_eq!(o.code, 4, "{o:?}");
    let v: Value = serde_json::from_str(o.stderr.trim()).unwrap();
    assert_eq!(v["error"]["code"], "wrong_state");
    let o = run(UNREACHABLE, &["stats", "--json"]);
    assert_eq!(o.code, 5, "{o:?}");
    let v: Value = serde_json::from_str(o.stderr.trim()).unwrap();
    assert_eq!(v["error"]["code"], "unreachable");
    // Permission denied: a role that may log in but not read postpone's tables.
    let db2 = TestDb::new();
    let mut c = db2.client();
    c.batch_execute(
        "DO $$ BEGIN
           IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'postpone_cli_reader') THEN
             CREATE ROLE postpone_cli_reader LOGIN;
           END IF;
         END $$;",
    )
    .unwrap();
    ok(&db2.url(), &["migrate"]);
    c.batch_execute("REVOKE ALL ON postpone_jobs FROM PUBLIC")
        .unwrap();
    let reader = db2
        .url()
        .replacen("postgres://postgres@", "postgres://postpone_cli_reader@", 1);
    assert!(reader.contains("postpone_cli_reader@"), "{reader}");
    fails_with(
        Some(&reader),
        &["jobs"],
        6,
        "permission denied for table postpone_",
    );
}

/// A database that does not exist was reported as unreachable (exit 5, "cannot reach the
/// database") although the server answered SQLSTATE 3D000: it has its own exit code and a
/// message that says what to do, in text and in JSON, for every command that connects.
#[test]
fn a_missing_database_exits_9_and_says_to_create_it() {
    let db = TestDb::new();
    let missing = format!("{}_missing", db.name());
    let url = db.server().url(&missing);
    let says = format!("database \"{missing}\" does not exist; create it or check the URL");
    for args in [&["jobs"][..], &["stats"], &["migrate"], &["pause", "q"]] {
        fails_with(Some(&url), args, 9, &says);
        let o = run(&url, args);
        assert!(!o.stderr.contains("cannot reach"), "{args:?}: {o:?}");
    }
    let o = run(&url, &["jobs", "--json"]);
    assert_eq!(o.code, 9, "{o:?}");
    let v: Value = serde_json::from_str(o.stderr.trim()).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(v["error"]["code"], "database_missing", "{o:?}");
    assert_eq!(v["error"]["exit_code"], 9, "{o:?}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(&says),
        "{o:?}"
    );
    // healthcheck keeps its own codes: unhealthy (1), saying why.
    let o = run(&url, &["healthcheck"]);
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stdout.contains(&says), "{o:?}");
}

#[test]
fn libpq_environment_variables_choose_the_database_and_v_says_which() {
    let (db, url) = migrated();
    ok(&url, &["defer", "from-env"]);
    let c: postgres::Config = url.parse().unwrap();
    let host = match &c.get_hosts()[0] {
        postgres::config::Host::Tcp(h) => h.clone(),
        _ => unreachable!(),
    };
    let port = c.get_ports()[0].to_string();
    let env = [
        ("PGHOST", host.as_str()),
        ("PGPORT", port.as_str()),
        ("PGUSER", c.get_user().unwrap()),
        ("PGDATABASE", db.name()),
        ("PGSSLMODE", "disable"),
    ];
    let o = run_env(&env, &["jobs", "--json", "-v"]);
    assert_eq!(o.code, 0, "{o:?}");
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["jobs"][0]["task"], "from-env");
    assert!(
        o.stderr.contains(&format!(
            "postpone: database {}@{host}:{port}/{} (from PG* environment)",
            c.get_user().unwrap(),
            db.name()
        )),
        "{o:?}"
    );
    // DATABASE_URL wins over PGDATABASE; --database-url over both.
    let o = run_env(
        &[("DATABASE_URL", &url), ("PGDATABASE", "nowhere")],
        &["healthcheck", "-v"],
    );
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("(from DATABASE_URL)"), "{o:?}");
    let o = run_env(
        &[("DATABASE_URL", "postgres://postgres@127.0.0.1:1/x")],
        &["--database-url", &url, "healthcheck", "-v"],
    );
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("(from --database-url)"), "{o:?}");
    // A database that does not exist is named in the error.
    let o = run_env(
        &[
            ("PGHOST", &host),
            ("PGPORT", &port),
            ("PGDATABASE", "no_such_db_x"),
        ],
        &["stats"],
    );
    assert_ne!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("no_such_db_x"), "{o:?}");
}

#[test]
fn prune_dry_run_counts_and_deletes_nothing() {
    let (db, url) = migrated();
    let url = url.as_str();
    db.client()
        .batch_execute(
            "INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
             SELECT 'q', 't', 'null', 'succeeded', now() - interval '10 days' FROM generate_series(1, 30);
             INSERT INTO postpone_jobs (queue, task, args, status, finished_at)
             VALUES ('q', 't', 'null', 'failed', now() - interval '10 days'),
                    ('q', 't', 'null', 'failed', now())",
        )
        .unwrap();
    assert_eq!(
        ok(url, &["prune", "--older-than", "7d", "--dry-run"]),
        "dry run: 31 job(s) would be deleted\n"
    );
    assert_eq!(
        json(
            url,
            &[
                "prune",
                "--older-than",
                "7d",
                "--status",
                "failed",
                "--dry-run"
            ]
        ),
        serde_json::json!({"dry_run": true, "jobs": 1})
    );
    assert_eq!(json(url, &["stats"])[0]["succeeded"], 30);
    assert_eq!(
        ok(url, &["prune", "--older-than", "7d"]),
        "deleted 31 job(s) and 0 periodic record(s)\n"
    );
}

/// Splits a shell command line into words: whitespace separates, '...' is literal, "..."
/// takes `\"` and `\\`.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    cur.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' if matches!(chars.peek(), Some('"') | Some('\\')) => {
                            cur.push(chars.next().unwrap())
                        }
                        c => cur.push(c),
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// Output with what changes from run to run blurred: times, ages and durations, padding.
fn normalise(text: &str) -> String {
    // Times: 2026-12-01 13:56:21 and 2026-12-01T13:56:21.262855Z.
    let b = text.as_bytes();
    let mut s = String::new();
    let mut i = 0;
    let shape = b"dddd-dd-dd?dd:dd:dd";
    while i < b.len() {
        let is_time = i + shape.len() <= b.len()
            && shape.iter().zip(&b[i..]).all(|(p, c)| match p {
                b'd' => c.is_ascii_digit(),
                b'?' => *c == b' ' || *c == b'T',
                p => p == c,
            });
        if is_time {
            s.push_str("<time>");
            i += shape.len();
            if b.get(i) == Some(&b'.') {
                i += 1;
                while b.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
            }
            if b.get(i) == Some(&b'Z') {
                i += 1;
            }
        } else {
            let ch = text[i..].chars().next().unwrap();
            s.push(ch);
            i += ch.len_utf8();
        }
    }
    let is_age = |t: &str| {
        let t = t.trim_end_matches([',', ')']);
        let num = |x: &str| !x.is_empty() && x.chars().all(|c| c.is_ascii_digit() || c == '.');
        ["ms", "s"].iter().any(|u| {
            t.strip_suffix(u).is_some_and(|n| {
                num(n) || {
                    // 5m12s, 3h05m, 2d03h
                    n.split(['m', 'h', 'd']).all(num)
                }
            })
        }) || ["m", "h"].iter().any(|u| {
            t.strip_suffix(u)
                .is_some_and(|n| n.split(['h', 'd']).count() == 2 && n.split(['h', 'd']).all(num))
        })
    };
    s.lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| if is_age(t) { "<age>" } else { t })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn normalise_blurs_times_and_ages_only() {
    assert_eq!(
        normalise("5   2026-12-01 13:56:21  12.3s  5m12s 3h05m 850ms x\n{\"t\": \"2026-12-01T13:56:21.262855Z\"}"),
        "5 <time> <age> <age> <age> <age> x\n{\"t\": \"<time>\"}"
    );
    assert_eq!(normalise("queue 10 5m"), "queue 10 5m");
    assert_eq!(
        shell_words(r#"psql -qc "a \"b\" 'c'" 'd e' f"#),
        ["psql", "-qc", "a \"b\" 'c'", "d e", "f"]
    );
}

/// Every console block of docs/cli.md, run against a fresh database: its output must match
/// (see `normalise`). With UPDATE_DOCS=1 the file is rewritten from the real outputs.
#[test]
fn docs_match_real_output() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let db = TestDb::new();
    let url = db.url();
    let mut client = db.client();
    let mut exported = false;
    let mut last_code = 0;
    let mut out_doc = String::new();
    let mut in_block = false;
    // (command, expected, actual) per command, in order.
    let mut runs: Vec<(String, String, String)> = Vec::new();
    let mut lines = doc.lines().peekable();
    while let Some(line) = lines.next() {
        if !in_block {
            out_doc.push_str(line);
            out_doc.push('\n');
            in_block = line == "```console";
            continue;
        }
        if line == "```" {
            out_doc.push_str("```\n");
            in_block = false;
            continue;
        }
        let Some(cmd) = line.strip_prefix("$ ") else {
            panic!("docs/cli.md: output line without a command: {line:?}");
        };
        let mut expected = String::new();
        while let Some(next) = lines.peek() {
            if next.starts_with("$ ") || *next == "```" {
                break;
            }
            expected.push_str(lines.next().unwrap());
            expected.push('\n');
        }
        let words = shell_words(cmd);
        let actual = match words[0].as_str() {
            "export" => {
                exported = true;
                String::new()
            }
            "echo" => format!("{last_code}\n"),
            "psql" => {
                client.batch_execute(&words[2]).unwrap();
                String::new()
            }
            "postpone" => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_postpone"));
                c.env_remove("RUST_LOG").env_remove("DATABASE_URL");
                if exported {
                    c.env("DATABASE_URL", &url);
                }
                let o = c.args(&words[1..]).output().unwrap();
                last_code = o.status.code().unwrap_or(-1);
                let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&o.stderr));
                text
            }
            other => panic!("docs/cli.md: unknown command {other}"),
        };
        out_doc.push_str(line);
        out_doc.push('\n');
        out_doc.push_str(&actual);
        runs.push((cmd.to_owned(), expected, actual));
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(path, out_doc).unwrap();
        return;
    }
    for (cmd, expected, actual) in &runs {
        assert_eq!(
            normalise(expected),
            normalise(actual),
            "docs/cli.md: the output of `{cmd}` differs (UPDATE_DOCS=1 rewrites it):\n--- docs\n{expected}--- real\n{actual}"
        );
    }
}

#[test]
fn schedules_are_added_listed_paused_resumed_and_removed_and_bad_ones_refused() {
    let (_db, url) = migrated();
    let url = url.as_str();
    let out = ok(
        url,
        &[
            "schedule",
            "add",
            "report",
            "0 8 * * *",
            "--id",
            "paris",
            "--time-zone",
            "Europe/Paris",
            "--args",
            r#"{"a": 1}"#,
        ],
    );
    assert!(
        out.starts_with("schedule report (id paris) stored\nnext instant: "),
        "{out}"
    );
    let v = json(url, &["schedules"]);
    assert_eq!(v[0]["task"], "report");
    assert_eq!(v[0]["id"], "paris");
    assert_eq!(v[0]["time_zone"], "Europe/Paris");
    assert_eq!(v[0]["args"], serde_json::json!({"a": 1}));
    assert_eq!(v[0]["catch_up"], 600);
    assert!(
        v[0]["paused_at"].is_null() && v[0]["next_instant"].is_string(),
        "{v}"
    );
    let v = json(url, &["schedule", "pause", "report", "--id", "paris"]);
    assert_eq!(v["changed"], true);
    assert_eq!(
        ok(url, &["schedule", "pause", "report", "--id", "paris"]),
        "schedule report (id paris) was paused already\n"
    );
    let rows = table(&ok(url, &["schedules"]));
    assert_eq!(
        rows[1][..5],
        ["report", "paris", "0 8 * * *", "Europe/Paris", "paused"]
    );
    assert_eq!(
        rows[1][6], "-",
        "a paused schedule has no next instant: {rows:?}"
    );
    assert!(ok(url, &["schedule", "resume", "report", "--id", "paris"]).contains("resumed"));

    // Bad inputs: exit 2 and what is wrong; a missing schedule: exit 3.
    fails(
        Some(url),
        &["schedule", "add", "r", "61 * * * *"],
        "invalid cron schedule \"61 * * * *\"",
    );
    fails(
        Some(url),
        &[
            "schedule",
            "add",
            "r",
            "@daily",
            "--time-zone",
            "Mars/Olympus_Mons",
        ],
        "unknown time zone \"Mars/Olympus_Mons\"",
    );
    fails(
        Some(url),
        &["schedule", "add", "", "@daily"],
        "task must not be empty",
    );
    let long = "t".repeat(300);
    fails(
        Some(url),
        &["schedule", "add", &long, "@daily"],
        "at most 255",
    );
    fails(
        Some(url),
        &["schedule", "add", "r", "@daily", "--args", "{nope"],
        "--args is not valid JSON",
    );
    fails(
        Some(url),
        &["schedule", "add", "r", "@daily", "--catch-up", "2d"],
        "longer than the 24h",
    );
    fails_with(
        Some(url),
        &["schedule", "add", "report", "@daily", "--id", "paris"],
        4,
        "exists already",
    );
    fails_with(
        Some(url),
        &["schedule", "remove", "nope"],
        3,
        "no stored schedule \"nope\"",
    );
    fails_with(
        Some(url),
        &["schedule", "pause", "report"],
        3,
        "no stored schedule \"report\"",
    );
    assert_eq!(
        json(url, &["schedules"]).as_array().unwrap().len(),
        1,
        "a bad schedule was stored"
    );
    // --replace changes it.
    assert!(ok(
        url,
        &[
            "schedule",
            "add",
            "report",
            "@daily",
            "--id",
            "paris",
            "--replace"
        ]
    )
    .starts_with("schedule report (id paris) replaced\n"));
    assert_eq!(json(url, &["schedules"])[0]["cron"], "@daily");
    assert_eq!(
        ok(url, &["schedule", "remove", "report", "--id", "paris"]),
        "schedule report (id paris) removed\n"
    );
    assert_eq!(
        ok(url, &["schedules"]),
        "no schedule is stored (schedules given in workers' code are not listed)\n"
    );
}

#[test]
fn pause_and_resume_queues_and_stats_shows_them() {
    let (_db, url) = migrated();
    let url = url.as_str();
    ok(url, &["defer", "t", "1", "--queue", "emails"]);
    ok(url, &["defer", "t", "2", "--queue", "reports"]);
    assert_eq!(
        ok(url, &["pause", "emails"]),
        "queue emails paused: no worker starts its jobs until resumed; running jobs finish\n"
    );
    assert_eq!(
        ok(url, &["pause", "emails"]),
        "queue emails was already paused\n"
    );
    // A queue without jobs can be paused too, and is listed.
    let v = json(url, &["pause", "later"]);
    assert_eq!(v["queue"], "later");
    assert_eq!(v["paused"], true);
    assert_eq!(v["changed"], true);
    let text = ok(url, &["stats"]);
    assert!(
        text.ends_with("-- paused: emails, later (postpone resume QUEUE)\n"),
        "{text}"
    );
    let v = json(url, &["stats"]);
    let paused: Vec<(String, bool)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["queue"].as_str().unwrap().to_owned(), r["paused"] == true))
        .collect();
    assert_eq!(
        paused,
        [
            ("emails".to_owned(), true),
            ("later".to_owned(), true),
            ("reports".to_owned(), false)
        ]
    );

    assert_eq!(
        ok(url, &["pause", "--all"]),
        "every queue paused: no worker starts its jobs until resumed; running jobs finish\n"
    );
    assert!(ok(url, &["stats"]).ends_with("-- paused: every queue (postpone resume --all)\n"));
    assert!(json(url, &["stats"])
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["paused"] == true));
    assert_eq!(
        ok(url, &["resume", "reports"]),
        "queue reports is still paused: every queue is (postpone resume --all lifts that)\n"
    );
    assert_eq!(
        ok(url, &["resume", "--all"]),
        "every queue resumed; its workers were woken\n"
    );
    assert!(!ok(url, &["stats"]).contains("paused"));
    assert_eq!(
        ok(url, &["resume", "emails"]),
        "queue emails was not paused\n"
    );
    let v = json(url, &["resume", "emails"]);
    assert_eq!(v["changed"], false);
    assert_eq!(v["paused"], false);

    // Bad input: exit 2 with a message, nothing stored.
    fails(Some(url), &["pause"], "QUEUE");
    fails(Some(url), &["pause", "q", "--all"], "cannot be used with");
    fails(Some(url), &["pause", ""], "queue must not be empty");
    fails(Some(url), &["resume", &"q".repeat(256)], "queue");
    assert!(!ok(url, &["stats"]).contains("paused"));
}

/// `pause nosuchqueue` and `limit typoqueue 3` accepted a queue never seen, silently, while
/// `rate-limit` printed a note of its own. Every command that names a queue does what was
/// asked and says it the same way: one note line in text, `queue_seen` in JSON.
#[test]
fn commands_naming_a_queue_never_seen_do_it_and_say_so_the_same_way() {
    let (db, url) = migrated();
    let url = url.as_str();
    ok(url, &["defer", "t", "--queue", "known"]);
    let note = |q: &str| {
        format!(
            "note: queue {q} has never been seen (no job of it in the table, no worker serving it by name); done all the same, since queues are not declared: check the name\n"
        )
    };
    let commands: [&[&str]; 8] = [
        &["pause", "QUEUE"],
        &["resume", "QUEUE"],
        &["limit", "QUEUE", "3"],
        &["limit", "QUEUE", "--clear"],
        &["rate-limit", "QUEUE", "5", "1m"],
        &["rate-limit", "QUEUE", "--clear"],
        &["key-limit", "QUEUE", "2", "--by", "user"],
        &["key-limit", "QUEUE", "--clear"],
    ];
    for (queue, seen) in [("typoqueue", false), ("known", true)] {
        for c in commands {
            let args: Vec<&str> = c
                .iter()
                .map(|a| if *a == "QUEUE" { queue } else { a })
                .collect();
            let text = ok(url, &args);
            let lines: Vec<&str> = text.lines().collect();
            if seen {
                assert_eq!(lines.len(), 1, "{args:?}: {text}");
                assert!(!text.contains("note:"), "{args:?}: {text}");
            } else {
                assert_eq!(lines.len(), 2, "{args:?}: {text}");
                assert!(text.ends_with(&note(queue)), "{args:?}: {text}");
            }
            let v = json(url, &args);
            assert_eq!(v["queue"], queue, "{args:?}: {v}");
            assert_eq!(v["queue_seen"], seen, "{args:?}: {v}");
        }
    }
    // Still done as asked: the pause and the limit of the unseen queue are stored.
    ok(url, &["pause", "typoqueue"]);
    ok(url, &["limit", "typoqueue", "4"]);
    let paused: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM postpone_paused_queues WHERE queue = 'typoqueue'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(paused, 1);
    assert!(ok(url, &["limit"]).contains("typoqueue: 0 running of at most 4"));
    // Every queue at once names none: no note, no queue_seen.
    assert!(!ok(url, &["pause", "--all"]).contains("note:"));
    let v = json(url, &["resume", "--all"]);
    assert!(v.get("queue_seen").is_none(), "{v}");
}

#[test]
fn defer_with_tags_and_meta_then_list_by_tag() {
    let (_db, url) = migrated();
    let url = url.as_str();
    let id = ok(
        url,
        &[
            "defer",
            "t",
            "1",
            "--tag",
            "billing",
            "--tag",
            "eu",
            "--meta",
            r#"{"request": "r-1", "n": 18446744073709551616}"#,
        ],
    );
    assert_eq!(id, "deferred job 1 (t)\n");
    ok(url, &["defer", "t", "2", "--tag", "billing"]);
    ok(url, &["defer", "t", "3"]);
    let ids = |args: &[&str]| -> Vec<String> {
        let mut a = vec!["jobs"];
        a.extend_from_slice(args);
        table(&ok(url, &a))
            .iter()
            .skip(1)
            .filter(|r| !r[0].starts_with("--"))
            .map(|r| r[0].clone())
            .collect()
    };
    assert_eq!(ids(&["--tag", "billing"]), ["2", "1"]);
    assert_eq!(ids(&["--tag", "billing", "--tag", "eu"]), ["1"]);
    assert_eq!(ids(&["--tag", "nothing"]), Vec::<String>::new());
    let v = json(url, &["job", "1"]);
    assert_eq!(v["tags"], serde_json::json!(["billing", "eu"]));
    assert_eq!(v["meta"]["request"], "r-1");
    let text = ok(url, &["job", "1"]);
    assert!(text.contains("\ntags:            billing, eu\n"), "{text}");
    assert!(text.contains("\nmeta:            {"), "{text}");
    // The bulk commands take the same selection.
    assert_eq!(
        ok(url, &["cancel", "--tag", "eu"]),
        "1 job(s) matched; 1 cancelled, 0 skipped\n"
    );
    fails(
        Some(url),
        &["defer", "t", "--meta", "[1]"],
        "must be a JSON object",
    );
    fails(
        Some(url),
        &["defer", "t", "--meta", "{"],
        "invalid JSON metadata",
    );
    fails(
        Some(url),
        &["defer", "t", "--tag", ""],
        "tag must not be empty",
    );
}

/// `postpone job` shows the output and the latest progress a task recorded (issue 14).
#[test]
fn job_shows_output_and_progress() {
    let db = TestDb::new();
    let url = db.url();
    ok(&url, &["migrate"]);
    ok(&url, &["defer", "thumb", "{}"]);
    db.client()
        .batch_execute(
            "UPDATE postpone_jobs SET output = '{\"size\": 7}', progress = '{\"done\": 3}',
                    progress_at = now()",
        )
        .unwrap();
    let text = ok(&url, &["job", "1"]);
    assert!(text.contains("output:          {\"size\":7}"), "{text}");
    assert!(
        text.contains("progress:        {\"done\":3} (at "),
        "{text}"
    );
}

/// The peak memory a `postpone -v` run reports on stderr, in bytes.
fn peak_memory(o: &Out) -> u64 {
    let line = o
        .stderr
        .lines()
        .find(|l| l.contains("peak memory of this process:"))
        .unwrap_or_else(|| panic!("no peak memory reported: {o:?}"));
    let kb: u64 = line
        .split("process: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unreadable peak memory: {line}"));
    kb * 1024
}

#[test]
fn job_output_is_bounded_unless_full_is_asked_and_full_is_exact() {
    let (db, url) = migrated();
    let mut c = db.client();
    // 12 MB of arguments, output 2 MB, a small progress report.
    let id: i64 = c
        .query_one(
            "SELECT postpone_defer('big', jsonb_build_object('blob', repeat('x', 12000000), 'deep',
                    (repeat('[', 100) || repeat(']', 100))::jsonb))",
            &[],
        )
        .unwrap()
        .get(0);
    c.execute(
        "UPDATE postpone_jobs SET output = jsonb_build_object('o', repeat('o', 2000000)),
                progress = '{\"done\": 1}', progress_at = now() WHERE id = $1",
        &[&id],
    )
    .unwrap();
    let stored = |col: &str| -> String {
        db.client()
            .query_one(
                &format!("SELECT {col}::text FROM postpone_jobs WHERE id = $1"),
                &[&id],
            )
            .unwrap()
            .get(0)
    };
    let (args, output) = (stored("args"), stored("output"));
    let sid = id.to_string();
    let small: i64 = c
        .query_one(
            "SELECT postpone_defer('t', jsonb_build_object('n', 18446744073709551616, 's', repeat('y', 500000)))",
            &[],
        )
        .unwrap()
        .get(0);
    let measured = |args: &[&str]| -> (String, u64) {
        let mut a = vec!["-v"];
        a.extend_from_slice(args);
        let o = run(&url, &a);
        assert_eq!(o.code, 0, "{o:?}");
        let peak = peak_memory(&o);
        eprintln!(
            "measured: postpone {}: {} bytes out, peak memory {:.1} MiB",
            args.join(" "),
            o.stdout.len(),
            peak as f64 / 1048576.0
        );
        (o.stdout, peak)
    };
    // What the tool costs showing a job of 500 KB: each run below may grow past it by less
    // than the 12 MB value (one copy of it held whole would not fit).
    let (_, base) = measured(&["job", &small.to_string()]);
    let bounded = |peak: u64| {
        assert!(
            peak < base + (8 << 20),
            "peak memory {peak} bytes, {base} for a small job"
        )
    };

    // Text: 4 KiB of each large value, saying how large it is and how to see it whole.
    let (text, peak) = measured(&["job", &sid]);
    assert!(text.len() < 20_000, "{} bytes of text output", text.len());
    assert!(
        text.contains(&format!(
            "(cut: the first 4096 of {} bytes; `postpone job {id} --full` prints it whole)",
            args.len()
        )),
        "{text}"
    );
    assert!(text.contains("progress:        {\"done\":1} (at"), "{text}");
    bounded(peak);

    // --json: values up to 1 MiB whole; larger ones null, with their size and start.
    let (doc, peak) = measured(&["--json", "job", &sid]);
    assert!(doc.len() < 20_000, "{} bytes of --json output", doc.len());
    let v: Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(v["args"], Value::Null);
    assert_eq!(v["output"], Value::Null);
    assert_eq!(v["cut"]["args"]["bytes"], serde_json::json!(args.len()));
    assert_eq!(v["cut"]["output"]["bytes"], serde_json::json!(output.len()));
    assert_eq!(v["cut"]["args"]["start"].as_str().unwrap(), &args[..4096]);
    assert_eq!(v["progress"], serde_json::json!({"done": 1}));
    assert!(v["cut"].get("progress").is_none(), "{}", v["cut"]);
    assert_eq!(v["id"], serde_json::json!(id));
    assert_eq!(v["task"], "big");
    bounded(peak);

    // --full: every value whole, exact, in bounded memory (chunks of 256 KiB).
    let (doc, peak) = measured(&["--json", "job", &sid, "--full"]);
    let v: Value = serde_json::from_str(&doc).unwrap();
    assert!(v.get("cut").is_none());
    assert!(
        v["args"] == serde_json::from_str::<Value>(&args).unwrap(),
        "--json --full did not write the arguments whole"
    );
    assert_eq!(v["output"]["o"].as_str().unwrap().len(), 2_000_000);
    assert!(
        doc.contains(&format!("\"args\": {args},")),
        "the arguments' text is not as stored"
    );
    bounded(peak);
    let (text, peak) = measured(&["job", &sid, "--full"]);
    assert!(
        text.contains(&format!("\nargs:            {args}\n")),
        "the text form did not print the arguments whole"
    );
    bounded(peak);

    // A value under 1 MiB is written whole by --json, exactly as stored.
    let doc = ok(&url, &["--json", "job", &small.to_string()]);
    let v: Value = serde_json::from_str(&doc).unwrap();
    assert!(v.get("cut").is_none());
    assert_eq!(v["args"]["s"].as_str().unwrap().len(), 500_000);
    assert!(doc.contains("18446744073709551616"));
}

#[test]
fn tags_and_errors_beyond_what_a_job_page_shows_are_counted() {
    let (db, url) = migrated();
    // 100,000 tags of 200 characters: only SQL of one's own can write more than 64.
    let id: i64 = db
        .client()
        .query_one(
            "SELECT postpone_defer_jobs(ARRAY['default'], ARRAY['t'], ARRAY['{}'::jsonb], ARRAY[0],
                    ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::timestamptz], ARRAY[NULL::int],
                    ARRAY[(SELECT jsonb_agg(repeat('t', 200) || g) FROM generate_series(1, 100000) g)],
                    ARRAY[NULL::jsonb], '{}', '{}', '{}')",
            &[],
        )
        .unwrap()
        .get(0);
    db.client()
        .execute(
            "UPDATE postpone_jobs SET errors = (SELECT jsonb_agg(jsonb_build_object('attempt', g,
                    'at', now(), 'error', 'boom ' || g || CASE WHEN g = 80
                    THEN E'\\n\\nbacktrace:\\n   7: app::resize\\n             at ./src/app.rs:3:5' ELSE '' END))
                    FROM generate_series(1, 80) g)
              WHERE id = $1",
            &[&id],
        )
        .unwrap();
    let sid = id.to_string();
    let text = ok(&url, &["job", &sid]);
    assert!(text.len() < 40_000, "{} bytes of text output", text.len());
    assert!(text.contains("(the first 64 of 100000)"), "{text}");
    assert!(
        text.contains("(the last 50 of 80 attempts with errors)"),
        "{text}"
    );
    assert!(text.contains("attempt 80 at") && !text.contains("attempt 30 at"));
    // A panic's backtrace: counted in the text, printed with --full.
    assert!(
        text.contains(&format!(
            ": boom 80\n    (a backtrace of 2 lines: `postpone job {id} --full` prints it)\n"
        )),
        "{text}"
    );
    let full = ok(&url, &["job", &sid, "--full"]);
    assert!(
        full.contains(": boom 80\n    backtrace:\n       7: app::resize\n                 at ./src/app.rs:3:5\n"),
        "{full}"
    );
    let doc = ok(&url, &["--json", "job", &sid]);
    assert!(doc.len() < 60_000, "{} bytes of --json output", doc.len());
    let v: Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(v["tags"].as_array().unwrap().len(), 64);
    assert_eq!(
        v["cut"]["tags"],
        serde_json::json!({"shown": 64, "total": 100000})
    );
    assert_eq!(
        v["cut"]["errors"],
        serde_json::json!({"shown": 50, "total": 80})
    );
}

#[test]
fn batch_shows_a_batchs_progress_and_job_names_its_batch() {
    let (db, url) = migrated();
    let u = url.as_str();
    let app = App::connect(u).unwrap();
    let batch = app
        .batch()
        .on_complete(postpone::NewJob::new("report", &()).unwrap())
        .defer(&[
            postpone::NewJob::new("a", &1).unwrap(),
            postpone::NewJob::new("a", &2).unwrap(),
        ])
        .unwrap();
    let first = batch.jobs[0];
    db.client()
        .batch_execute(&format!(
            "UPDATE postpone_jobs SET status = 'doing', started_at = now() WHERE id = {first};
             UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE id = {first};"
        ))
        .unwrap();
    let id = batch.id.to_string();
    let oc = batch.on_complete.unwrap();
    let text = ok(u, &["batch", &id]);
    assert!(
        text.starts_with(&format!("batch:         {id}\n")),
        "{text}"
    );
    assert!(text.contains("state:         running\n"), "{text}");
    assert!(
        text.contains("finished:      1 of 2 (1 pending)\n"),
        "{text}"
    );
    assert!(text.contains("succeeded:     1\n"), "{text}");
    assert!(
        text.contains(&format!(
            "on_complete:   job {oc} (waiting for the batch)\n"
        )),
        "{text}"
    );
    assert!(text.contains("on_success:    -\n"), "{text}");
    let v = json(u, &["batch", &id]);
    assert_eq!(v["total"], 2);
    assert_eq!(v["succeeded"], 1);
    assert_eq!(v["waiting"], 1);
    assert_eq!(v["on_complete"]["id"], oc.get());
    assert_eq!(v["on_complete"]["waiting"], true);
    assert_eq!(v["on_success"], Value::Null);
    let job = ok(u, &["job", &first.to_string()]);
    assert!(
        job.contains(&format!(
            "batch:           {id} (`postpone batch {id}` shows its progress)\n"
        )),
        "{job}"
    );
    // `jobs --batch` lists the batch's jobs and its callback, nothing else; the bulk
    // commands take the same selection.
    let other = ok(u, &["defer", "t", "{}"]);
    assert!(!other.is_empty());
    let v = json(u, &["jobs", "--batch", &id]);
    let mut listed: Vec<i64> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect();
    listed.sort_unstable();
    let mut expected: Vec<i64> = batch.jobs.iter().map(|j| j.get()).collect();
    expected.push(oc.get());
    expected.sort_unstable();
    assert_eq!(listed, expected, "{v}");
    // The waiting job and the waiting callback; the succeeded one and the job outside are
    // not selected.
    let text = ok(
        u,
        &["cancel", "--batch", &id, "--status", "todo", "--dry-run"],
    );
    assert!(text.starts_with("dry run: 2 job(s) match;"), "{text}");
    fails(Some(u), &["jobs", "--batch", "x"], "invalid batch id");
    fails_with(
        Some(u),
        &["batch", "99999"],
        3,
        "batch 99999 does not exist",
    );
    fails(Some(u), &["batch", "x"], "invalid batch id");
}

#[test]
fn defer_refuses_arguments_over_the_installations_limit() {
    let (db, url) = migrated();
    db.client()
        .batch_execute("UPDATE postpone_settings SET max_args_bytes = 1000")
        .unwrap();
    let at_limit = format!("\"{}\"", "x".repeat(998));
    let over = format!("\"{}\"", "x".repeat(999));
    ok(&url, &["defer", "t", &at_limit]);
    fails(
        Some(&url),
        &["defer", "t", &over],
        "1001 bytes of JSON, more than the 1000 allowed",
    );
    fails(
        Some(&url),
        &["defer", "t", &over],
        "UPDATE postpone_settings SET max_args_bytes",
    );
    let n: i64 = db
        .client()
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}
