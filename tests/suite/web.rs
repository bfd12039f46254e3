//! The dashboard over plain HTTP against PostgreSQL with real jobs: escaping of hostile
//! values, CSRF and read-only refusals, keyset pages, auth, a half-open database, slow
//! clients. (tests/web_browser.rs drives the same pages in Chromium.)

use crate::support;
use crate::web_util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use postpone::{App, Dashboard, DashboardAuth, JobId, NewJob};
use serde_json::json;
use support::*;
use web_util::*;

fn dashboard(app: &App) -> postpone::DashboardHandle {
    Dashboard::new(app)
        .listen("127.0.0.1:0")
        .unwrap()
        .spawn()
        .expect("dashboard")
}

/// Nothing hostile reached the page as markup.
fn assert_inert(page: &str) {
    for raw in [
        "<script>window.pwned",
        "<img src=x",
        "</td><script>",
        "<b>host</b>",
        "<i>italic?</i>",
    ] {
        assert!(!page.contains(raw), "unescaped {raw:?} in:\n{page}");
    }
    assert!(!page.contains('\0'), "a raw NUL in the page");
    // The one script element is the dashboard's own file.
    let page = page.replacen("<script src=\"/static/live.js\" defer></script>", "", 1);
    assert!(
        !page.to_ascii_lowercase().contains("<script"),
        "a script element"
    );
}

#[test]
fn every_page_shows_real_jobs_and_escapes_hostile_values() {
    init_logging();
    let db = TestDb::new();
    let fx = Fixture::new(&db);
    let dash = dashboard(&fx.app);
    let addr = dash.addr();

    let overview = get(addr, "/");
    assert_eq!(overview.status, 200, "{}", overview.body);
    assert_inert(&overview.body);
    assert!(overview
        .body
        .contains("q&quot;&gt;&lt;img src=x onerror=&quot;window.pwned=2&quot;&gt;"));
    assert!(overview.body.contains("<svg"), "no chart");
    assert!(overview.body.contains("http-equiv=\"refresh\""));
    assert!(overview
        .header("content-security-policy")
        .unwrap()
        .contains("default-src 'none'"));

    let jobs = get(addr, "/jobs");
    assert_eq!(jobs.status, 200);
    assert_inert(&jobs.body);
    assert!(jobs
        .body
        .contains("&lt;script&gt;window.pwned=1&lt;/script&gt;&quot;'&amp;task"));
    for id in [fx.flaky, fx.hostile, fx.ok, fx.later] {
        assert!(
            jobs.body.contains(&format!("href=\"/jobs/{id}\"")),
            "job {id} not listed"
        );
    }

    let job = get(addr, &format!("/jobs/{}", fx.flaky));
    assert_eq!(job.status, 200);
    assert_inert(&job.body);
    // The error, its quotes and its NUL shown as text; the arguments pretty-printed.
    assert!(
        job.body.contains(
            "boom &lt;script&gt;window.pwned=4&lt;/script&gt; &quot;double&quot; 'single' NUL:"
        ),
        "{}",
        job.body
    );
    assert!(
        job.body.contains("NUL:\u{fffd}:end"),
        "the NUL is not shown as U+FFFD"
    );
    assert!(
        job.body.contains("&quot;nested&quot;: {\n"),
        "arguments not pretty-printed"
    );
    assert!(
        job.body.contains("&lt;/td&gt;&lt;script&gt;window.pwned=3"),
        "lock"
    );
    assert!(
        job.body.contains("id=\"retry\""),
        "no retry button on a failed job"
    );
    assert!(!job.body.contains("id=\"cancel\""));
    assert!(job.body.contains("Timeline") && job.body.contains("attempt 1 started"));

    let later = get(addr, &format!("/jobs/{}", fx.later));
    // Waiting: cancel; abort is for running jobs.
    assert!(later.body.contains("id=\"cancel\"") && !later.body.contains("id=\"abort\""));

    let workers = get(addr, "/workers");
    assert_eq!(workers.status, 200);
    assert_inert(&workers.body);
    assert!(workers.body.contains("&lt;b&gt;host&lt;/b&gt;&quot;'"));
    assert_eq!(
        workers.body.matches("class=\"stalled\"").count(),
        1,
        "{}",
        workers.body
    );
    assert!(workers.body.contains(fx.worker.as_ref().unwrap().name()));

    let periodic = get(addr, "/periodic");
    assert_eq!(periodic.status, 200);
    assert_inert(&periodic.body);
    assert!(periodic.body.contains("id&lt;&amp;&gt;"));
    assert!(periodic.body.contains(&format!("href=\"/jobs/{}\"", fx.ok)));
    assert!(periodic.body.contains("(inferred)"), "{}", periodic.body);

    assert_eq!(get(addr, "/jobs/999999").status, 404);
    assert_eq!(get(addr, "/jobs/abc").status, 400);
    assert_eq!(get(addr, "/nowhere").status, 404);
    let jump = get(addr, &format!("/jobs?id={}", fx.ok));
    assert_eq!(jump.status, 303);
    assert_eq!(
        jump.header("location"),
        Some(format!("/jobs/{}", fx.ok).as_str())
    );
    // A status that does not exist is a clear 400, not a 500.
    let bad = get(addr, "/jobs?status=%3Cscript%3E");
    assert_eq!(bad.status, 400);
    assert_inert(&bad.body);
    dash.shutdown();
}

#[test]
fn actions_are_posts_with_a_csrf_token_and_refused_read_only() {
    init_logging();
    let db = TestDb::new();
    let fx = Fixture::new(&db);
    let dash = dashboard(&fx.app);
    let addr = dash.addr();
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let retry = format!("/jobs/{}/retry", fx.flaky);

    assert_eq!(
        get(addr, &retry).status,
        405,
        "a GET must not change anything"
    );
    let r = request(addr, "POST", &retry, &form, "csrf=wrong");
    assert_eq!(r.status, 403, "{}", r.body);
    let r = request(addr, "POST", &retry, &form, "");
    assert_eq!(r.status, 403);
    assert_eq!(status_of(&fx.app, fx.flaky), "failed");

    let page = get(addr, &format!("/jobs/{}", fx.flaky)).body;
    let token = csrf_of(&page);
    let cross = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Origin", "http://evil.example"),
    ];
    let r = request(addr, "POST", &retry, &cross, &format!("csrf={token}"));
    assert_eq!(r.status, 403, "cross-origin POST accepted");
    assert_eq!(status_of(&fx.app, fx.flaky), "failed");

    let r = request(addr, "POST", &retry, &form, &format!("csrf={token}"));
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(
        r.header("location"),
        Some(format!("/jobs/{}?done=retried", fx.flaky).as_str())
    );
    assert!(wait_until(Duration::from_secs(20), || status_of(
        &fx.app, fx.flaky
    ) == "succeeded"));

    // A retry the status does not allow: a 409 page naming the status, escaped.
    let r = request(addr, "POST", &retry, &form, &format!("csrf={token}"));
    assert_eq!(r.status, 409);
    assert!(r.body.contains("it is succeeded"), "{}", r.body);
    assert_inert(&r.body);

    let cancel = format!("/jobs/{}/cancel", fx.later);
    let r = request(addr, "POST", &cancel, &form, &format!("csrf={token}"));
    assert_eq!(r.status, 303);
    assert_eq!(status_of(&fx.app, fx.later), "cancelled");
    let shown = get(addr, r.header("location").unwrap());
    assert!(shown.body.contains("Cancelled: the job will not run."));

    // The `done` flash is a fixed text: a crafted link cannot put words on the page.
    let crafted = get(addr, &format!("/jobs/{}?done=%3Cb%3Ehi", fx.ok));
    assert!(!crafted.body.contains("hi") || !crafted.body.contains("<b>hi"));
    assert!(!crafted.body.contains("class=\"flash\">"));
    dash.shutdown();

    let ro = Dashboard::new(&fx.app)
        .listen("127.0.0.1:0")
        .unwrap()
        .read_only(true)
        .spawn()
        .unwrap();
    let page = get(ro.addr(), &format!("/jobs/{}", fx.hostile)).body;
    assert!(page.contains("read-only"));
    assert!(
        !page.contains("<form class=\"inline\""),
        "buttons in read-only mode"
    );
    let r = request(
        ro.addr(),
        "POST",
        &format!("/jobs/{}/retry", fx.hostile),
        &form,
        &format!("csrf={token}"),
    );
    assert_eq!(r.status, 403);
    assert_eq!(status_of(&fx.app, fx.hostile), "failed");
    ro.shutdown();
}

