//! High availability against a real primary and a real streaming standby, built by the test
//! on spare ports of this machine (tests/support/cluster.rs; skipped, with the reason printed,
//! where initdb or pg_basebackup cannot run).
//!
//! - `target_session_attrs` picks the right host of a two-host string for each of libpq's six
//!   values, and `load_balance_hosts=random` spreads connections over both.
//! - A failover under a running worker with jobs flowing: stop the primary (fast), promote
//!   the standby; the App and the worker go on on the new primary within a measured time, every
//!   job deferred before and after runs, nothing is left `doing`, shutdown is bounded and
//!   clean. The URL lists the standby first with `target_session_attrs=read-write`, and no
//!   statement ever reaches it while it is a standby (no database error before the stop).
//! - What a failover keeps of what `defer` acknowledged: with synchronous replication
//!   everything (a defer the standby cannot confirm is not acknowledged: it fails at its
//!   deadline); with asynchronous replication, what the standby had received (the last
//!   acknowledged defer can be lost with the primary).

mod support;
mod worker_util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use postpone::{App, ErrorKind, Job, Tasks};
use support::{cluster, skip, wait_until, Cluster, FaultProxy, NewConns};
use worker_util::*;

fn app(url: &str) -> App {
    App::builder(url)
        .pool_size(2)
        .io_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_else(|e| panic!("building an App on {url}: {e}"))
}

/// The port of the server the App's connections reach.
fn server_port(app: &App) -> postpone::Result<u16> {
    let mut conn = app.connection()?;
    let row = conn.query_one("SELECT inet_server_port()", &[])?;
    Ok(row.get::<_, i32>(0) as u16)
}

fn two_hosts(first: &Cluster, second: &Cluster, params: &str) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?connect_timeout=2&{params}",
        first.port(),
        second.port()
    )
}

