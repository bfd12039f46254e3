//! The dashboard's overview shows each queue's limits (concurrency, per key, rate) and why
//! its due jobs wait (paused, limit reached, key limit reached, rate limited, lock held),
//! over plain HTTP against PostgreSQL. (tests/web_browser.rs checks the same cells in
//! Chromium.)

mod support;
mod web_util;

use std::time::{Duration, Instant};

use postpone::Dashboard;
use serde_json::json;
use support::*;
use web_util::*;

#[test]
fn the_overview_shows_limits_and_why_due_jobs_wait() {
    init_logging();
    let db = TestDb::new();
    let app = web_util::app(&db);
    let admin = app.admin();
    admin
        .set_rate_limit("throttled", 1, Duration::from_secs(3600))
        .unwrap();
    admin.set_key_limit("keyed", "user", 1).unwrap();
    admin.set_queue_limit("capped", Some(1)).unwrap();
    for q in ["throttled", "keyed", "capped"] {
        for _ in 0..2 {
            app.job("t").queue(q).defer(&json!({"user": 1})).unwrap();
        }
    }
    app.job("t").queue("paused").defer(&0).unwrap();
    admin.pause("paused").unwrap();
    app.job("t").queue("free").defer(&0).unwrap();
    // One claim takes a job of each limited queue (no worker runs here).
    let mut c = db.client();
    let worker: i64 = c
        .query_one(
            "INSERT INTO postpone_workers (name, last_heartbeat) VALUES ('sql', now()) RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let n = c
        .query(
            "SELECT id FROM postpone_claim($1, 10, ARRAY['throttled', 'keyed', 'capped'], NULL)",
            &[&worker],
        )
        .unwrap()
        .len();
    assert_eq!(n, 3);

    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .spawn()
        .unwrap();
    let page = get(dash.addr(), "/");
    assert_eq!(page.status, 200, "{}", page.body);
    let body = page.body;
    assert!(body.contains("<th>Limits</th>"), "{body}");
    assert!(body.contains("<th>Due jobs wait for</th>"), "{body}");
    let row = |q: &str| -> String {
        let start = body
            .find(&format!(">{q}</a></td>"))
            .unwrap_or_else(|| panic!("no row for {q} in {body}"));
        let end = body[start..].find("</tr>").unwrap() + start;
        body[start..end].to_owned()
    };
    let throttled = row("throttled");
    assert!(
        throttled.contains("at most 1 start per 1h 00m"),
        "{throttled}"
    );
    assert!(
        throttled.contains("rate limited (next start in"),
        "{throttled}"
    );
    let keyed = row("keyed");
    assert!(keyed.contains("at most 1 running per user"), "{keyed}");
    assert!(keyed.contains("key limit reached (1 waiting)"), "{keyed}");
    let capped = row("capped");
    assert!(capped.contains("at most 1 running"), "{capped}");
    assert!(capped.contains("limit reached"), "{capped}");
    assert!(row("paused").contains("<span class=\"err why\">paused</span>"));
    let free = row("free");
    assert!(
        !free.contains("err why") && !free.contains("at most"),
        "{free}"
    );
    dash.shutdown();
}

/// Defers a job from SQL with arguments made by `expr` (SQL text) and returns its id and
/// the size of its stored JSON text.
fn defer_sql(db: &TestDb, expr: &str) -> (i64, usize) {
    let mut c = db.client();
    let id: i64 = c
        .query_one(&format!("SELECT postpone_defer('t', ({expr})::jsonb)"), &[])
        .unwrap()
        .get(0);
    let len: i32 = c
        .query_one(
            "SELECT octet_length(args::text) FROM postpone_jobs WHERE id = $1",
            &[&id],
        )
        .unwrap()
        .get(0);
    (id, len as usize)
}

/// A connection that reads at about `rate` bytes a second through a small receive buffer,
/// for `for_how_long`; returns the bytes it read.
fn slow_read(addr: std::net::SocketAddr, path: &str, rate: usize, for_how_long: Duration) -> usize {
    use socket2::{Domain, Socket, Type};
    use std::io::{Read, Write};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.connect_timeout(&addr.into(), Duration::from_secs(5))
        .unwrap();
    let mut s: std::net::TcpStream = s.into();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let started = Instant::now();
    let mut got = 0;
    let mut buf = vec![0u8; rate];
    while started.elapsed() < for_how_long {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
        // The pace of a slow client, not a synchronisation.
        std::thread::sleep(Duration::from_secs(1));
    }
    got
}

#[test]
fn slow_readers_and_idle_connections_cannot_stall_the_dashboard() {
    init_logging();
    let db = TestDb::new();
    let app = web_util::app(&db);
    // 12 MB of arguments: the old page printed them whole.
    let (id, len) = defer_sql(&db, "jsonb_build_object('blob', repeat('x', 12000000))");
    assert!(len > 12_000_000);
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .threads(4)
        .spawn()
        .unwrap();
    let addr = dash.addr();
    // Four slow readers of the job's page and four of its raw arguments, at 1 KB/s, and
    // 100 idle keep-alive connections.
    let readers: Vec<_> = (0..8)
        .map(|n| {
            let path = if n % 2 == 0 {
                format!("/jobs/{id}")
            } else {
                format!("/jobs/{id}/args.json")
            };
            std::thread::spawn(move || slow_read(addr, &path, 1024, Duration::from_secs(8)))
        })
        .collect();
    let idle: Vec<std::net::TcpStream> = (0..100)
        .map(|_| {
            use std::io::Write;
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            write!(s, "GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
            s
        })
        .collect();
    // Every slow reader has its answer under way before the checks start.
    std::thread::sleep(Duration::from_secs(2));
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        let r = get(addr, "/health");
        let took = started.elapsed();
        worst = worst.max(took);
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            took < Duration::from_secs(2),
            "/health took {took:?} beside slow readers"
        );
    }
    eprintln!("measured: /health beside 8 slow readers and 100 idle connections: worst {worst:?}");
    let page = get(addr, &format!("/jobs/{id}"));
    assert_eq!(page.status, 200);
    for r in readers {
        let got = r.join().unwrap();
        assert!(got > 0 && got < 1_000_000, "a slow reader read {got} bytes");
    }
    drop(idle);
    dash.shutdown();
}