#[test]
fn jobs_pages_walk_by_keyset_with_filters() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let jobs: Vec<NewJob> = (0..120)
        .map(|n| {
            NewJob::new(if n % 2 == 0 { "even" } else { "odd" }, &json!({ "n": n }))
                .unwrap()
                .queue("walk")
        })
        .collect();
    let ids: Vec<JobId> = app.defer_batch(&jobs).unwrap();
    let dash = dashboard(&app);
    let addr = dash.addr();

    let ids_on = listed;
    let next = |body: &str, label: &str| -> Option<String> {
        let end = body.find(label)?;
        let start = body[..end].rfind("href=\"")? + 6;
        Some(body[start..end - 2].replace("&amp;", "&"))
    };
    let mut seen = Vec::new();
    let mut path = "/jobs?task=even".to_owned();
    loop {
        let page = get(addr, &path);
        assert_eq!(page.status, 200);
        let on = ids_on(&page.body);
        assert!(on.len() <= 50);
        seen.extend(on);
        match next(&page.body, "older ›") {
            Some(p) => path = p,
            None => break,
        }
    }
    let mut want: Vec<i64> = ids.iter().step_by(2).map(|i| i.get()).collect();
    want.reverse();
    assert_eq!(seen, want, "every even job once, newest first");

    // Back from the second page to the first.
    let second = get(addr, "/jobs?queue=walk&before=9999999");
    let older = next(&second.body, "older ›").unwrap();
    let page2 = get(addr, &older);
    let newer = next(&page2.body, "‹ newer").unwrap();
    assert_eq!(ids_on(&get(addr, &newer).body), ids_on(&second.body));
    dash.shutdown();
}

#[test]
fn token_and_basic_auth_guard_every_page() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .auth(Some(DashboardAuth::Token("s3cret token".into())))
        .spawn()
        .unwrap();
    let addr = dash.addr();
    assert_eq!(get(addr, "/").status, 401);
    assert_eq!(get(addr, "/jobs?token=wrong").status, 401);
    let ok = request(
        addr,
        "GET",
        "/",
        &[("Authorization", "Bearer s3cret token")],
        "",
    );
    assert_eq!(ok.status, 200);
    let login = get(addr, "/jobs?token=s3cret%20token&task=x");
    assert_eq!(login.status, 303);
    assert_eq!(login.header("location"), Some("/jobs?task=x"));
    let cookie = login.header("set-cookie").unwrap();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let pair = cookie.split(';').next().unwrap();
    assert_eq!(
        request(addr, "GET", "/jobs", &[("Cookie", pair)], "").status,
        200
    );
    dash.shutdown();

    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .auth(Some(DashboardAuth::Basic {
            user: "ops".into(),
            password: "pw".into(),
        }))
        .spawn()
        .unwrap();
    let r = get(dash.addr(), "/");
    assert_eq!(r.status, 401);
    assert!(r.header("www-authenticate").unwrap().starts_with("Basic"));
    // "ops:pw" and "ops:px"
    let good = request(
        dash.addr(),
        "GET",
        "/",
        &[("Authorization", "Basic b3BzOnB3")],
        "",
    );
    assert_eq!(good.status, 200);
    let bad = request(
        dash.addr(),
        "GET",
        "/",
        &[("Authorization", "Basic b3BzOnB4")],
        "",
    );
    assert_eq!(bad.status, 401);
    dash.shutdown();
}

#[test]
fn a_half_open_database_gives_an_error_page_within_io_timeout() {
    init_logging();
    let db = TestDb::new();
    app(&db); // migrate directly
    let proxy = FaultProxy::start(&db.server_addr());
    let app = App::builder(db.url_via(&proxy))
        .pool_size(2)
        .io_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1))
        .pool_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let dash = dashboard(&app);
    // (Not the overview: it would share these figures for 5 s.)
    assert_eq!(get(dash.addr(), "/workers").status, 200);
    proxy.strand_all();
    proxy.set_new_conns(NewConns::Strand);
    for path in ["/", "/jobs", "/jobs/1", "/workers", "/periodic"] {
        let started = Instant::now();
        let r = get(dash.addr(), path);
        let took = started.elapsed();
        eprintln!(
            "measured: {path} with a half-open database -> {} in {took:?}",
            r.status
        );
        assert!(
            matches!(r.status, 503 | 504),
            "{path}: {} {}",
            r.status,
            r.body
        );
        assert!(r.body.contains("did not answer in time"), "{}", r.body);
        assert!(took < Duration::from_secs(5), "{path} took {took:?}");
    }
    let started = Instant::now();
    dash.shutdown();
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn slow_clients_neither_stall_others_nor_hold_a_thread_forever() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .threads(2)
        .read_timeout(Duration::from_secs(2))
        .spawn()
        .unwrap();
    let addr = dash.addr();
    // One client sends half a head and goes silent.
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    for _ in 0..5 {
        assert_eq!(get(addr, "/workers").status, 200);
    }
    let took = started.elapsed();
    eprintln!("measured: 5 requests beside a stalled client in {took:?}");
    assert!(
        took < Duration::from_secs(2),
        "stalled by a slow client: {took:?}"
    );
    // The slow one is answered 408 and closed after the read timeout.
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");

    // Oversized heads are refused, not buffered.
    let mut big = TcpStream::connect(addr).unwrap();
    let _ = big.write_all(format!("GET /{} HTTP/1.1\r\n", "a".repeat(40_000)).as_bytes());
    big.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = String::new();
    let _ = big.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    dash.shutdown();
}

#[test]
fn a_flood_of_silent_connections_gets_quick_answers_not_a_hang() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .threads(2)
        .read_timeout(Duration::from_secs(3))
        .spawn()
        .unwrap();
    let addr = dash.addr();
    // More silent clients than threads and queue together.
    let silent: Vec<TcpStream> = (0..60).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let r = get(addr, "/workers");
    let took = started.elapsed();
    eprintln!(
        "measured: a request behind 60 silent connections -> {} in {took:?}",
        r.status
    );
    // Refused at once when the queue is full; served, or refused, within about the read
    // timeout (3 s) when the flood was slow to arrive and it got a place in the queue.
    assert!(matches!(r.status, 200 | 503), "{}", r.body);
    if r.status == 503 {
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    assert!(took < Duration::from_secs(6), "{took:?}");
    drop(silent);
    // Once they are gone the dashboard serves again.
    assert!(wait_until(Duration::from_secs(10), || get(
        addr, "/workers"
    )
    .status
        == 200));
    dash.shutdown();
}

#[cfg(feature = "cli")]
#[test]
fn the_dashboard_command_serves_until_killed_and_checks_its_auth_settings() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    app.defer("from_cli", &json!({"a": 1})).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_postpone"))
        .args(["dashboard", "--listen", "127.0.0.1:0", "--read-only"])
        .env("DATABASE_URL", db.url())
        .env_remove("POSTPONE_DASHBOARD_TOKEN")
        .env_remove("POSTPONE_DASHBOARD_USER")
        .env_remove("POSTPONE_DASHBOARD_PASSWORD")
        .stdout(Stdio::piped())
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
    assert!(line.contains("read-only"), "{line}");
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let page = get(addr, "/jobs");
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(page.status, 200);
    assert!(page.body.contains("from_cli") && page.body.contains("read-only"));

    let out = Command::new(env!("CARGO_BIN_EXE_postpone"))
        .args(["dashboard", "--listen", "127.0.0.1:0"])
        .env("DATABASE_URL", db.url())
        .env("POSTPONE_DASHBOARD_TOKEN", "t")
        .env("POSTPONE_DASHBOARD_USER", "u")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("set either POSTPONE_DASHBOARD_TOKEN"), "{err}");

    // Served beyond the loopback without access control, it warns (and on the loopback not).
    for (listen, warns) in [("0.0.0.0:0", true), ("127.0.0.1:0", false)] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_postpone"))
            .args(["dashboard", "--listen", listen])
            .env("DATABASE_URL", db.url())
            .env_remove("POSTPONE_DASHBOARD_TOKEN")
            .env_remove("POSTPONE_DASHBOARD_USER")
            .env_remove("POSTPONE_DASHBOARD_PASSWORD")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The warning is written before the line that says where it serves.
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            line.starts_with("postpone dashboard on"),
            "{listen}: {line}"
        );
        assert_eq!(
            err.contains("warning: no access control on 0.0.0.0:"),
            warns,
            "{listen}: {err}"
        );
        if warns {
            assert!(
                err.contains("can retry, cancel and delete jobs; set POSTPONE_DASHBOARD_TOKEN"),
                "{err}"
            );
        }
    }
}