#[test]
fn target_session_attrs_and_a_failover_under_a_running_worker() {
    if let Some(reason) = cluster::skip_reason() {
        skip(&reason);
        return;
    }
    support::init_logging();
    let mut primary = Cluster::primary("ha-primary");
    let standby = Cluster::standby_of(&primary, "ha-standby");
    assert!(standby.in_recovery() && !primary.in_recovery());
    let (p, s) = (primary.port(), standby.port());
    app(&primary.url("postgres")).migrate().unwrap();
    assert!(standby.wait_caught_up(&primary, Duration::from_secs(10)));

    // --- target_session_attrs: each value, both host orders.
    // [primary listed first, standby listed first]; for `any` the first host listed wins.
    for (attrs, want) in [
        ("any", [p, s]),
        ("read-write", [p, p]),
        ("primary", [p, p]),
        ("read-only", [s, s]),
        ("standby", [s, s]),
        ("prefer-standby", [s, s]),
    ] {
        let params = format!("target_session_attrs={attrs}");
        let got = [
            server_port(&app(&two_hosts(&primary, &standby, &params))).unwrap(),
            server_port(&app(&two_hosts(&standby, &primary, &params))).unwrap(),
        ];
        assert_eq!(got, want, "target_session_attrs={attrs}");
    }
    // No host matches: a Connect error naming what the server is.
    let only_standby = format!(
        "postgres://postgres@127.0.0.1:{s}/postgres?target_session_attrs=read-write&connect_timeout=2"
    );
    let started = Instant::now();
    let e = App::builder(&only_standby)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
    assert!(
        e.to_string().contains("standby, read-only")
            && e.to_string().contains("target_session_attrs=read-write"),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // prefer-standby falls back to a primary when no standby is listed.
    let only_primary =
        format!("postgres://postgres@127.0.0.1:{p}/postgres?target_session_attrs=prefer-standby");
    assert_eq!(server_port(&app(&only_primary)).unwrap(), p);
    // Admin and dashboard reads from a standby: prefer-standby, primary listed first.
    let reader = app(&two_hosts(
        &primary,
        &standby,
        "target_session_attrs=prefer-standby",
    ));
    assert_eq!(server_port(&reader).unwrap(), s);
    reader.admin().counts().unwrap();
    reader.admin().jobs(&postpone::JobFilter::new()).unwrap();
    drop(reader);
    // load_balance_hosts=random: a dozen fresh Apps reach both hosts.
    let random = two_hosts(&primary, &standby, "load_balance_hosts=random");
    let ports: std::collections::HashSet<u16> = (0..12)
        .map(|_| server_port(&app(&random)).unwrap())
        .collect();
    assert_eq!(
        ports.len(),
        2,
        "12 random-order connections all went to {ports:?}"
    );

    // --- A server that turns read-only under open sessions (25006, as an old primary
    // demoted in place answers): the pooled connection is discarded, never reused, and the
    // worker's threads open new connections.
    let one = App::builder(primary.url("postgres"))
        .pool_size(1)
        .build()
        .unwrap();
    let (seen_tx, seen_rx) = unbounded::<i64>();
    let mut tasks = Tasks::new();
    tasks.register("count", move |job: &Job| {
        seen_tx.send(job.id().get()).unwrap();
        Ok(())
    });
    let worker = fast_worker(&one, tasks).spawn().unwrap();
    let first = one.defer("count", &()).unwrap();
    assert_eq!(
        seen_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        first.get()
    );
    // The fetcher has connected once (the beat keeps spawn's connection, listens on it,
    // and the completer records on it).
    assert!(wait_until(Duration::from_secs(5), || worker
        .stats()
        .connections_opened
        >= 1));
    let opened = worker.stats().connections_opened;
    let backend = |app: &App| -> i32 {
        let mut c = app.connection().unwrap();
        c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
    };
    let before = backend(&one);
    let set = |sql: &str| {
        let mut admin = primary.client("postgres");
        admin.batch_execute(sql).unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    };
    set("ALTER SYSTEM SET default_transaction_read_only = on");
    let mut refused = None;
    assert!(wait_until(Duration::from_secs(5), || {
        match one.defer("count", &()) {
            Err(e) => {
                refused = Some(e);
                true
            }
            Ok(_) => false,
        }
    }));
    let refused = refused.unwrap();
    assert_eq!(refused.sqlstate(), Some("25006"), "{refused}");
    // The fetcher's claims and the heartbeat fail the same way meanwhile.
    assert!(wait_until(Duration::from_secs(5), || worker
        .stats()
        .db_errors
        >= 2));
    set("ALTER SYSTEM RESET default_transaction_read_only");
    assert!(wait_until(Duration::from_secs(5), || one
        .defer("count", &())
        .is_ok()));
    let after = one.defer("count", &()).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || seen_rx
            .try_iter()
            .any(|id| id == after.get())),
        "the worker runs jobs again once the server is writable"
    );
    let stats = worker.stats();
    assert!(
        stats.connections_opened > opened,
        "the worker kept its connections that answered 25006: {stats:?}"
    );
    assert_ne!(
        backend(&one),
        before,
        "the connection that answered 25006 was given out again"
    );
    let report = worker.shutdown(Duration::from_secs(3));
    assert!(report.is_clean(), "{report}");
    primary
        .client("postgres")
        .batch_execute("DELETE FROM postpone_jobs")
        .unwrap();
    drop(one);

    // --- failover under a running worker. The standby is listed first: every connect
    // tries it, finds it read-only and goes on to the primary.
    let url = two_hosts(&standby, &primary, "target_session_attrs=read-write");
    let app = app(&url);
    app.migrate().unwrap();
    let (ran_tx, ran_rx) = unbounded::<(i64, Instant)>();
    let mut tasks = Tasks::new();
    tasks.register("count", move |job: &Job| {
        ran_tx.send((job.id().0, Instant::now())).unwrap();
        Ok(())
    });
    let worker = fast_worker(&app, tasks)
        .concurrency(2)
        .stalled_after(Duration::from_secs(5))
        .spawn()
        .unwrap();

    // A deferrer that keeps jobs flowing through the failover; it keeps what was committed.
    let deferred: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let errors: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let deferrer = {
        let (app, deferred, errors, stop) =
            (app.clone(), deferred.clone(), errors.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match app.defer("count", &serde_json::json!({})) {
                    Ok(id) => deferred.lock().unwrap().push((id.get(), Instant::now())),
                    Err(e) => errors.lock().unwrap().push((Instant::now(), e.to_string())),
                }
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let mut ran: HashMap<i64, (usize, Instant)> = HashMap::new();
    let collect = |ran: &mut HashMap<i64, (usize, Instant)>, wait: Duration| {
        if let Ok((id, at)) = ran_rx.recv_timeout(wait) {
            let e = ran.entry(id).or_insert((0, at));
            e.0 += 1;
        }
    };
    let flowing = Instant::now();
    while ran.len() < 30 && flowing.elapsed() < Duration::from_secs(20) {
        collect(&mut ran, Duration::from_millis(100));
    }
    assert!(
        ran.len() >= 30,
        "only {} jobs ran before the failover",
        ran.len()
    );
    let stats = worker.stats();
    assert_eq!(
        stats.db_errors, 0,
        "no statement may fail (none may reach the standby) before the failover: {stats:?}"
    );
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );

    // Stop the primary (fast: sessions are told 57P01), then promote the standby.
    let stopped = Instant::now();
    primary.stop("fast");
    standby.promote();
    let promoted = Instant::now();
    assert!(!standby.in_recovery());

    // The App defers again and the worker runs what was deferred after the promotion.
    let mut worker_back = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while worker_back.is_none() && Instant::now() < deadline {
        collect(&mut ran, Duration::from_millis(50));
        let after: Vec<i64> = deferred
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, at)| *at > promoted)
            .map(|(id, _)| *id)
            .collect();
        worker_back = after.iter().filter_map(|id| ran.get(id)).map(|r| r.1).min();
    }
    let worker_back = worker_back.expect("the worker ran a job deferred after the promotion");
    // The outage each side saw: the longest gap between consecutive committed defers, and
    // between consecutive job starts, around the switch (it includes pg_ctl's own time).
    let longest_gap = |mut at: Vec<Instant>| -> Duration {
        at.retain(|t| {
            *t + Duration::from_secs(2) > stopped && *t < promoted + Duration::from_secs(5)
        });
        at.sort();
        at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    };
    let app_gap = longest_gap(deferred.lock().unwrap().iter().map(|(_, at)| *at).collect());
    let worker_gap = longest_gap(ran.values().map(|r| r.1).collect());
    report_figure(
        "failover: pg_ctl stop -m fast + pg_ctl promote",
        promoted - stopped,
    );
    report_figure(
        "failover: outage seen by the App (longest gap between commits)",
        app_gap,
    );
    report_figure(
        "failover: outage seen by the worker (longest gap between job starts)",
        worker_gap,
    );
    report_figure(
        "failover: promote to the worker running a job deferred after it",
        worker_back.saturating_duration_since(promoted),
    );
    assert!(
        worker_back.saturating_duration_since(promoted) < Duration::from_secs(15),
        "recovery took {:?}",
        worker_back.saturating_duration_since(promoted)
    );

    // Keep flowing a little on the new primary, then stop deferring and drain.
    let more = Instant::now();
    while more.elapsed() < Duration::from_millis(500) {
        collect(&mut ran, Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    deferrer.join().unwrap();
    let committed: Vec<i64> = deferred.lock().unwrap().iter().map(|(id, _)| *id).collect();
    let drained = wait_until(Duration::from_secs(20), || {
        while let Ok((id, at)) = ran_rx.try_recv() {
            ran.entry(id).or_insert((0, at)).0 += 1;
        }
        committed.iter().all(|id| ran.contains_key(id))
    });
    let missing: Vec<&i64> = committed
        .iter()
        .filter(|id| !ran.contains_key(id))
        .collect();
    assert!(drained, "committed jobs never ran: {missing:?}");

    // The new primary's table: every committed job succeeded, nothing left todo or doing.
    let mut client = standby.client("postgres");
    let done = wait_until(Duration::from_secs(10), || {
        let rows = all_jobs(&mut client);
        rows.iter().all(|r| r.status == "succeeded")
    });
    let rows = all_jobs(&mut client);
    let open: Vec<&JobRow> = rows.iter().filter(|r| r.status != "succeeded").collect();
    assert!(done, "jobs not finished on the new primary: {open:?}");
    let by_id: HashMap<i64, &JobRow> = rows.iter().map(|r| (r.id, r)).collect();
    for id in &committed {
        assert!(
            by_id.contains_key(id),
            "committed job {id} lost in the failover"
        );
    }
    let twice: Vec<(&i64, &(usize, Instant))> = ran.iter().filter(|(_, r)| r.0 > 1).collect();
    let failed_defers = errors.lock().unwrap().len();
    println!(
        "failover: {} jobs committed, {} ran, {} ran twice (at-least-once: in flight at the stop) \
         {twice:?}, {failed_defers} defers failed during the switch, worker stats {:?}",
        committed.len(),
        ran.len(),
        twice.len(),
        worker.stats()
    );

    let report = worker.shutdown(Duration::from_secs(5));
    assert!(report.is_clean(), "{report}");
    assert!(report.elapsed() < Duration::from_millis(5100), "{report}");
}

/// A primary whose standby streams through a fault proxy (so that the test can hold back the
/// WAL it has not sent yet), `synchronous_commit = on`, and with `sync` the standby as its
/// synchronous standby. Returns (primary, standby, proxy).
fn replicated_pair(tag: &str, sync: bool) -> (Cluster, Cluster, FaultProxy) {
    let primary = Cluster::primary(&format!("{tag}-primary"));
    let alter = |c: &Cluster, what: &str| {
        let mut admin = c.client("postgres");
        admin
            .batch_execute(&format!("ALTER SYSTEM {what}"))
            .unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    };
    alter(&primary, "SET synchronous_commit = on");
    let standby = Cluster::standby_of(&primary, &format!("{tag}-standby"));
    let proxy = FaultProxy::start(&primary.addr());
    alter(
        &standby,
        &format!(
            "SET primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name=standby'",
            proxy.port()
        ),
    );
    if sync {
        alter(&primary, "SET synchronous_standby_names = '*'");
    }
    let mut admin = primary.client("postgres");
    let streaming = wait_until(Duration::from_secs(20), || {
        proxy.live_connections() > 0
            && admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby' \
                       AND state = 'streaming' AND (NOT $1 OR sync_state = 'sync')",
                    &[&sync],
                )
                .is_ok_and(|r| r.get::<_, i64>(0) == 1)
    });
    assert!(streaming, "the standby does not stream through the proxy");
    (primary, standby, proxy)
}

