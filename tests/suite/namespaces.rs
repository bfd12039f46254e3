//! Namespaces (`App::builder(url).schema(name)`): several installations of postpone in one
//! database, each in a PostgreSQL schema of its own, beside the default one in `public`.
//! Workers of one never run, wake, pause or rescue the jobs of another; the admin API, the
//! CLI, the dashboard, `postpone_defer` from SQL and `defer_in` on a caller's client follow
//! the schema; odd names work and bad ones are refused.

use crate::support;
use crate::web_util;
use crate::worker_util;

use std::collections::HashSet;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;
use postpone::{App, ErrorKind, Job, JobFilter, JobId, NewJob, TaskError, Tasks};
use serde_json::json;
use support::*;
use worker_util::*;

const A: &str = "tenant_a";
/// A name that needs quotes: upper case, a dash, a space and a quote.
const B: &str = "Tenant-B \"two\"";

fn app_in(db: &TestDb, schema: Option<&str>) -> App {
    let b = App::builder(db.url())
        .pool_size(2)
        .io_timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(2));
    let app = match schema {
        Some(s) => b.schema(s),
        None => b,
    }
    .build()
    .unwrap_or_else(|e| panic!("building an App for {schema:?}: {e}"));
    app.migrate()
        .unwrap_or_else(|e| panic!("migrating {schema:?}: {e}"));
    app
}

/// `SELECT count(*)` of `postpone_jobs` in `schema` (None: public), read from a plain
/// session with the default search_path.
fn jobs_in(c: &mut Client, schema: Option<&str>, filter: &str) -> i64 {
    let table = match schema {
        Some(s) => format!("{}.postpone_jobs", quote_ident(s)),
        None => "public.postpone_jobs".to_owned(),
    };
    c.query_one(&format!("SELECT count(*) FROM {table} {filter}"), &[])
        .unwrap()
        .get(0)
}

/// Tasks "ok" (and "other") that record the ids they ran.
fn recording_tasks() -> (Tasks, Arc<Mutex<Vec<i64>>>) {
    let ran: Arc<Mutex<Vec<i64>>> = Arc::default();
    let mut tasks = Tasks::new();
    for name in ["ok", "other"] {
        let r = ran.clone();
        tasks.register(name, move |job: &Job| -> Result<(), TaskError> {
            r.lock().unwrap().push(job.id().get());
            Ok(())
        });
    }
    (tasks, ran)
}

fn defer_n(app: &App, n: usize) -> Vec<i64> {
    (0..n)
        .map(|i| {
            let task = if i % 2 == 0 { "ok" } else { "other" };
            app.job(task).defer(&json!({ "i": i })).unwrap().get()
        })
        .collect()
}

#[test]
fn two_schemas_and_the_default_each_run_only_their_own_jobs() {
    init_logging();
    let db = TestDb::new();
    let apps: Vec<App> = [None, Some(A), Some(B)]
        .iter()
        .map(|s| app_in(&db, *s))
        .collect();
    // The same task names and queues everywhere; ids overlap between the schemas' tables.
    let counts = [5usize, 7, 11];
    let deferred: Vec<Vec<i64>> = apps
        .iter()
        .zip(counts)
        .map(|(app, n)| defer_n(app, n))
        .collect();
    let mut c = db.client();
    assert_eq!(jobs_in(&mut c, None, ""), 5);
    assert_eq!(jobs_in(&mut c, Some(A), ""), 7);
    assert_eq!(jobs_in(&mut c, Some(B), ""), 11);

    let workers: Vec<_> = apps
        .iter()
        .map(|app| {
            let (tasks, ran) = recording_tasks();
            (fast_worker(app, tasks).concurrency(3).spawn().unwrap(), ran)
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(20), || {
            [None, Some(A), Some(B)]
                .iter()
                .all(|s| jobs_in(&mut c, *s, "WHERE status <> 'succeeded'") == 0)
        }),
        "not every job succeeded"
    );
    for ((w, ran), want) in workers.into_iter().zip(&deferred) {
        let report = w.shutdown(Duration::from_secs(5));
        assert!(report.is_clean(), "{report}");
        let mut got = ran.lock().unwrap().clone();
        got.sort();
        assert_eq!(
            &got, want,
            "each worker ran exactly its own schema's jobs, once"
        );
    }
}