#[test]
fn a_request_queued_behind_slow_clients_is_answered_within_about_the_read_timeout() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .threads(1)
        .read_timeout(Duration::from_secs(1))
        .spawn()
        .unwrap();
    let addr = dash.addr();
    // Four silent clients: served one at a time, each would hold the thread for 1 s.
    let silent: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let r = get(addr, "/workers");
    let took = started.elapsed();
    eprintln!(
        "measured: a request queued behind 4 silent clients -> {} in {took:?}",
        r.status
    );
    // Served in turn it would wait 4 s. Connections that waited past the read timeout are
    // answered 503 at once instead, so this one is served (or refused) within about 1 s.
    assert!(matches!(r.status, 200 | 503), "{}", r.body);
    assert!(took < Duration::from_millis(2500), "{took:?}");
    drop(silent);
    dash.shutdown();
}

#[test]
fn without_auth_only_requests_to_an_address_or_localhost_are_answered() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let dash = dashboard(&app);
    let raw = |host: &str| -> Resp {
        let mut s = TcpStream::connect(dash.addr()).unwrap();
        s.write_all(format!("GET /jobs HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
            .unwrap();
        read_response(&mut s)
    };
    // A rebinding page would send its own host name.
    let r = raw("evil.example:8080");
    assert_eq!(r.status, 403);
    assert!(r.body.contains("POSTPONE_DASHBOARD_TOKEN"), "{}", r.body);
    assert_eq!(
        raw(&format!("localhost:{}", dash.addr().port())).status,
        200
    );
    assert_eq!(raw(&dash.addr().to_string()).status, 200);
    dash.shutdown();

    let guarded = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .auth(Some(DashboardAuth::Token("t".into())))
        .spawn()
        .unwrap();
    let mut s = TcpStream::connect(guarded.addr()).unwrap();
    s.write_all(b"GET /jobs HTTP/1.1\r\nHost: dash.example\r\nAuthorization: Bearer t\r\n\r\n")
        .unwrap();
    assert_eq!(
        read_response(&mut s).status,
        200,
        "a host name is fine with auth"
    );
    guarded.shutdown();
}

#[test]
fn the_abort_button_stops_a_running_job() {
    use postpone::{Job, TaskError, Tasks, Worker};
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let mut tasks = Tasks::new();
    tasks.register("spin", |job: &Job| -> Result<(), TaskError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !job.should_abort() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    });
    let id = app.defer("spin", &json!({})).unwrap();
    let worker = Worker::builder(&app, tasks).spawn().unwrap();
    assert!(wait_until(Duration::from_secs(20), || status_of(&app, id) == "doing"));
    let dash = dashboard(&app);
    let page = get(dash.addr(), &format!("/jobs/{id}"));
    assert!(page.body.contains("id=\"abort\"") && !page.body.contains("id=\"cancel\""));
    let r = request(
        dash.addr(),
        "POST",
        &format!("/jobs/{id}/abort"),
        &[("Content-Type", "application/x-www-form-urlencoded")],
        &format!("csrf={}&go=1", csrf_of(&page.body)),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(
        r.header("location"),
        Some(format!("/jobs/{id}?done=abort-requested").as_str())
    );
    assert!(wait_until(Duration::from_secs(10), || status_of(&app, id) == "aborted"));
    let after = get(dash.addr(), &format!("/jobs/{id}"));
    assert!(after.body.contains("s-aborted") && !after.body.contains("id=\"abort\""));
    dash.shutdown();
    assert!(worker.shutdown(Duration::from_secs(5)).is_clean());
}

/// A task that panics two calls deep, so its frames have names to find.
#[inline(never)]
fn resize_image_deep(n: u32) -> u32 {
    if n > 0 {
        panic!("image {n} too large: <b>kaput</b>");
    }
    n
}

#[test]
fn a_panic_shows_its_backtrace_collapsed_on_the_job_page() {
    use postpone::{Job, JobStatus, RetryStrategy, TaskError, Tasks, Worker};
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let mut tasks = Tasks::new();
    tasks
        .register("resize", |job: &Job| -> Result<(), TaskError> {
            let n: u32 = job.args()?;
            resize_image_deep(std::hint::black_box(n));
            Ok(())
        })
        .retry(RetryStrategy::fixed(Duration::from_millis(10), 1));
    let id = app.defer("resize", &7).unwrap();
    let worker = Worker::builder(&app, tasks).spawn().unwrap();
    let result = app.wait(id, Duration::from_secs(30)).unwrap();
    assert!(worker.shutdown(Duration::from_secs(5)).is_clean());
    assert_eq!(result.status, JobStatus::Failed, "{result:?}");
    // Recorded with the error: the message first, then the task's own frames.
    let detail = app.admin().job(id).unwrap();
    let e = &detail.errors[0];
    assert_eq!(
        e.message(),
        "task panicked: image 7 too large: <b>kaput</b>"
    );
    let bt = e
        .backtrace()
        .unwrap_or_else(|| panic!("no backtrace in {:?}", e.error));
    assert!(bt.contains("resize_image_deep"), "{bt}");
    assert!(
        !bt.contains("rust_panic_with_hook"),
        "panic machinery kept: {bt}"
    );
    assert!(e.error.len() <= 16 * 1024, "{}", e.error.len());
    // The page shows the message, and the backtrace collapsed under it.
    let dash = dashboard(&app);
    let page = get(dash.addr(), &format!("/jobs/{id}"));
    assert_eq!(page.status, 200);
    assert!(
        page.body
            .contains("<pre>task panicked: image 7 too large: &lt;b&gt;kaput&lt;/b&gt;</pre>"),
        "{}",
        page.body
    );
    let at = page
        .body
        .find("<details class=\"backtrace\"><summary>Backtrace</summary><pre>")
        .unwrap_or_else(|| panic!("no collapsed backtrace in {}", page.body));
    assert!(page.body[at..].contains("resize_image_deep"));
    assert!(!page.body.contains("<details class=\"backtrace\" open"));
    // The list shows the message only.
    let list = get(dash.addr(), "/jobs");
    assert!(list.body.contains("image 7 too large"));
    assert!(!list.body.contains("resize_image_deep"));
    dash.shutdown();
}

#[test]
fn schedules_given_by_the_program_show_their_exact_next_instant() {
    use std::time::{SystemTime, UNIX_EPOCH};
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let mut tasks = postpone::Tasks::new();
    tasks.register(
        "report",
        |_: &postpone::Job| -> Result<(), postpone::TaskError> { Ok(()) },
    );
    tasks.periodic("report", "0 0 1 1 *").id("<yearly>");
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .schedules(&tasks)
        .spawn()
        .unwrap();
    let page = get(dash.addr(), "/periodic");
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("<code>0 0 1 1 *</code>"),
        "{}",
        page.body
    );
    assert!(page.body.contains("&lt;yearly&gt;") && page.body.contains("none yet"));
    // The next 1 January, 00:00 UTC.
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let year = 1970 + secs / 31_556_952;
    // (The year is approximate within hours of New Year: accept either neighbour.)
    let found = [year, year + 1, year + 2]
        .iter()
        .any(|y| page.body.contains(&format!("{y}-01-01 00:00:00 UTC")));
    assert!(found, "no next 1 January near {year} in {}", page.body);
    dash.shutdown();
}