#[test]
fn a_reader_too_slow_for_the_response_deadline_is_cut_off() {
    init_logging();
    let db = TestDb::new();
    let app = web_util::app(&db);
    let (id, _) = defer_sql(&db, "jsonb_build_object('blob', repeat('y', 4000000))");
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .response_timeout(Duration::from_secs(3))
        .spawn()
        .unwrap();
    let started = Instant::now();
    let got = slow_read(
        dash.addr(),
        &format!("/jobs/{id}/args.json"),
        1024,
        Duration::from_secs(30),
    );
    let took = started.elapsed();
    eprintln!("measured: a 1 KB/s reader of 4 MB cut after {took:?}, {got} bytes read");
    assert!(got < 4_000_000, "{got}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    dash.shutdown();
}

#[test]
fn a_large_argument_is_cut_on_its_page_and_downloads_whole() {
    init_logging();
    let db = TestDb::new();
    let app = web_util::app(&db);
    let (id, len) = defer_sql(
        &db,
        "jsonb_build_object('rows', (SELECT jsonb_agg(jsonb_build_object('n', g, 's', '<b>' || g)) \
         FROM generate_series(1, 200000) g))",
    );
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .spawn()
        .unwrap();
    let page = get(dash.addr(), &format!("/jobs/{id}"));
    assert_eq!(page.status, 200);
    eprintln!(
        "measured: a job of {len} bytes of arguments -> a page of {} bytes",
        page.body.len()
    );
    assert!(page.body.len() < 400_000, "{} bytes", page.body.len());
    assert!(page.body.contains("id=\"args-cut\""), "not marked cut");
    assert!(page
        .body
        .contains(&format!("href=\"/jobs/{id}/args.json\"")));
    assert!(page.body.contains("&lt;b&gt;1"), "not escaped");
    assert!(
        page.body
            .contains(&format!("of {:.1} MiB shown", len as f64 / 1048576.0)),
        "the page does not say how large the value is"
    );
    let raw = get(dash.addr(), &format!("/jobs/{id}/args.json"));
    assert_eq!(raw.status, 200, "{}", raw.body);
    assert_eq!(raw.header("content-type"), Some("application/json"));
    let stored: String = db
        .client()
        .query_one("SELECT args::text FROM postpone_jobs WHERE id = $1", &[&id])
        .unwrap()
        .get(0);
    assert_eq!(raw.body.len(), len);
    assert!(
        raw.body == stored,
        "the download differs from the stored text"
    );
    // Small values are shown whole, with no download offered.
    let (small, _) = defer_sql(&db, "'{\"a\": 1}'");
    let page = get(dash.addr(), &format!("/jobs/{small}"));
    assert!(!page.body.contains("args-cut"));
    assert_eq!(
        get(dash.addr(), &format!("/jobs/{small}/output.json")).status,
        404
    );
    assert_eq!(get(dash.addr(), "/jobs/999999/args.json").status, 404);
    dash.shutdown();
}

#[test]
fn the_overview_lists_a_bounded_number_of_queues_and_every_paused_one() {
    init_logging();
    let db = TestDb::new();
    let app = web_util::app(&db);
    // 3,000 queues with names of 200 characters: the old overview listed every one (a
    // 4.4 MB page here; 29 MB for 20,000).
    db.client()
        .batch_execute(
            "SELECT postpone_defer('t', '{}', queue => 'q' || repeat('x', 200) || lpad(g::text, 5, '0'))
               FROM generate_series(1, 3000) g",
        )
        .unwrap();
    let last = format!("q{}03000", "x".repeat(200));
    app.admin().pause(&last).unwrap();
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .spawn()
        .unwrap();
    let page = get(dash.addr(), "/");
    assert_eq!(page.status, 200);
    eprintln!(
        "measured: the overview with 3,000 queues: {} bytes",
        page.body.len()
    );
    assert!(page.body.len() < 600_000, "{} bytes", page.body.len());
    assert!(
        page.body.contains("id=\"queues-cut\""),
        "not said to be cut"
    );
    let first = format!("q{}00001", "x".repeat(200));
    let past = format!("q{}00201", "x".repeat(200));
    assert!(page.body.contains(&first));
    assert!(!page.body.contains(&past), "queue 201 is listed");
    // The paused queue, far past the first 200, is listed with its pause.
    assert!(page.body.contains(&last), "the paused queue is not listed");
    dash.shutdown();
}

#[test]
fn connections_past_the_limit_are_refused_at_once() {
    init_logging();
    let db = TestDb::new();
    let app = web_util::app(&db);
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .max_connections(10)
        .spawn()
        .unwrap();
    let held: Vec<std::net::TcpStream> = (0..10)
        .map(|_| std::net::TcpStream::connect(dash.addr()).unwrap())
        .collect();
    // The server counts them as they are accepted.
    assert!(wait_until(Duration::from_secs(10), || get(
        dash.addr(),
        "/health"
    )
    .status
        == 503));
    drop(held);
    assert!(wait_until(Duration::from_secs(10), || get(
        dash.addr(),
        "/health"
    )
    .status
        == 200));
    dash.shutdown();
}

/// The dashboard in a process of its own (`postpone dashboard`), to read its peak memory.
#[cfg(feature = "cli")]
#[test]
fn deep_arguments_and_many_tags_make_small_pages_and_cost_little_memory() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    init_logging();
    let db = TestDb::new();
    web_util::app(&db);
    // 20 KB nested 10,000 deep, and 40 KB of nested numbers (issue 44: 200 MB and 603 MB
    // pages, 585 MiB and 1.74 GiB of memory with the old pretty-printer).
    let cases = [
        defer_sql(&db, "repeat('[', 10000) || repeat(']', 10000)"),
        defer_sql(&db, "repeat('[1,', 10000) || '1' || repeat(']', 10000)"),
    ];
    let (small, _) = defer_sql(&db, "'{\"a\": 1}'");
    // 100,000 tags of 200 characters (20 MB; 437 KB stored), written by SQL of one's own:
    // the old list printed every one (a 44.7 MB page and 145 MB of memory for this job).
    let tagged: i64 = db
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
    // 12 MB of arguments: its page is cut, its download streamed.
    let (big, big_len) = defer_sql(&db, "jsonb_build_object('blob', repeat('x', 12000000))");
    /// Ends the dashboard process however the test ends.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_postpone"))
        .args(["dashboard", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", db.url())
        .env_remove("POSTPONE_DASHBOARD_TOKEN")
        .env_remove("POSTPONE_DASHBOARD_USER")
        .env_remove("POSTPONE_DASHBOARD_PASSWORD")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .trim_end_matches(',');
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let child = Killed(child);
    let hwm = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.0.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    // Warm up: the first pages allocate what every page needs.
    for _ in 0..3 {
        assert_eq!(get(addr, &format!("/jobs/{small}")).status, 200);
    }
    let before = hwm();
    for (id, stored) in cases {
        // Four at once, twice, as four request threads would serve them.
        for _ in 0..2 {
            let pages: Vec<_> = (0..4)
                .map(|_| std::thread::spawn(move || get(addr, &format!("/jobs/{id}"))))
                .collect();
            for p in pages {
                let p = p.join().unwrap();
                assert_eq!(p.status, 200);
                eprintln!(
                    "measured: {stored} bytes of nested arguments -> a page of {} bytes",
                    p.body.len()
                );
                assert!(
                    p.body.len() < 10 * stored + 20_000,
                    "{} bytes for {stored}",
                    p.body.len()
                );
                assert!(p.body.contains("id=\"args-cut\""));
            }
        }
    }
    // The list (the tagged job first) and the tagged job's page, four at once.
    for path in ["/jobs".to_owned(), format!("/jobs/{tagged}")] {
        let pages: Vec<_> = (0..4)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || get(addr, &path))
            })
            .collect();
        for p in pages {
            let p = p.join().unwrap();
            assert_eq!(p.status, 200);
            eprintln!(
                "measured: {path} with a job of 100,000 tags: a page of {} bytes",
                p.body.len()
            );
            assert!(p.body.len() < 100_000, "{path}: {} bytes", p.body.len());
            if path == "/jobs" {
                assert!(p.body.contains("+99992 more"), "{}", p.body);
            } else {
                assert!(p.body.contains("(64 of 100000 shown)"), "{}", p.body);
            }
        }
    }
    // Four pages at once. (Its download is checked by a_large_argument_is_cut_on_its_page_
    // and_downloads_whole: each of its 47 chunks makes the server turn the whole value into
    // text again, which on a loaded machine does not fit in the response deadline.)
    let pages: Vec<_> = (0..4)
        .map(|_| {
            let path = format!("/jobs/{big}");
            std::thread::spawn(move || (path.clone(), get(addr, &path)))
        })
        .collect();
    let reads: Vec<_> = pages.into_iter().map(|p| p.join().unwrap()).collect();
    for (path, r) in reads {
        assert_eq!(r.status, 200, "{path}");
        assert!(r.body.len() < 300_000, "{} bytes", r.body.len());
        assert!(r
            .body
            .contains(&format!("of {:.1} MiB shown", big_len as f64 / 1048576.0)));
    }
    let grew = hwm().saturating_sub(before);
    drop(child);
    eprintln!("measured: peak memory grew by {grew} bytes over 20 pages");
    // Four pages at once, each a few times its 20-40 KB value, or a few dozen tags, or cut
    // to 256 KiB: a few MiB, less than one copy of the 12 MB value (the old pretty-printer
    // needed hundreds, the old list 145 MB).
    assert!(grew < 10 * 1024 * 1024, "peak memory grew by {grew} bytes");
}