#[test]
fn migrate_creates_the_schema_pins_its_functions_and_touches_no_other_schema() {
    init_logging();
    let db = TestDb::new();
    let default = app_in(&db, None);
    let mut c = db.client();
    let snapshot = |c: &mut Client, schema: &str| -> Vec<(String, String)> {
        c.query(
            "SELECT p.oid::regprocedure::text, p.xmin::text FROM pg_proc p
              WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1)
              ORDER BY 1",
            &[&schema],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    };
    let public_before = snapshot(&mut c, "public");
    assert!(!public_before.is_empty());
    let a = app_in(&db, Some(A));
    assert_eq!(a.schema(), Some(A));
    assert_eq!(a.schema_version().unwrap(), Some(postpone::SCHEMA_VERSION));
    let b = app_in(&db, Some(B));
    let a_after = snapshot(&mut c, A);
    let b_after = snapshot(&mut c, B);
    // Migrating B (and A) changed nothing of public's functions, nor B anything of A's.
    assert_eq!(snapshot(&mut c, "public"), public_before);
    assert_eq!(b.migrate().unwrap(), Vec::<i32>::new());
    assert_eq!(a.migrate().unwrap(), Vec::<i32>::new(), "idempotent");
    assert_eq!(
        snapshot(&mut c, A),
        a_after,
        "a migrate of a current schema rewrites nothing"
    );
    assert_eq!(snapshot(&mut c, B), b_after);
    assert_eq!(snapshot(&mut c, "public"), public_before);
    assert_eq!(default.migrate().unwrap(), Vec::<i32>::new());

    // Every function of a named schema runs with its search_path, and says nothing of the
    // default's channels or lock keys; the default's are as they were.
    for s in [A, B] {
        let rows = c
            .query(
                "SELECT p.proname::text, p.prosrc, coalesce(array_to_string(p.proconfig, ';'), '')
                   FROM pg_proc p
                  WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1)",
                &[&s],
            )
            .unwrap();
        assert!(rows.len() > 20, "{s}: {} functions", rows.len());
        for r in rows {
            let (name, src, config): (String, String, String) = (r.get(0), r.get(1), r.get(2));
            assert!(
                config.contains("search_path=pg_catalog, ") && config.ends_with("pg_temp"),
                "{s}.{name}: {config}"
            );
            for bad in [
                "'postpone'",
                "'postpone_done'",
                "1886352244,",
                "(1886352245, 0)",
            ] {
                assert!(!src.contains(bad), "{s}.{name} still says {bad}");
            }
        }
    }
    let pinned: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace
                AND array_to_string(proconfig, ';') LIKE '%search_path%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(pinned, 0, "the default's functions are left as they are");
    let notify_default: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace
                AND prosrc LIKE '%pg_notify(''postpone'',%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(notify_default > 0);
}