/// Defers job A with the standby streaming, then job B with the WAL held back in the proxy;
/// stops the primary (immediate) and promotes the standby. Returns A's id, what the second
/// defer answered, and the ids the promoted standby has.
fn defer_then_fail_over(sync: bool) -> (i64, postpone::Result<postpone::JobId>, Vec<i64>) {
    let tag = if sync { "ha-sync" } else { "ha-async" };
    let (mut primary, standby, proxy) = replicated_pair(tag, sync);
    let app = App::builder(primary.url("postgres"))
        .pool_size(1)
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    app.migrate().unwrap();
    let a = app.defer("count", &()).unwrap().get();
    if !sync {
        // Acknowledged does not mean replicated: wait until it is.
        assert!(standby.wait_caught_up(&primary, Duration::from_secs(10)));
    }
    proxy.set_new_conns(NewConns::Strand);
    proxy.strand_all();
    let b = app.defer("count", &());
    primary.stop("immediate");
    standby.promote();
    let ids = standby
        .client("postgres")
        .query("SELECT id FROM postpone_jobs ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    (a, b, ids)
}

#[test]
fn what_a_failover_keeps_of_acknowledged_defers_with_sync_and_async_replication() {
    if let Some(reason) = cluster::skip_reason() {
        skip(&reason);
        return;
    }
    support::init_logging();

    // Synchronous: the defer the standby could not confirm fails at its deadline, not
    // acknowledged; everything acknowledged is on the new primary.
    let started = Instant::now();
    let (a, b, ids) = defer_then_fail_over(true);
    let e = b.expect_err("a commit the synchronous standby never confirmed was acknowledged");
    assert!(e.is_timeout(), "{e}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(ids, vec![a], "synchronous: the new primary's jobs");

    // Asynchronous: acknowledged at once, and gone with the primary.
    let (a, b, ids) = defer_then_fail_over(false);
    let b = b.expect("an asynchronous commit is acknowledged without the standby");
    assert_eq!(
        ids,
        vec![a],
        "asynchronous: job {} was acknowledged before the failover and is lost (as promised \
         for asynchronous replication); job {a} had reached the standby",
        b.get()
    );
    println!(
        "failover: sync: the unconfirmed defer failed with {e:?}; async: acknowledged job {} \
         lost with the primary",
        b.get()
    );
}