#[test]
fn stored_schedules_are_paused_and_resumed_from_the_periodic_page_with_the_same_guards() {
    init_logging();
    let db = TestDb::new();
    let app = web_util::app(&db);
    let admin = app.admin();
    admin
        .set_schedule(
            &postpone::NewSchedule::new("report", "0 9 * * *")
                .id("<p>")
                .time_zone("Europe/Paris"),
        )
        .unwrap();
    // The program's schedule with the same task and id is shown once, as the stored one.
    let mut tasks = postpone::Tasks::new();
    tasks.register(
        "report",
        |_: &postpone::Job| -> Result<(), postpone::TaskError> { Ok(()) },
    );
    tasks.periodic("report", "0 0 1 1 *").id("<p>");
    tasks.periodic("report", "@hourly").id("code");
    let dash = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .schedules(&tasks)
        .spawn()
        .unwrap();
    let addr = dash.addr();
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let page = get(addr, "/periodic").body;
    assert_inert(&page);
    assert!(
        page.contains("<code>0 9 * * *</code><br><span class=\"dim\">Europe/Paris</span>"),
        "{page}"
    );
    assert!(
        !page.contains("0 0 1 1 *"),
        "the replaced code schedule is listed: {page}"
    );
    assert!(
        page.contains("<code>@hourly</code>") && page.contains(">code</td>"),
        "{page}"
    );
    assert_eq!(
        page.matches("action=\"/periodic/pause\"").count(),
        1,
        "{page}"
    );
    assert!(page.contains("value=\"&lt;p&gt;\""), "{page}");
    let token = csrf_of(&page);
    let body = |extra: &str| format!("task=report&id=%3Cp%3E&{extra}");

    assert_eq!(get(addr, "/periodic/pause").status, 405);
    let r = request(addr, "POST", "/periodic/pause", &form, &body("csrf=wrong"));
    assert_eq!(r.status, 403);
    let cross = [form[0], ("Origin", "http://evil.example")];
    let r = request(
        addr,
        "POST",
        "/periodic/pause",
        &cross,
        &body(&format!("csrf={token}")),
    );
    assert_eq!(r.status, 403);
    assert!(!admin.schedule("report", "<p>").unwrap().is_paused());

    let r = request(
        addr,
        "POST",
        "/periodic/pause",
        &form,
        &body(&format!("csrf={token}")),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/periodic?done=paused"));
    assert!(admin.schedule("report", "<p>").unwrap().is_paused());
    let page = get(addr, "/periodic?done=paused").body;
    assert!(page.contains("Schedule paused"), "{page}");
    assert!(
        page.contains("database <strong class=\"err\">paused</strong>"),
        "{page}"
    );
    assert!(page.contains(">Resume</button>"), "{page}");

    let r = request(
        addr,
        "POST",
        "/periodic/resume",
        &form,
        &body(&format!("csrf={token}")),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(!admin.schedule("report", "<p>").unwrap().is_paused());

    // A missing schedule is a 404, an unknown action too.
    let r = request(
        addr,
        "POST",
        "/periodic/pause",
        &form,
        &format!("task=nope&csrf={token}"),
    );
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("no stored schedule"), "{}", r.body);
    let r = request(
        addr,
        "POST",
        "/periodic/drop",
        &form,
        &body(&format!("csrf={token}")),
    );
    assert_eq!(r.status, 404);
    dash.shutdown();

    let ro = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .read_only(true)
        .spawn()
        .unwrap();
    let page = get(ro.addr(), "/periodic").body;
    assert!(page.contains("0 9 * * *"), "{page}");
    assert!(
        !page.contains("/periodic/pause") && !page.contains("<th>Action</th>"),
        "buttons in read-only mode: {page}"
    );
    let r = request(
        ro.addr(),
        "POST",
        "/periodic/pause",
        &form,
        &body(&format!("csrf={token}")),
    );
    assert_eq!(r.status, 403);
    assert!(!admin.schedule("report", "<p>").unwrap().is_paused());
    ro.shutdown();
}

/// A schedule is stored and deleted from the periodic page, behind the same guards as every
/// change; bad inputs come back as the admin API's errors, and nothing is stored by them.
#[test]
fn stored_schedules_are_created_and_deleted_from_the_periodic_page() {
    init_logging();
    let db = TestDb::new();
    let app = web_util::app(&db);
    let admin = app.admin();
    let dash = dashboard(&app);
    let addr = dash.addr();
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let page = get(addr, "/periodic").body;
    assert!(page.contains("action=\"/periodic/create\""), "{page}");
    let token = csrf_of(&page);
    let create = |fields: &str, csrf: &str| {
        request(
            addr,
            "POST",
            "/periodic/create",
            &form,
            &format!("{fields}&csrf={csrf}"),
        )
    };
    let fields = "task=report&id=paris&cron=0+9+*+*+MON-FRI&time_zone=Europe%2FParis\
                  &queue=reports&args=%7B%22office%22%3A+%22paris%22%7D";

    // The guards: a wrong token or another origin changes nothing.
    assert_eq!(create(fields, "wrong").status, 403);
    let cross = [form[0], ("Origin", "http://evil.example")];
    let r = request(
        addr,
        "POST",
        "/periodic/create",
        &cross,
        &format!("{fields}&csrf={token}"),
    );
    assert_eq!(r.status, 403);
    assert!(admin.schedules().unwrap().is_empty());

    let r = create(fields, &token);
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/periodic?done=created"));
    let s = admin.schedule("report", "paris").unwrap();
    assert_eq!(s.cron, "0 9 * * MON-FRI");
    assert_eq!(s.time_zone.as_deref(), Some("Europe/Paris"));
    assert_eq!(s.queue.as_deref(), Some("reports"));
    assert_eq!(s.args.get(), r#"{"office": "paris"}"#);
    let page = get(addr, "/periodic?done=created").body;
    assert!(page.contains("Schedule stored"), "{page}");
    assert!(page.contains("<code>0 9 * * MON-FRI</code>"), "{page}");
    assert!(page.contains(">Delete</button>"), "{page}");

    // Storing it again, a bad expression, a bad zone, arguments that are not JSON, no
    // expression: clear errors, and the stored schedule is unchanged.
    let r = create(fields, &token);
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("exists already"), "{}", r.body);
    for (bad, says) in [
        ("task=report&id=x&cron=61+*+*+*+*", "cron"),
        (
            "task=report&id=x&cron=%40daily&time_zone=Mars%2FOlympus",
            "Mars/Olympus",
        ),
        ("task=report&id=x&cron=%40daily&args=%7Bnope", "not JSON"),
        ("task=report&id=x&cron=", "no schedule"),
        ("id=x&cron=%40daily", "no task"),
    ] {
        let r = create(bad, &token);
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert!(r.body.contains(says), "{bad}: {}", r.body);
    }
    assert_eq!(admin.schedules().unwrap().len(), 1);

    let delete = format!("task=report&id=paris&csrf={token}");
    let r = request(addr, "POST", "/periodic/delete", &form, &delete);
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/periodic?done=deleted"));
    assert!(admin.schedules().unwrap().is_empty());
    let page = get(addr, "/periodic?done=deleted").body;
    assert!(page.contains("Schedule deleted"), "{page}");
    let r = request(addr, "POST", "/periodic/delete", &form, &delete);
    assert_eq!(r.status, 404, "{}", r.body);
    dash.shutdown();

    // Read-only: no form, and a post is refused.
    let ro = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .read_only(true)
        .spawn()
        .unwrap();
    let page = get(ro.addr(), "/periodic").body;
    assert!(!page.contains("/periodic/create"), "{page}");
    let r = request(
        ro.addr(),
        "POST",
        "/periodic/create",
        &form,
        &format!("{fields}&csrf={token}"),
    );
    assert_eq!(r.status, 403);
    assert!(admin.schedules().unwrap().is_empty());
    ro.shutdown();
}

#[test]
fn queues_are_paused_and_resumed_from_the_overview_with_the_same_guards() {
    init_logging();
    let db = TestDb::new();
    let app = web_util::app(&db);
    app.job("t").queue("emails").defer(&1).unwrap();
    app.job("t").queue("reports").defer(&2).unwrap();
    let dash = dashboard(&app);
    let addr = dash.addr();
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let page = get(addr, "/").body;
    assert!(!page.contains("paused"), "nothing paused yet");
    assert!(page.contains("action=\"/queues/pause\""), "pause buttons");
    let token = csrf_of(&page);

    assert_eq!(get(addr, "/queues/pause").status, 405);
    let r = request(
        addr,
        "POST",
        "/queues/pause",
        &form,
        "queue=emails&csrf=wrong",
    );
    assert_eq!(r.status, 403);
    assert!(app.admin().paused().unwrap().is_empty());

    let r = request(
        addr,
        "POST",
        "/queues/pause",
        &form,
        &format!("queue=emails&csrf={token}"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/"));
    let p = app.admin().paused().unwrap();
    assert!(p.is_paused("emails") && !p.is_paused("reports"));
    let page = get(addr, "/").body;
    assert_eq!(
        page.matches("<span class=\"err\">paused</span>").count(),
        1,
        "{page}"
    );
    assert!(page.contains(">Resume</button>"), "{page}");

    // Every queue, then resume every queue.
    let r = request(
        addr,
        "POST",
        "/queues/pause",
        &form,
        &format!("csrf={token}"),
    );
    assert_eq!(r.status, 303);
    let page = get(addr, "/").body;
    assert!(page.contains("Every queue is paused"), "{page}");
    assert_eq!(page.matches("<span class=\"err\">paused</span>").count(), 2);
    let r = request(
        addr,
        "POST",
        "/queues/resume",
        &form,
        &format!("csrf={token}"),
    );
    assert_eq!(r.status, 303);
    assert!(app.admin().paused().unwrap().is_empty());

    // Bad input is a clear 400, and unknown actions a 404.
    let r = request(
        addr,
        "POST",
        "/queues/pause",
        &form,
        &format!("queue=&csrf={token}"),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("queue must not be empty"), "{}", r.body);
    let r = request(
        addr,
        "POST",
        "/queues/drain",
        &form,
        &format!("csrf={token}"),
    );
    assert_eq!(r.status, 404);
    dash.shutdown();

    let ro = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .read_only(true)
        .spawn()
        .unwrap();
    let page = get(ro.addr(), "/").body;
    assert!(!page.contains("/queues/pause"), "buttons in read-only mode");
    let r = request(
        ro.addr(),
        "POST",
        "/queues/pause",
        &form,
        &format!("queue=emails&csrf={token}"),
    );
    assert_eq!(r.status, 403);
    assert!(app.admin().paused().unwrap().is_empty());
    ro.shutdown();
}

/// A job's output and its latest progress (issue 14) are shown on its page, escaped.
#[test]
fn a_jobs_output_and_progress_are_shown_on_its_page() {
    init_logging();
    let db = TestDb::new();
    let fx = Fixture::new(&db);
    db.client()
        .execute(
            "UPDATE postpone_jobs SET output = '{\"size\": [640, 480], \"note\": \"<b>x</b>\"}',
                    progress = '{\"done\": 3, \"of\": 7}', progress_at = now()
              WHERE id = $1",
            &[&fx.ok.0],
        )
        .unwrap();
    let dash = dashboard(&fx.app);
    let page = get(dash.addr(), &format!("/jobs/{}", fx.ok));
    assert_eq!(page.status, 200, "{}", page.body);
    assert_inert(&page.body);
    assert!(page.body.contains("<h2>Output</h2>"), "{}", page.body);
    assert!(page.body.contains("&lt;b&gt;x&lt;/b&gt;"), "{}", page.body);
    assert!(page.body.contains("&quot;done&quot;: 3"), "{}", page.body);
    // The heading's time is an element, not its markup shown as text (the old pages
    // escaped it twice and printed `<time datetime=...>`).
    let at = page
        .body
        .find("id=\"progress-heading\"")
        .expect("a progress heading");
    let heading = &page.body[at..at + page.body[at..].find("</h2>").unwrap()];
    assert!(
        heading.contains("<small>(at <time datetime=\""),
        "{heading}"
    );
    assert!(!heading.contains("&lt;"), "markup shown as text: {heading}");
}

/// Ids of the jobs a list page shows, in order.
fn listed(body: &str) -> Vec<i64> {
    let Some(table) = body.find("<table id=\"jobs\"") else {
        return Vec::new();
    };
    let table = &body[table..table + body[table..].find("</table>").unwrap()];
    table
        .split("<td class=\"n\"><a href=\"/jobs/")
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].parse().unwrap())
        .collect()
}

#[test]
fn the_jobs_list_filters_counts_and_shows_errors_tags_and_durations() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let mk = |task: &str, args: serde_json::Value, tags: &[&str]| -> i64 {
        let tags: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
        let job = NewJob::new(task, &args).unwrap().queue("mail").tags(&tags);
        app.defer_batch(&[job]).unwrap()[0].get()
    };
    let timeout_a = mk("send", json!({"user": 1, "to": "a"}), &["vip"]);
    let timeout_b = mk("send", json!({"user": 2, "to": "b"}), &[]);
    let other = mk("send", json!({"user": 1, "to": "c"}), &["vip", "eu"]);
    let ok = mk("report", json!({"user": 3}), &[]);
    let waiting = mk("report", json!(null), &[]);
    let mut c = db.client();
    // Outcomes written as a worker records them: errors, start and finish times.
    c.execute(
        "UPDATE postpone_jobs SET status = 'failed', attempts = 1,
                started_at = now() - interval '95 seconds', finished_at = now() - interval '5 seconds',
                errors = jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(),
                         'error', 'smtp: Connection TIMEOUT after 30s'))
          WHERE id = ANY($1)",
        &[&vec![timeout_a, timeout_b]],
    )
    .unwrap();
    c.execute(
        "UPDATE postpone_jobs SET status = 'failed', attempts = 1, started_at = now(),
                finished_at = now(), errors = '[{\"attempt\": 1, \"error\": \"refused\"}]'
          WHERE id = $1",
        &[&other],
    )
    .unwrap();
    c.execute(
        "UPDATE postpone_jobs SET status = 'succeeded', attempts = 1,
                started_at = now() - interval '2 seconds', finished_at = now()
          WHERE id = $1",
        &[&ok],
    )
    .unwrap();
    let dash = dashboard(&app);
    let addr = dash.addr();

    let all = get(addr, "/jobs");
    assert_eq!(all.status, 200, "{}", all.body);
    assert_eq!(
        listed(&all.body),
        vec![waiting, ok, other, timeout_b, timeout_a]
    );
    assert!(all.body.contains("5 jobs match"), "{}", all.body);
    // The last error, the tags and the duration of a finished attempt are columns.
    assert!(all.body.contains("smtp: Connection TIMEOUT after 30s"));
    assert!(all.body.contains("href=\"/jobs?tag=vip\""), "{}", all.body);
    assert!(
        all.body.contains(">1m 30s<"),
        "no duration of 1m 30s: {}",
        all.body
    );

    let cases: &[(&str, Vec<i64>)] = &[
        ("status=failed", vec![other, timeout_b, timeout_a]),
        ("status=failed&error=timeout", vec![timeout_b, timeout_a]),
        ("tag=vip", vec![other, timeout_a]),
        ("tag=vip,eu", vec![other]),
        ("args=%7B%22user%22%3A%201%7D", vec![other, timeout_a]),
        ("task=report&queue=mail", vec![waiting, ok]),
        ("since=1h", vec![waiting, ok, other, timeout_b, timeout_a]),
        ("to=2000-01-01T00:00", vec![]),
        ("from=2000-01-01&status=succeeded", vec![ok]),
        ("status=failed,cancelled,aborted&tag=eu", vec![other]),
    ];
    for (q, want) in cases {
        let page = get(addr, &format!("/jobs?{q}"));
        assert_eq!(page.status, 200, "{q}: {}", page.body);
        assert_eq!(&listed(&page.body), want, "{q}");
        let count = match want.len() {
            1 => "1 job matches".to_owned(),
            n => format!("{n} jobs match"),
        };
        assert!(page.body.contains(&count), "{q}: no {count:?}");
    }
    // Input that cannot be read is a 400 naming the field, escaped.
    let bad = get(addr, "/jobs?args=%7Bnot%20json%3Cb%3E");
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("arguments filter"), "{}", bad.body);
    assert!(!bad.body.contains("<b>"));
    assert_eq!(get(addr, "/jobs?from=yesterday").status, 400);
    assert_eq!(get(addr, "/jobs?since=forever").status, 400);
    dash.shutdown();
}