#[test]
fn postpone_defer_from_sql_writes_into_its_schema_and_notifies_its_channel() {
    init_logging();
    let db = TestDb::new();
    let _default = app_in(&db, None);
    let a = app_in(&db, Some(A));
    let _b = app_in(&db, Some(B));
    let mut listener = db.client();
    listener
        .batch_execute(&format!(
            "LISTEN postpone; LISTEN {}; LISTEN {}",
            quote_ident(&format!("postpone:{A}")),
            quote_ident(&format!("postpone:{B}"))
        ))
        .unwrap();
    // A plain session: search_path is "$user", public, where the default install is.
    let mut c = db.client();
    let id: i64 = c
        .query_one(
            &format!(
                "SELECT {}.postpone_defer('ok', '{{\"from\": \"sql\"}}', queue => 'mail')",
                quote_ident(A)
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(jobs_in(&mut c, Some(A), "WHERE queue = 'mail'"), 1);
    assert_eq!(jobs_in(&mut c, None, ""), 0, "nothing went to public");
    assert_eq!(jobs_in(&mut c, Some(B), ""), 0);
    let mut got = Vec::new();
    let mut n = listener.notifications();
    let mut it = n.timeout_iter(Duration::from_secs(2));
    while let Ok(Some(note)) = it.next() {
        got.push((note.channel().to_owned(), note.payload().to_owned()));
    }
    assert_eq!(
        got,
        vec![(format!("postpone:{A}"), "job:mail".to_owned())],
        "only A's channel heard of it"
    );
    // The job is A's to run, through the admin API of A only.
    assert_eq!(
        a.admin().job(JobId(id)).unwrap().job.status,
        postpone::JobStatus::Todo
    );
}

#[test]
fn a_job_deferred_in_one_schema_does_not_wake_another_schemas_worker() {
    init_logging();
    let db = TestDb::new();
    let default = app_in(&db, None);
    let a = app_in(&db, Some(A));
    let b = app_in(&db, Some(B));
    let mut listener = db.client();
    listener
        .batch_execute(&format!(
            "LISTEN postpone; LISTEN postpone_done; LISTEN {}; LISTEN {}",
            quote_ident(&format!("postpone:{B}")),
            quote_ident(&format!("postpone_done:{B}"))
        ))
        .unwrap();
    // A's worker polls once a minute: only its own channel can start its jobs at once.
    let (tasks, ran) = recording_tasks();
    let wa = fast_worker(&a, tasks)
        .poll_interval(Duration::from_secs(60))
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut ids = Vec::new();
    ids.push(a.defer("ok", &1).unwrap());
    ids.push(a.job("ok").queue("q2").defer(&2).unwrap());
    ids.extend(
        a.defer_batch(&[
            NewJob::new("ok", &3).unwrap(),
            NewJob::new("ok", &4).unwrap(),
        ])
        .unwrap(),
    );
    let mut c = db.client();
    let mut tx = c.transaction().unwrap();
    ids.push(a.job("ok").defer_in(&mut tx, &5).unwrap());
    tx.commit().unwrap();
    for id in &ids {
        let r = a.wait(*id, Duration::from_secs(20)).unwrap();
        assert!(r.succeeded(), "{id}: {r:?}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "woken by A's channel, not by the minute's poll"
    );
    a.admin().pause("q2").unwrap();
    a.admin().resume_all().unwrap();
    let held = a
        .job("ok")
        .schedule_in(Duration::from_secs(3600))
        .defer(&6)
        .unwrap();
    a.admin().abort(held).unwrap();
    assert_eq!(ran.lock().unwrap().len(), 5);
    // Nothing reached the default's or B's channels.
    let mut got = Vec::new();
    {
        let mut n = listener.notifications();
        let mut it = n.timeout_iter(Duration::from_millis(500));
        while let Ok(Some(note)) = it.next() {
            got.push((note.channel().to_owned(), note.payload().to_owned()));
        }
    }
    assert!(got.is_empty(), "other channels heard A's work: {got:?}");
    let report = wa.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    // And the default and B still hear their own.
    default.defer("ok", &7).unwrap();
    b.defer("ok", &8).unwrap();
    let mut got = Vec::new();
    let mut n = listener.notifications();
    let mut it = n.timeout_iter(Duration::from_secs(2));
    while let Ok(Some(note)) = it.next() {
        got.push(note.channel().to_owned());
        if got.len() == 2 {
            break;
        }
    }
    got.sort();
    assert_eq!(got, vec!["postpone".to_owned(), format!("postpone:{B}")]);
}

#[test]
fn a_pause_in_one_schema_does_not_stop_claims_in_another() {
    init_logging();
    let db = TestDb::new();
    let default = app_in(&db, None);
    let a = app_in(&db, Some(A));
    let b = app_in(&db, Some(B));
    // A pause of A in progress: its transaction holds A's pause lock, which claims of A
    // wait for. Claims of B and of the default must not.
    let mut pauser = db.client();
    let mut tx = pauser.transaction().unwrap();
    tx.execute(
        &format!("SELECT * FROM {}.postpone_pause(NULL)", quote_ident(A)),
        &[],
    )
    .unwrap();
    let run = |app: &App| {
        let (tasks, ran) = recording_tasks();
        let w = fast_worker(app, tasks).spawn().unwrap();
        let ids = defer_n(app, 4);
        let ok = wait_until(Duration::from_secs(10), || ran.lock().unwrap().len() == 4);
        let report = w.shutdown(Duration::from_secs(5));
        assert!(report.is_clean(), "{report}");
        (ok, ids)
    };
    let (ok_b, _) = run(&b);
    assert!(ok_b, "B's worker was stopped by A's pause");
    let (ok_d, _) = run(&default);
    assert!(ok_d, "the default's worker was stopped by A's pause");
    tx.commit().unwrap();
    // The pause is A's alone, and it holds there.
    assert!(a.admin().paused().unwrap().all.is_some());
    assert!(b.admin().paused().unwrap().all.is_none());
    let (tasks, ran) = recording_tasks();
    let w = fast_worker(&a, tasks).spawn().unwrap();
    defer_n(&a, 2);
    std::thread::sleep(Duration::from_millis(800));
    assert!(ran.lock().unwrap().is_empty(), "A is paused");
    a.admin().resume_all().unwrap();
    assert!(wait_until(Duration::from_secs(10), || ran
        .lock()
        .unwrap()
        .len()
        == 2));
    let report = w.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
}

#[test]
fn a_stalled_worker_of_one_schema_is_never_rescued_by_another() {
    init_logging();
    let db = TestDb::new();
    let a = app_in(&db, Some(A));
    let b = app_in(&db, Some(B));
    let default = app_in(&db, None);
    let mut c = db.client();
    let qa = quote_ident(A);
    c.batch_execute(&format!(
        "INSERT INTO {qa}.postpone_workers (id, name, last_heartbeat, stalled_after_ms)
             VALUES (901, 'ghost', now() - interval '1 hour', 1000);
         INSERT INTO {qa}.postpone_jobs (queue, task, args, status, worker_id, attempts,
                                         started_at, scheduled_at)
             VALUES ('default', 'ok', '1', 'doing', 901, 1, now(), now());"
    ))
    .unwrap();
    // B's and the default's workers rescue twice a second (heartbeat 200 ms).
    let others: Vec<_> = [&b, &default]
        .iter()
        .map(|app| {
            let (tasks, _) = recording_tasks();
            fast_worker(app, tasks).spawn().unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let row = c
        .query_one(
            &format!("SELECT status, worker_id FROM {qa}.postpone_jobs"),
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "doing");
    assert_eq!(row.get::<_, Option<i64>>(1), Some(901));
    let ghosts: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM {qa}.postpone_workers WHERE id = 901"),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(ghosts, 1, "another schema's worker removed A's worker row");
    for w in others {
        let report = w.shutdown(Duration::from_secs(5));
        assert!(report.is_clean(), "{report}");
    }
    // A's own worker does rescue it.
    let (tasks, ran) = recording_tasks();
    let w = fast_worker(&a, tasks).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(10), || ran
        .lock()
        .unwrap()
        .len()
        == 1));
    let report = w.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
}

#[test]
fn the_admin_api_and_waiters_see_only_their_schema() {
    init_logging();
    let db = TestDb::new();
    let default = app_in(&db, None);
    let a = app_in(&db, Some(A));
    let b = app_in(&db, Some(B));
    defer_n(&default, 1);
    defer_n(&a, 2);
    let b_ids = defer_n(&b, 3);
    let total = |app: &App| -> u64 { app.admin().counts().unwrap().iter().map(|q| q.todo).sum() };
    assert_eq!((total(&default), total(&a), total(&b)), (1, 2, 3));
    let listed: HashSet<i64> = b
        .admin()
        .jobs(&JobFilter::new())
        .unwrap()
        .iter()
        .map(|j| j.id.get())
        .collect();
    assert_eq!(listed, b_ids.iter().copied().collect());
    // Cancelling B's first id through A touches A's job of that id, if any, never B's.
    let first = JobId(b_ids[0]);
    a.admin().cancel(first).unwrap();
    assert_eq!(
        b.admin().job(first).unwrap().job.status,
        postpone::JobStatus::Todo
    );
    assert_eq!(
        a.admin().job(first).unwrap().job.status,
        postpone::JobStatus::Cancelled
    );
    // A waiter of B is woken by B's done channel: with the backstop poll at a minute... the
    // default poll of one second bounds it anyway, so only check it ends.
    let (tasks, _) = recording_tasks();
    let w = fast_worker(&b, tasks).spawn().unwrap();
    for id in &b_ids {
        assert!(b
            .wait(JobId(*id), Duration::from_secs(10))
            .unwrap()
            .succeeded());
    }
    let report = w.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    assert_eq!(total(&a), 1, "A's remaining job is still waiting");
}

#[test]
fn defer_in_a_callers_session_names_the_schema() {
    init_logging();
    let db = TestDb::new();
    let _default = app_in(&db, None);
    let a = app_in(&db, Some(A));
    let mut c = db.client();
    let mut tx = c.transaction().unwrap();
    a.job("ok").defer_in(&mut tx, &1).unwrap();
    a.job("ok")
        .unique(postpone::Unique::by_args())
        .defer_in(&mut tx, &2)
        .unwrap();
    let dup = a
        .job("ok")
        .unique(postpone::Unique::by_args())
        .defer_unique_in(&mut tx, &2)
        .unwrap();
    assert!(dup.is_duplicate());
    let first = a.defer("ok", &3).unwrap();
    a.job("ok").after(&[first]).defer_in(&mut tx, &4).unwrap();
    a.defer_batch_in(&mut tx, &[NewJob::new("ok", &5).unwrap()])
        .unwrap();
    let batch = a
        .batch()
        .on_complete(NewJob::new("ok", &6).unwrap())
        .defer_in(&mut tx, &[NewJob::new("ok", &7).unwrap()])
        .unwrap();
    a.add_to_batch_in(&mut tx, batch.id, &[NewJob::new("ok", &8).unwrap()])
        .unwrap();
    let mut wf = a.workflow("in a schema");
    let root = wf.step(NewJob::new("ok", &9).unwrap()).add();
    wf.step(NewJob::new("ok", &10).unwrap())
        .after([&root])
        .add();
    let run = wf.insert_in(&mut tx).unwrap();
    tx.commit().unwrap();
    assert_eq!(jobs_in(&mut c, Some(A), ""), 10);
    let batches = |c: &mut Client, table: &str| -> i64 {
        c.query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(batches(&mut c, "tenant_a.postpone_batches"), 1);
    assert_eq!(batches(&mut c, "public.postpone_batches"), 0);
    assert_eq!(a.admin().batch(batch.id).unwrap().total, 2);
    assert_eq!(batches(&mut c, "tenant_a.postpone_workflow_jobs"), 2);
    assert_eq!(batches(&mut c, "public.postpone_workflows"), 0);
    assert_eq!(
        a.admin().workflow(run.id).unwrap().jobs[1].after,
        vec![run.jobs[0]]
    );
    assert_eq!(jobs_in(&mut c, None, ""), 0);
}

#[test]
fn odd_names_work_and_bad_names_are_config_errors() {
    init_logging();
    let db = TestDb::new();
    let long = format!("{}é", "n".repeat(61));
    assert_eq!(long.len(), 63);
    for name in [
        "MiXeD",
        "with space",
        "it's",
        "a.b",
        "postpone",
        "public2",
        long.as_str(),
    ] {
        let app = app_in(&db, Some(name));
        let id = app.defer("ok", &json!({"in": name})).unwrap();
        let mut c = db.client();
        assert_eq!(jobs_in(&mut c, Some(name), ""), 1, "{name}");
        let (tasks, ran) = recording_tasks();
        let w = fast_worker(&app, tasks).spawn().unwrap();
        assert!(
            app.wait(id, Duration::from_secs(10)).unwrap().succeeded(),
            "{name}"
        );
        assert_eq!(*ran.lock().unwrap(), vec![id.get()], "{name}");
        let report = w.shutdown(Duration::from_secs(5));
        assert!(report.is_clean(), "{report}");
    }
    let too_long = "n".repeat(64);
    for bad in ["", too_long.as_str(), "a\0b", "pg_jobs"] {
        let e = App::builder(db.url())
            .schema(bad)
            .lazy(true)
            .build()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{bad:?}: {e}");
        assert!(e.to_string().contains("invalid schema name"), "{e}");
    }
}

#[test]
fn a_schema_not_installed_says_which_and_what_to_run() {
    init_logging();
    let db = TestDb::new();
    let _default = app_in(&db, None);
    let app = App::builder(db.url()).schema("Not There").build().unwrap();
    assert_eq!(app.schema_version().unwrap(), None);
    let e = app.defer("ok", &1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SchemaMissing, "{e}");
    let text = e.to_string();
    assert!(text.contains("schema \"Not There\""), "{text}");
    assert!(
        text.contains("postpone migrate --schema 'Not There'"),
        "{text}"
    );
    let e = app.admin().check_schema().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SchemaMissing, "{e}");
    assert!(e.to_string().contains("--schema"), "{e}");
    // Nothing was created by looking.
    let n: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'Not There'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[test]
fn a_schema_through_a_transaction_pooler_is_refused_with_what_to_do() {
    init_logging();
    let db = TestDb::new();
    let url = format!("{}?pooler_mode=transaction", db.url());
    let url = if db.url().contains('?') {
        format!("{}&pooler_mode=transaction", db.url())
    } else {
        url
    };
    let e = App::builder(url.as_str())
        .schema(A)
        .lazy(true)
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let text = e.to_string();
    assert!(text.contains("pooler_mode=transaction"), "{text}");
    assert!(text.contains("session"), "{text}");
    // Without a schema the same URL is accepted.
    App::builder(url.as_str()).lazy(true).build().unwrap();
}

#[test]
fn a_schema_works_through_a_session_pooler() {
    init_logging();
    if let Some(why) = PgBouncer::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let db = TestDb::new();
    let bouncer = PgBouncer::start(&db.server_addr(), PoolMode::Session, 12);
    let _default = app_in(&db, None);
    let app = App::builder(bouncer.url(db.name()))
        .schema(A)
        .pool_size(2)
        .build()
        .unwrap();
    app.migrate().unwrap();
    let (tasks, ran) = recording_tasks();
    let w = fast_worker(&app, tasks).spawn().unwrap();
    let ids = defer_n(&app, 6);
    assert!(wait_until(Duration::from_secs(10), || ran
        .lock()
        .unwrap()
        .len()
        == 6));
    let report = w.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    let mut got = ran.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, ids);
    let mut c = db.client();
    assert_eq!(jobs_in(&mut c, Some(A), "WHERE status = 'succeeded'"), 6);
    assert_eq!(jobs_in(&mut c, None, ""), 0);
}

fn cli(db: &TestDb, env_schema: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_postpone"));
    cmd.env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .env_remove("POSTPONE_SCHEMA")
        .arg("--database-url")
        .arg(db.url())
        .arg("--timeout")
        .arg("5s");
    if let Some(s) = env_schema {
        cmd.env("POSTPONE_SCHEMA", s);
    }
    let o = cmd.args(args).output().expect("run postpone");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn the_cli_follows_schema_and_postpone_schema() {
    init_logging();
    let db = TestDb::new();
    let _default = app_in(&db, None);
    // Not installed yet: exit 7 and what to run.
    let (code, _, err) = cli(&db, None, &["--schema", B, "stats"]);
    assert_eq!(code, 7, "{err}");
    assert!(err.contains("postpone migrate --schema"), "{err}");
    let (code, out, err) = cli(&db, None, &["--schema", B, "migrate"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = cli(&db, Some(A), &["migrate"]);
    assert_eq!(code, 0, "{out}{err}");
    for (schema, n) in [(B, 3), (A, 2)] {
        for i in 0..n {
            let (code, out, err) = cli(
                &db,
                None,
                &["--schema", schema, "defer", "ok", &i.to_string()],
            );
            assert_eq!(code, 0, "{out}{err}");
        }
    }
    let mut c = db.client();
    assert_eq!(jobs_in(&mut c, Some(B), ""), 3);
    assert_eq!(jobs_in(&mut c, Some(A), ""), 2);
    assert_eq!(jobs_in(&mut c, None, ""), 0);
    let count = |env: Option<&str>, args: &[&str]| -> usize {
        let mut a = args.to_vec();
        a.extend(["jobs", "--json"]);
        let (code, out, err) = cli(&db, env, &a);
        assert_eq!(code, 0, "{out}{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["jobs"]
            .as_array()
            .map_or_else(|| v.as_array().map_or(usize::MAX, |a| a.len()), |a| a.len())
    };
    assert_eq!(count(None, &["--schema", B]), 3);
    assert_eq!(count(Some(A), &[]), 2);
    assert_eq!(
        count(Some(A), &["--schema", B]),
        3,
        "the flag wins over the variable"
    );
    assert_eq!(count(None, &[]), 0);
    // Pause from the CLI reaches A only.
    let (code, out, err) = cli(&db, Some(A), &["pause", "--all"]);
    assert_eq!(code, 0, "{out}{err}");
    let mut paused = |schema: &str| -> i64 {
        c.query_one(
            &format!(
                "SELECT count(*) FROM {}.postpone_paused_queues",
                quote_ident(schema)
            ),
            &[],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!((paused(A), paused(B)), (1, 0));
    // Bad names: exit 2 with the reason.
    let (code, _, err) = cli(&db, None, &["--schema", "", "stats"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid schema name"), "{err}");
}

#[test]
fn the_dashboard_of_a_schema_shows_only_its_jobs() {
    init_logging();
    let db = TestDb::new();
    let default = app_in(&db, None);
    let a = app_in(&db, Some(A));
    let b = app_in(&db, Some(B));
    default.job("task-of-default").defer(&1).unwrap();
    a.job("task-of-a").queue("queue-of-a").defer(&1).unwrap();
    b.job("task-of-b").queue("queue-of-b").defer(&1).unwrap();
    for (app, mine, theirs) in [
        (&a, "task-of-a", ["task-of-b", "task-of-default"]),
        (&b, "task-of-b", ["task-of-a", "task-of-default"]),
    ] {
        let dash = postpone::Dashboard::new(app)
            .listen("127.0.0.1:0")
            .unwrap()
            .spawn()
            .expect("dashboard");
        for path in ["/", "/jobs"] {
            let page = web_util::get(dash.addr(), path);
            assert_eq!(page.status, 200, "{}", page.body);
            if path == "/jobs" {
                assert!(page.body.contains(mine), "{path}: {}", page.body);
            }
            for t in theirs {
                assert!(!page.body.contains(t), "{path} shows {t}");
            }
        }
        dash.shutdown();
    }
}

#[test]
fn the_grants_of_a_schema_let_a_worker_role_run_its_jobs_there_and_nowhere_else() {
    init_logging();
    let db = TestDb::new();
    let _default = app_in(&db, None);
    let owner = app_in(&db, Some(B));
    let role = TestRole::new(&db, "ns");
    let sql = owner
        .admin()
        .grants(role.name(), postpone::GrantsFor::Worker)
        .unwrap();
    assert!(
        sql.contains(&format!("GRANT USAGE ON SCHEMA {}", quote_ident(B))),
        "{sql}"
    );
    owner.connection().unwrap().batch_execute(&sql).unwrap();
    let as_role = App::builder(role.url(&db))
        .schema(B)
        .pool_size(2)
        .build()
        .unwrap();
    // A worker's migrate of a current schema finds nothing to do (and changes nothing).
    assert_eq!(as_role.migrate().unwrap(), Vec::<i32>::new());
    let (tasks, ran) = recording_tasks();
    let w = fast_worker(&as_role, tasks).spawn().unwrap();
    let ids = defer_n(&as_role, 3);
    assert!(wait_until(Duration::from_secs(10), || ran
        .lock()
        .unwrap()
        .len()
        == 3));
    let report = w.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    let mut got = ran.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, ids);
    // The role was given nothing of the default's.
    let mut c = role.client(&db);
    let e = c
        .query_one("SELECT count(*) FROM public.postpone_jobs", &[])
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42501"), "{e}");
}

#[test]
fn a_pooled_connection_whose_search_path_was_changed_is_not_used_again() {
    init_logging();
    let db = TestDb::new();
    let _default = app_in(&db, None);
    let a = App::builder(db.url())
        .schema(A)
        .pool_size(1)
        .build()
        .unwrap();
    a.migrate().unwrap();
    let mut c = db.client();
    for sql in [
        "SET search_path TO public",
        "RESET ALL",
        "DISCARD ALL",
        "SELECT set_config('search_path', 'public', false)",
    ] {
        {
            let mut conn = a.connection().unwrap();
            conn.batch_execute(sql).unwrap();
        }
        a.defer("ok", &sql).unwrap();
        assert_eq!(
            jobs_in(&mut c, None, ""),
            0,
            "after {sql}: a job went to public"
        );
    }
    assert_eq!(jobs_in(&mut c, Some(A), ""), 4);
}

#[test]
fn the_printed_migration_of_a_schema_installs_and_pins_it() {
    init_logging();
    let db = TestDb::new();
    let _default = app_in(&db, None);
    let app = App::builder(db.url()).schema(B).build().unwrap();
    let sql = app.admin().migration_sql().unwrap();
    assert_eq!(sql, postpone::Admin::migration_script_all_in(B).unwrap());
    let mut c = db.client();
    c.batch_execute(&sql).unwrap();
    assert_eq!(
        app.schema_version().unwrap(),
        Some(postpone::SCHEMA_VERSION)
    );
    assert_eq!(app.migrate().unwrap(), Vec::<i32>::new());
    let unpinned: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_proc
              WHERE pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1)
                AND coalesce(array_to_string(proconfig, ';'), '') NOT LIKE '%search_path=%'",
            &[&B],
        )
        .unwrap()
        .get(0);
    assert_eq!(unpinned, 0);
    // Deferring from SQL through it lands in B.
    c.batch_execute(&format!("SELECT {}.postpone_defer('ok')", quote_ident(B)))
        .unwrap();
    assert_eq!(jobs_in(&mut c, Some(B), ""), 1);
    assert_eq!(jobs_in(&mut c, None, ""), 0);
    let e = postpone::Admin::migration_script_all_in("").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
}

#[test]
fn a_default_installation_is_not_taken_over_by_naming_its_schema() {
    init_logging();
    let db = TestDb::new();
    let default = app_in(&db, None);
    let id = default.defer("ok", &1).unwrap();
    let public = App::builder(db.url()).schema("public").build().unwrap();
    let e = public.migrate().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
    assert!(e.to_string().contains("without .schema"), "{e}");
    // Nothing changed: the default's functions still notify its channel, and it runs on.
    let mut c = db.client();
    let pinned: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace
                AND array_to_string(proconfig, ';') LIKE '%search_path%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(pinned, 0);
    let (tasks, ran) = recording_tasks();
    let w = fast_worker(&default, tasks)
        .poll_interval(Duration::from_secs(60))
        .spawn()
        .unwrap();
    let id2 = default.defer("ok", &2).unwrap();
    assert!(default
        .wait(id2, Duration::from_secs(10))
        .unwrap()
        .succeeded());
    let report = w.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    let mut got = ran.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, vec![id.get(), id2.get()]);
}
