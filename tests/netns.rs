//! Worker processes on "different hosts": each in a network namespace of its own on this
//! machine (`ip netns`, a veth pair, link-local addresses only), reaching a cluster of ours
//! that listens on the host side of both links. One namespace's link is cut while it runs
//! jobs (every connection of that worker goes half-open) and later restored:
//!
//! - the other worker rescues the cut worker's jobs once its heartbeat is stale and runs
//!   everything;
//! - the cut worker rejoins after the link returns and runs new jobs;
//! - no job runs twice by two live workers: a job that ran twice was running on the cut
//!   worker when it was cut, and was run again only after that worker's heartbeat went stale;
//! - both processes stop cleanly within their shutdown timeout.
//!
//! Skipped, with the reason printed, where namespaces or clusters cannot be made.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use postpone::{App, Job, NewJob, Tasks, Worker};
use support::{cluster, skip, wait_until, ChildProc, Cluster, Netns};

const CHILD_URL: &str = "POSTPONE_NETNS_CHILD_URL";
const STALLED_AFTER: Duration = Duration::from_secs(2);

/// The worker process: runs task `work` (200 ms each), printing `RUN <id>` when a job
/// starts, until its stdin closes; then shuts down and prints its report.
#[test]
#[ignore = "child process of worker_processes_in_namespaces_one_cut_off_and_back"]
fn child_netns_worker() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    let app = App::builder(&url)
        .pool_size(1)
        .io_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut tasks = Tasks::new();
    tasks.register("work", |job: &Job| {
        println!("RUN {}", job.id());
        std::thread::sleep(Duration::from_millis(200));
        Ok(())
    });
    let handle = Worker::builder(&app, tasks)
        .concurrency(2)
        .prefetch(0)
        .poll_interval(Duration::from_millis(100))
        .heartbeat_interval(Duration::from_millis(300))
        .stalled_after(STALLED_AFTER)
        .listen_ping_interval(Duration::from_millis(500))
        .reconnect_backoff_max(Duration::from_millis(500))
        .spawn()
        .unwrap();
    println!("CHILD_READY");
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
    let report = handle.shutdown(Duration::from_secs(3));
    println!(
        "CHILD_REPORT clean={} elapsed_ms={} {report}",
        report.is_clean(),
        report.elapsed().as_millis()
    );
}

fn start_in(ns: &Netns, url: &str) -> ChildProc {
    let mut cmd = ns.command(&std::env::current_exe().unwrap());
    cmd.args([
        "child_netns_worker",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_URL, url);
    ChildProc::spawn(cmd)
}

/// Each job's runs: (worker, when the RUN line was read).
type Runs = HashMap<i64, Vec<(char, Instant)>>;

fn collect(runs: &mut Runs, who: char, proc: &ChildProc) {
    while let Ok((at, line)) = proc.lines().try_recv() {
        if let Some(id) = line
            .split("RUN ")
            .nth(1)
            .and_then(|s| s.trim().parse().ok())
        {
            runs.entry(id).or_default().push((who, at));
        }
    }
}

fn succeeded(client: &mut postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status = 'succeeded'",
            &[],
        )
        .unwrap()
        .get(0)
}