#[test]
fn bulk_actions_show_the_count_first_and_change_only_what_matches() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let ids: Vec<i64> = (0..5)
        .map(|n| app.defer("send", &json!({ "n": n })).unwrap().get())
        .collect();
    let mut c = db.client();
    // Three failed with a timeout, one with another error, one waiting.
    c.execute(
        "UPDATE postpone_jobs SET status = 'failed', finished_at = now(), attempts = 1,
                errors = jsonb_build_array(jsonb_build_object('attempt', 1,
                         'error', CASE WHEN id = $2 THEN 'refused' ELSE 'timeout' END))
          WHERE id = ANY($1)",
        &[&ids[..4].to_vec(), &ids[3]],
    )
    .unwrap();
    let dash = dashboard(&app);
    let addr = dash.addr();
    let page = get(addr, "/jobs?status=failed&error=timeout");
    assert!(page.body.contains("3 jobs match"), "{}", page.body);
    assert!(page.body.contains("id=\"bulk-retry\""), "{}", page.body);
    // No bulk form without a filter: the admin API refuses to touch every job.
    assert!(!get(addr, "/jobs").body.contains("id=\"bulk-retry\""));
    let token = csrf_of(&page.body);
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let statuses = || -> Vec<String> {
        ids.iter()
            .map(|id| status_of(&app, JobId::from(*id)))
            .collect()
    };
    let before = statuses();

    // The first click is a dry run: the counts, a confirm button, nothing changed.
    let body = format!("status=failed&error=timeout&action=retry&csrf={token}");
    let plan = request(addr, "POST", "/jobs/bulk", &form, &body);
    assert_eq!(plan.status, 200, "{}", plan.body);
    assert!(
        plan.body
            .contains("3 job(s) match the filter now; <strong>3 would be retried</strong>"),
        "{}",
        plan.body
    );
    assert!(plan.body.contains("id=\"confirm\""), "{}", plan.body);
    assert_eq!(statuses(), before, "a dry run changed jobs");

    // Without the form token, or read-only: refused.
    let r = request(
        addr,
        "POST",
        "/jobs/bulk",
        &form,
        &format!("{body}&confirm=1").replace(&token, "x"),
    );
    assert_eq!(r.status, 403);
    assert_eq!(statuses(), before);

    let done = request(
        addr,
        "POST",
        "/jobs/bulk",
        &form,
        &format!("{body}&confirm=1"),
    );
    assert_eq!(done.status, 303, "{}", done.body);
    let to = done.header("location").unwrap().to_owned();
    assert!(to.contains("bulk=retry&changed=3&skipped=0"), "{to}");
    let after = statuses();
    assert_eq!(
        after,
        ["todo", "todo", "todo", "failed", "todo"],
        "{after:?}"
    );
    let shown = get(addr, &to);
    assert!(
        shown.body.contains("3 job(s) retried; 0 skipped"),
        "{}",
        shown.body
    );

    // Cancel and delete take the same path; an unknown action is a 400.
    let r = request(
        addr,
        "POST",
        "/jobs/bulk",
        &form,
        &format!("status=todo&action=cancel&confirm=1&csrf={token}"),
    );
    assert_eq!(r.status, 303);
    assert!(
        r.header("location")
            .unwrap()
            .contains("bulk=cancel&changed=4"),
        "{:?}",
        r.header("location")
    );
    let r = request(
        addr,
        "POST",
        "/jobs/bulk",
        &form,
        &format!("status=cancelled&action=delete&confirm=1&csrf={token}"),
    );
    assert_eq!(r.status, 303);
    let n: i64 = c
        .query_one("SELECT count(*) FROM postpone_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "only the job failed with another error is left");
    let r = request(
        addr,
        "POST",
        "/jobs/bulk",
        &form,
        &format!("status=todo&action=drop&csrf={token}"),
    );
    assert_eq!(r.status, 400);
    dash.shutdown();

    let ro = Dashboard::new(&app)
        .listen("127.0.0.1:0")
        .unwrap()
        .read_only(true)
        .spawn()
        .unwrap();
    let page = get(ro.addr(), "/jobs?status=failed");
    assert!(
        !page.body.contains("bulk-retry"),
        "bulk buttons in read-only mode"
    );
    let r = request(
        ro.addr(),
        "POST",
        "/jobs/bulk",
        &form,
        &format!("status=failed&action=retry&confirm=1&csrf={token}"),
    );
    assert_eq!(r.status, 403);
    assert_eq!(status_of(&app, JobId::from(ids[3])), "failed");
    ro.shutdown();
}