#[test]
fn a_download_of_many_megabytes_fits_its_deadline_and_gives_its_connection_back() {
    init_logging();
    let db = TestDb::new();
    let app = web_util::app(&db);
    // About 11 MB of small objects: the server's text of it is slow to make, and read a
    // chunk per round-trip it is made again for each of its 40-odd chunks.
    let (id, len) = defer_sql(
        &db,
        "jsonb_build_object('rows', (SELECT jsonb_agg(jsonb_build_object('n', g, 's', md5(g::text))) \
         FROM generate_series(1, 200000) g))",
    );
    assert!(len > 10_000_000, "{len}");
    let stored: String = db
        .client()
        .query_one("SELECT args::text FROM postpone_jobs WHERE id = $1", &[&id])
        .unwrap()
        .get(0);
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .response_timeout(Duration::from_secs(10))
        .spawn()
        .unwrap();
    let addr = dash.addr();
    // A client that reads a little and goes away: its download must give its connection
    // and its slot back.
    let got = slow_read(
        addr,
        &format!("/jobs/{id}/args.json"),
        4096,
        Duration::from_secs(1),
    );
    assert!(got > 0);
    for round in 0..3 {
        let started = Instant::now();
        let raw = get(addr, &format!("/jobs/{id}/args.json"));
        eprintln!(
            "measured: download {round} of {len} bytes took {:?}",
            started.elapsed()
        );
        assert_eq!(raw.status, 200, "{}", raw.body);
        assert_eq!(raw.body.len(), len, "download {round} was cut short");
        assert!(
            raw.body == stored,
            "download {round} differs from the stored text"
        );
    }
    // Pages are served beside it, and no connection is left in a transaction.
    assert_eq!(get(addr, &format!("/jobs/{id}")).status, 200);
    dash.shutdown();
    let left: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "a download left a connection in its transaction");
}