#[test]
fn worker_processes_in_namespaces_one_cut_off_and_back() {
    if let Some(reason) = Netns::skip_reason().or_else(cluster::skip_reason) {
        skip(&reason);
        return;
    }
    support::init_logging();
    let ns_a = Netns::create(0).expect("namespace A");
    let ns_b = Netns::create(1).expect("namespace B");
    let db = Cluster::primary_with(
        "netns",
        &format!(
            "listen_addresses = '127.0.0.1,{},{}'\n",
            ns_a.host_ip(),
            ns_b.host_ip()
        ),
        &format!(
            "host all all {}/32 trust\nhost all all {}/32 trust\n",
            ns_a.ns_ip(),
            ns_b.ns_ip()
        ),
    );
    let app = App::builder(db.url("postgres")).build().unwrap();
    app.migrate().unwrap();
    let url_from = |ns: &Netns| {
        format!(
            "postgres://postgres@{}:{}/postgres?application_name=ns-worker",
            ns.host_ip(),
            db.port()
        )
    };
    let a = start_in(&ns_a, &url_from(&ns_a));
    let b = start_in(&ns_b, &url_from(&ns_b));
    a.wait_line("CHILD_READY", Duration::from_secs(30));
    b.wait_line("CHILD_READY", Duration::from_secs(30));
    let mut client = db.client("postgres");
    let peers: Vec<String> = client
        .query(
            "SELECT DISTINCT host(client_addr) FROM pg_stat_activity \
              WHERE application_name = 'ns-worker'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        peers.len(),
        2,
        "workers connect from both namespaces: {peers:?}"
    );

    let batch = |n: usize| -> Vec<NewJob> {
        (0..n)
            .map(|i| NewJob::new("work", &serde_json::json!({ "i": i })).unwrap())
            .collect()
    };
    app.defer_batch(&batch(40)).unwrap();
    let mut runs = Runs::new();
    // Cut A once it is running jobs.
    assert!(wait_until(Duration::from_secs(10), || {
        collect(&mut runs, 'A', &a);
        collect(&mut runs, 'B', &b);
        runs.values().flatten().filter(|r| r.0 == 'A').count() >= 3
    }));
    ns_a.cut();
    let cut = Instant::now();
    collect(&mut runs, 'A', &a);

    // B runs everything, A's held jobs included once A's heartbeat is stale.
    let all = wait_until(Duration::from_secs(30), || {
        collect(&mut runs, 'B', &b);
        succeeded(&mut client) == 40
    });
    assert!(
        all,
        "only {} of 40 jobs succeeded with A cut off",
        succeeded(&mut client)
    );
    let rescued: i64 = client
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE errors::text LIKE '%stopped sending heartbeats%'",
            &[],
        )
        .unwrap()
        .get(0);
    println!(
        "A cut for {:?}; {rescued} of its jobs rescued by B",
        cut.elapsed()
    );

    // A comes back, rejoins, and takes part in new work.
    ns_a.heal();
    let healed = Instant::now();
    app.defer_batch(&batch(30)).unwrap();
    let rejoined = wait_until(Duration::from_secs(30), || {
        collect(&mut runs, 'A', &a);
        collect(&mut runs, 'B', &b);
        runs.values().flatten().any(|r| r.0 == 'A' && r.1 > healed) && succeeded(&mut client) == 70
    });
    assert!(
        rejoined,
        "after healing: A ran {} new jobs, {} of 70 succeeded; A's stderr:\n{}",
        runs.values()
            .flatten()
            .filter(|r| r.0 == 'A' && r.1 > healed)
            .count(),
        succeeded(&mut client),
        a.stderr_tail()
    );

    // No job ran twice by two live workers. A job's runs are ordered by when their lines
    // were read: a line A printed just before the cut can be collected after B's.
    let mut twice = 0;
    for (id, r) in &mut runs {
        if r.len() < 2 {
            continue;
        }
        r.sort_by_key(|run| run.1);
        twice += 1;
        assert_eq!(r.len(), 2, "job {id} ran {} times: {r:?}", r.len());
        let (first, second) = (r[0], r[1]);
        assert!(
            // (A's line may be read a moment after it was printed.)
            first.0 == 'A' && first.1 <= cut + Duration::from_millis(200) && second.0 == 'B',
            "job {id} ran twice but not as a rescue of the cut worker: {r:?}"
        );
        assert!(
            second.1.duration_since(cut) >= STALLED_AFTER - Duration::from_millis(300),
            "job {id} was run again {:?} after the cut, before A's heartbeat was stale",
            second.1.duration_since(cut)
        );
    }
    println!(
        "netns: {} jobs, {twice} ran twice (running on A when it was cut), A ran {} after healing",
        runs.len(),
        runs.values()
            .flatten()
            .filter(|r| r.0 == 'A' && r.1 > healed)
            .count()
    );
    let open: i64 = client
        .query_one(
            "SELECT count(*) FROM postpone_jobs WHERE status <> 'succeeded'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(open, 0);

    for (who, p) in [("A", a), ("B", b)] {
        let report = p.stop("CHILD_REPORT", Duration::from_secs(10));
        assert!(report.contains("clean=true"), "{who}: {report}");
    }
}