#[test]
fn the_workers_page_shows_what_runs_now_and_requeues_and_forgets_stalled_workers() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let ids: Vec<i64> = (0..4)
        .map(|n| app.defer("work", &json!({ "n": n })).unwrap().get())
        .collect();
    let mut c = db.client();
    let live: i64 = c
        .query_one(
            "INSERT INTO postpone_workers (name, concurrency, last_heartbeat)
             VALUES ('live-one', 2, now()) RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let dead: i64 = c
        .query_one(
            "INSERT INTO postpone_workers (name, concurrency, last_heartbeat)
             VALUES ('dead-one', 2, now() - interval '1 hour') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    // The live worker runs one job and holds another it has not started; the dead one
    // ran two.
    c.execute(
        "UPDATE postpone_jobs SET status = 'doing', worker_id = $2, attempts = 1,
                started_at = CASE WHEN id = $3 THEN now() - interval '65 seconds' END
          WHERE id = ANY($1)",
        &[&ids[..2].to_vec(), &live, &ids[0]],
    )
    .unwrap();
    c.execute(
        "UPDATE postpone_jobs SET status = 'doing', worker_id = $2, attempts = 1, started_at = now()
          WHERE id = ANY($1)",
        &[&ids[2..].to_vec(), &dead],
    )
    .unwrap();
    let dash = dashboard(&app);
    let addr = dash.addr();
    let page = get(addr, "/workers");
    assert_eq!(page.status, 200, "{}", page.body);
    let row = |name: &str| -> String {
        let at = page
            .body
            .find(&format!(">{name}<"))
            .unwrap_or_else(|| panic!("no {name}"));
        page.body[at..at + page.body[at..].find("</tr>").unwrap()].to_owned()
    };
    let live_row = row("live-one");
    assert!(
        live_row.contains(&format!("href=\"/jobs/{}\"", ids[0])),
        "{live_row}"
    );
    assert!(
        !live_row.contains(&format!("href=\"/jobs/{}\"", ids[1])),
        "a held job shown running: {live_row}"
    );
    assert!(live_row.contains("for 1m 05s"), "{live_row}");
    assert!(
        live_row.contains("<td class=\"n\">1</td><td>"),
        "one waiting: {live_row}"
    );
    assert!(row("dead-one").contains("stalled"));
    // A held job's own page and the list call it waiting, not running.
    let running = get(addr, "/jobs?status=doing").body;
    assert!(
        running.contains(&format!("href=\"/jobs/{}\"", ids[0]))
            && !running.contains(&format!("href=\"/jobs/{}\"", ids[1])),
        "running jobs only: {running}"
    );
    let waiting = get(addr, "/jobs?status=todo").body;
    assert!(
        waiting.contains(&format!("href=\"/jobs/{}\"", ids[1])),
        "a held job waits: {waiting}"
    );
    assert!(get(addr, &format!("/jobs/{}", ids[1]))
        .body
        .contains(">waiting</span>"));
    assert!(!get(addr, &format!("/jobs/{}", ids[0]))
        .body
        .contains(">waiting</span>"));

    let token = csrf_of(&page.body);
    assert!(
        page.body
            .contains("Requeue the 2 job(s) of stalled workers"),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("Forget the 1 stalled worker(s)"),
        "{}",
        page.body
    );
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let r = request(addr, "POST", "/workers/requeue", &form, "csrf=wrong");
    assert_eq!(r.status, 403);
    let r = request(
        addr,
        "POST",
        "/workers/requeue",
        &form,
        &format!("csrf={token}"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/workers?done=requeued-2"));
    assert_eq!(status_of(&app, JobId::from(ids[2])), "todo");
    assert_eq!(
        status_of(&app, JobId::from(ids[0])),
        "doing",
        "the live worker's job kept"
    );
    assert!(get(addr, "/workers?done=requeued-2")
        .body
        .contains("2 stalled job(s) requeued."));
    let r = request(
        addr,
        "POST",
        "/workers/forget",
        &form,
        &format!("csrf={token}"),
    );
    assert_eq!(r.header("location"), Some("/workers?done=forgotten-1"));
    let names: Vec<String> = app
        .admin()
        .workers()
        .unwrap()
        .into_iter()
        .map(|w| w.name)
        .collect();
    assert_eq!(names, ["live-one"]);
    dash.shutdown();
}

#[test]
fn the_live_script_is_served_and_the_csp_allows_only_it() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let dash = dashboard(&app);
    let page = get(dash.addr(), "/");
    let csp = page.header("content-security-policy").unwrap().to_owned();
    let script_src: Vec<&str> = csp
        .split(';')
        .map(str::trim)
        .filter(|d| d.starts_with("script-src"))
        .collect();
    assert_eq!(script_src, ["script-src 'self'"], "{csp}");
    // Without script, the overview reloads itself.
    assert!(
        page.body.contains("<noscript><meta http-equiv=\"refresh\""),
        "{}",
        page.body
    );
    assert!(page.body.contains("data-live=\"overview\""));
    let js = get(dash.addr(), "/static/live.js");
    assert_eq!(js.status, 200);
    assert_eq!(
        js.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert!(js.body.contains("data-live") && js.body.contains("localStorage"));
    dash.shutdown();
}

#[test]
fn finished_jobs_are_rolled_up_per_statement_and_charted_per_outcome_queue_and_wait() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let mut c = db.client();
    let ids: Vec<i64> = (0..6)
        .map(|n| {
            app.job("t")
                .queue(if n < 4 { "mail" } else { "<b>reports</b>" })
                .defer(&json!({ "n": n }))
                .unwrap()
                .get()
        })
        .collect();
    // Started 1 s (four jobs) and 100 ms (two) after they were due, then finished by one
    // statement each: 3 succeeded and 1 failed in mail, 2 succeeded in reports.
    c.execute(
        "UPDATE postpone_jobs SET status = 'doing', attempts = 1,
                started_at = scheduled_at + CASE WHEN queue = 'mail' THEN interval '1 second'
                                                 ELSE interval '100 milliseconds' END",
        &[],
    )
    .unwrap();
    c.execute(
        "UPDATE postpone_jobs SET finished_at = now(),
                status = CASE WHEN id = $1 THEN 'failed' ELSE 'succeeded' END
          WHERE id = ANY($2)",
        &[&ids[0], &ids[..4].to_vec()],
    )
    .unwrap();
    // Deleted while running by the outcome statement of a worker that deletes what succeeds
    // (it counts the jobs it deletes; the statistics' trigger counts updates).
    c.execute(
        "SELECT count(*) FROM postpone_finish($1::bigint[], ARRAY[NULL, NULL]::bigint[],
                                              ARRAY[1, 1], ARRAY['delete', 'delete'],
                                              NULL, NULL, NULL)",
        &[&ids[4..].to_vec()],
    )
    .unwrap();
    assert_eq!(
        c.query_one(
            "SELECT count(*) FROM postpone_jobs WHERE id = ANY($1)",
            &[&ids[4..].to_vec()]
        )
        .unwrap()
        .get::<_, i64>(0),
        0
    );
    let rows: Vec<(String, String, String, i64)> = c
        .query(
            "SELECT span, queue, outcome, sum(jobs)::bigint FROM postpone_stats
              GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let want: Vec<(String, String, String, i64)> = ["hour", "minute"]
        .iter()
        .flat_map(|span| {
            [
                ("<b>reports</b>", "succeeded", 2),
                ("mail", "failed", 1),
                ("mail", "succeeded", 3),
            ]
            .map(|(q, o, n)| (span.to_string(), q.to_owned(), o.to_owned(), n))
        })
        .collect();
    assert_eq!(rows, want);
    // A claim, a retry or a heartbeat writes nothing.
    app.defer("t", &json!(1)).unwrap();
    c.execute(
        "UPDATE postpone_jobs SET status = 'doing', started_at = now()",
        &[],
    )
    .unwrap();
    c.execute(
        "UPDATE postpone_jobs SET status = 'todo', started_at = NULL",
        &[],
    )
    .unwrap();
    let n: i64 = c
        .query_one("SELECT sum(jobs)::bigint FROM postpone_stats", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 12);

    let dash = dashboard(&app);
    let page = get(dash.addr(), "/");
    assert_eq!(page.status, 200, "{}", page.body);
    let body = &page.body;
    assert!(body.contains("0 min ago: 5 succeeded"), "{body}");
    assert!(body.contains("0 min ago: 1 failed"), "{body}");
    assert!(body.contains("0 min ago: 4 mail"), "{body}");
    assert!(
        body.contains("0 min ago: 2 &lt;b&gt;reports&lt;/b&gt;"),
        "{body}"
    );
    // Four waits of 1 s and two of 100 ms: p50 and p99 in the bucket up to 1,024 ms.
    assert!(
        body.contains("p50 1.0s") && body.contains("p99 1.0s"),
        "{body}"
    );
    for range in ["day", "week"] {
        let page = get(dash.addr(), &format!("/?range={range}"));
        assert_eq!(page.status, 200);
        assert!(
            page.body.contains("0 h ago: 5 succeeded"),
            "{range}: {}",
            page.body
        );
    }
    let one = get(dash.addr(), "/?range=hour&queue=mail");
    assert!(one.body.contains("0 min ago: 3 succeeded"), "{}", one.body);
    assert_eq!(get(dash.addr(), "/?range=year").status, 400);
    dash.shutdown();
}

#[test]
fn the_rollup_prunes_what_is_past_its_span_when_an_hour_begins() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let mut c = db.client();
    c.batch_execute(
        "INSERT INTO postpone_stats (span, at, queue, outcome, shard, jobs) VALUES
           ('minute', date_trunc('minute', now()) - interval '3 hours', 'q', 'succeeded', 0, 1),
           ('minute', date_trunc('minute', now()) - interval '10 minutes', 'q', 'succeeded', 0, 1),
           ('hour', date_trunc('hour', now()) - interval '9 days', 'q', 'succeeded', 0, 1),
           ('hour', date_trunc('hour', now()) - interval '7 days', 'q', 'succeeded', 0, 1)",
    )
    .unwrap();
    let id = app.defer("t", &json!(1)).unwrap().get();
    c.execute(
        "UPDATE postpone_jobs SET status = 'doing', started_at = now() WHERE id = $1",
        &[&id],
    )
    .unwrap();
    // The first finish of this hour for its key inserts a fresh hour row: it prunes.
    c.execute(
        "UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE id = $1",
        &[&id],
    )
    .unwrap();
    let left: Vec<String> = c
        .query(
            "SELECT span || ' ' || (CASE WHEN at < now() - interval '1 hour' THEN 'old' ELSE 'new' END)
               FROM postpone_stats ORDER BY span, at",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["hour old", "hour new", "minute new", "minute new"]);
}

#[test]
fn the_handler_mounts_under_a_path_and_streams_downloads() {
    use postpone::DashboardRequest;
    use std::io::Read;
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let id = app
        .defer("t", &json!({"blob": "x".repeat(600_000)}))
        .unwrap();
    let handler = Dashboard::new(&app)
        .base_path("/admin/queue/")
        .handler()
        .unwrap();
    let get = |path: &str| {
        let resp =
            handler.handle(DashboardRequest::new("GET", path).header("Host", "localhost:3000"));
        let status = resp.status();
        let headers = resp.headers().to_vec();
        let len = resp.len();
        let mut body = String::new();
        resp.into_body().read_to_string(&mut body).unwrap();
        assert_eq!(body.len() as u64, len);
        (status, headers, body)
    };
    let (status, headers, body) = get("/admin/queue/jobs");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!("href=\"/admin/queue/jobs/{id}\"")),
        "{body}"
    );
    assert!(body.contains("src=\"/admin/queue/static/live.js\""));
    assert!(headers
        .iter()
        .any(|(k, v)| k == "Content-Security-Policy" && v.contains("script-src 'self'")));
    let (status, _, page) = get(&format!("/admin/queue/jobs/{id}"));
    assert_eq!(status, 200);
    assert!(page.contains(&format!("href=\"/admin/queue/jobs/{id}/args.json\"")));
    let (status, _, raw) = get(&format!("/admin/queue/jobs/{id}/args.json"));
    assert_eq!(status, 200);
    assert_eq!(raw.len(), 600_000 + "{\"blob\":\"\"}".len());
    assert_eq!(
        get("/admin/queue").0,
        200,
        "the base path itself is the overview"
    );
    assert_eq!(get("/elsewhere/jobs").0, 404);
    assert_eq!(get("/admin/queueing").0, 404);
    // An action: the form token from a page, the redirect under the base path.
    let later = app
        .job("t")
        .schedule_in(Duration::from_secs(3600))
        .defer(&json!(1))
        .unwrap();
    let (_, _, page) = get(&format!("/admin/queue/jobs/{later}"));
    let resp = handler.handle(
        DashboardRequest::new("POST", &format!("/admin/queue/jobs/{later}/cancel"))
            .header("Host", "localhost:3000")
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(format!("csrf={}", csrf_of(&page)).into_bytes()),
    );
    assert_eq!(resp.status(), 303);
    let to = resp
        .headers()
        .iter()
        .find(|(k, _)| k == "Location")
        .unwrap()
        .1
        .clone();
    assert_eq!(to, format!("/admin/queue/jobs/{later}?done=cancelled"));
    assert_eq!(status_of(&app, later), "cancelled");
    // Without auth of its own, a host name is refused unless the host guards access.
    let named =
        handler.handle(DashboardRequest::new("GET", "/admin/queue/").header("Host", "ops.example"));
    assert_eq!(named.status(), 403);
    let trusting = Dashboard::new(&app)
        .base_path("/q")
        .any_host(true)
        .handler()
        .unwrap();
    let named =
        trusting.handle(DashboardRequest::new("GET", "/q/jobs").header("Host", "ops.example"));
    assert_eq!(named.status(), 200);
}

#[test]
fn a_waiting_dependent_shows_its_dependencies_not_a_time() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let a = app.defer("a", &()).unwrap();
    let b = app.job("b").after(&[a]).defer(&()).unwrap();
    let dash = dashboard(&app);
    let list = get(dash.addr(), "/jobs");
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(
        list.body.contains("after its dependencies"),
        "{}",
        list.body
    );
    assert!(!list.body.contains("infinity"), "{}", list.body);
    let page = get(dash.addr(), &format!("/jobs/{b}"));
    assert!(page.body.contains("id=\"dependencies\""), "{}", page.body);
    assert!(
        page.body
            .contains(&format!("/jobs/{a}\">job {a}</a> (todo)")),
        "{}",
        page.body
    );
    assert!(page.body.contains("waiting for them"), "{}", page.body);
    assert!(!page.body.contains("scheduled to run"), "{}", page.body);
    let page = get(dash.addr(), &format!("/jobs/{a}"));
    assert!(page.body.contains("id=\"dependents\""), "{}", page.body);
    let overview = get(dash.addr(), "/");
    assert!(
        overview.body.contains("1 after their dependencies"),
        "{}",
        overview.body
    );
}

#[test]
fn a_workflow_page_lists_its_jobs_with_states_and_dependencies_and_cancels_and_retries_it() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let mut wf = app.workflow("<b>nightly</b>");
    let a = wf.step(NewJob::new("a", &1).unwrap()).name("fetch").add();
    let b = wf.step(NewJob::new("b", &2).unwrap()).after([&a]).add();
    let c = wf.step(NewJob::new("c", &3).unwrap()).after([&a]).add();
    wf.step(NewJob::new("d", &4).unwrap()).after([&b, &c]).add();
    let run = wf.insert().unwrap();
    let [ja, jb, jc, jd] = [run.jobs[0], run.jobs[1], run.jobs[2], run.jobs[3]];
    db.client()
        .batch_execute(&format!(
            "UPDATE postpone_jobs SET status = 'doing', started_at = now() WHERE id = {ja};
             UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE id = {ja};
             UPDATE postpone_jobs SET status = 'doing', started_at = now() WHERE id = {jb};
             UPDATE postpone_jobs SET status = 'failed', finished_at = now() WHERE id = {jb};"
        ))
        .unwrap();
    let dash = dashboard(&app);
    let addr = dash.addr();
    let path = format!("/workflows/{}", run.id);
    let page = get(addr, &path);
    assert_eq!(page.status, 200, "{}", page.body);
    // The name is text, not markup.
    assert!(
        page.body.contains("&lt;b&gt;nightly&lt;/b&gt;"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("3 of 4 finished (1 failed, 1 cancelled, 0 aborted)"),
        "{}",
        page.body
    );
    let row = |id: JobId| -> String {
        let at = page
            .body
            .find(&format!("id=\"workflow-job-{id}\""))
            .unwrap_or_else(|| panic!("job {id} listed: {}", page.body));
        let rest = &page.body[at..];
        rest[..rest.find("</tr>").unwrap()].to_owned()
    };
    assert!(
        row(ja).contains(">fetch<") && row(ja).contains("succeeded"),
        "{}",
        row(ja)
    );
    assert!(row(jb).contains("failed"), "{}", row(jb));
    assert!(row(jc).contains("waiting"), "{}", row(jc));
    // c waits for a (which succeeded): it is released, not waiting for dependencies.
    assert!(!row(jc).contains("waiting for dependencies"), "{}", row(jc));
    assert!(
        row(jc).contains(&format!("/jobs/{ja}\">{ja}</a>")),
        "{}",
        row(jc)
    );
    // d was cancelled when b failed, and lists both of its dependencies.
    assert!(row(jd).contains("cancelled"), "{}", row(jd));
    for dep in [jb, jc] {
        assert!(
            row(jd).contains(&format!("/jobs/{dep}\">{dep}</a>")),
            "{}",
            row(jd)
        );
    }
    // A member's page links to its workflow.
    let job = get(addr, &format!("/jobs/{jb}"));
    assert!(
        job.body
            .contains(&format!("/workflows/{}\">workflow {}</a>", run.id, run.id)),
        "{}",
        job.body
    );

    // Retry, then cancel, through the buttons.
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let token = csrf_of(&page.body);
    assert!(page.body.contains("id=\"workflow-retry\""), "{}", page.body);
    let r = request(addr, "POST", &format!("{path}/retry"), &form, "csrf=wrong");
    assert_eq!(r.status, 403);
    let r = request(
        addr,
        "POST",
        &format!("{path}/retry"),
        &form,
        &format!("csrf={token}"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(
        (status_of(&app, jb), status_of(&app, jd)),
        ("todo".into(), "todo".into())
    );
    let page = get(addr, &format!("{path}?done=retried"));
    assert!(page.body.contains("Retried"), "{}", page.body);
    assert!(
        page.body.contains("waiting for dependencies"),
        "{}",
        page.body
    );
    let r = request(
        addr,
        "POST",
        &format!("{path}/cancel"),
        &form,
        &format!("csrf={token}"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    for j in [jb, jc, jd] {
        assert_eq!(status_of(&app, j), "cancelled");
    }
    assert_eq!(get(addr, "/workflows/999999").status, 404);
    assert_eq!(get(addr, "/workflows/x").status, 400);
    assert_eq!(get(addr, &format!("{path}/cancel")).status, 405);
}

#[test]
fn a_batch_page_shows_its_progress_and_its_jobs_link_to_it() {
    init_logging();
    let db = TestDb::new();
    let app = app(&db);
    let batch = app
        .batch()
        .on_complete(NewJob::new("report", &()).unwrap())
        .on_success(NewJob::new("notify", &()).unwrap())
        .defer(&[
            NewJob::new("a", &1).unwrap(),
            NewJob::new("a", &2).unwrap(),
            NewJob::new("a", &3).unwrap(),
        ])
        .unwrap();
    let (first, second) = (batch.jobs[0], batch.jobs[1]);
    db.client()
        .batch_execute(&format!(
            "UPDATE postpone_jobs SET status = 'doing', started_at = now() WHERE id = {first};
             UPDATE postpone_jobs SET status = 'succeeded', finished_at = now() WHERE id = {first};
             UPDATE postpone_jobs SET status = 'doing', started_at = now() WHERE id = {second};
             UPDATE postpone_jobs SET status = 'failed', finished_at = now() WHERE id = {second};"
        ))
        .unwrap();
    let dash = dashboard(&app);
    let page = get(dash.addr(), &format!("/batches/{}", batch.id));
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains(&format!("Batch {}", batch.id)),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("2 of 3 finished (1 failed, 0 cancelled, 0 aborted)"),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("id=\"batch-succeeded\">1<"),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("id=\"batch-waiting\">1<"),
        "{}",
        page.body
    );
    let oc = batch.on_complete.unwrap();
    let os = batch.on_success.unwrap();
    assert!(
        page.body
            .contains(&format!("/jobs/{oc}\">job {oc}</a> waiting for the batch")),
        "{}",
        page.body
    );
    // The failure cancelled on_success at once.
    assert!(
        page.body
            .contains(&format!("/jobs/{os}\">job {os}</a> cancelled")),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("http-equiv=\"refresh\""),
        "a running batch refreshes"
    );

    // A job of the batch, and a callback, link to it.
    let job = get(dash.addr(), &format!("/jobs/{}", batch.jobs[2]));
    assert!(job.body.contains("id=\"batch\""), "{}", job.body);
    assert!(
        job.body
            .contains(&format!("/batches/{}\">batch {}</a>", batch.id, batch.id)),
        "{}",
        job.body
    );
    let cb = get(dash.addr(), &format!("/jobs/{oc}"));
    assert!(
        cb.body.contains("this job is its on_complete callback"),
        "{}",
        cb.body
    );
    // A job outside a batch has no batch row, and its page costs no query for one.
    let lone = app.defer("a", &4).unwrap();
    let lone = get(dash.addr(), &format!("/jobs/{lone}"));
    assert!(!lone.body.contains("id=\"batch\""), "{}", lone.body);

    assert_eq!(get(dash.addr(), "/batches/999999").status, 404);
    assert_eq!(get(dash.addr(), "/batches/x").status, 400);
}
