//! Shared by the dashboard tests: a tiny HTTP/1.1 client (for the dashboard and for
//! chromedriver's WebDriver endpoint) and a database holding real jobs with hostile values.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use postpone::{App, Job, JobId, RetryStrategy, TaskError, Tasks, Worker, WorkerHandle};
use serde_json::json;

use crate::support::{wait_until, TestDb};

/// Values that break a page that forgets to escape them.
pub const HOSTILE_TASK: &str = "<script>window.pwned=1</script>\"'&task";
pub const HOSTILE_QUEUE: &str = "q\"><img src=x onerror=\"window.pwned=2\">";
pub const HOSTILE_LOCK: &str = "</td><script>window.pwned=3</script>";
pub const HOSTILE_ERROR: &str =
    "boom <script>window.pwned=4</script> \"double\" 'single' NUL:\0:end";
pub const HOSTILE_ARG: &str = "<script>window.pwned=5</script>";
pub const HOSTILE_HOST: &str = "<b>host</b>\"'";

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request on a fresh connection; the answer is read by Content-Length, chunks, or
/// to the end of the stream.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    read_response(&mut s)
}

pub fn read_response(s: &mut TcpStream) -> Resp {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = s.read(&mut chunk).expect("reading a response head");
        assert!(n > 0, "connection closed before a response head");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = buf[head_end + 4..].to_vec();
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    if let Some(len) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while body.len() < len {
            let n = s.read(&mut chunk).expect("reading a body");
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        body.truncate(len);
    } else {
        let _ = s.read_to_end(&mut body);
        if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            body = dechunk(&body);
        }
    }
    Resp {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(p) = raw.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&raw[..p])
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = p + 2;
        out.extend_from_slice(&raw[start..(start + size).min(raw.len())]);
        raw = &raw[(start + size + 2).min(raw.len())..];
    }
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], "")
}

/// The CSRF token of a page's forms.
pub fn csrf_of(page: &str) -> String {
    const FIELD: &str = "name=\"csrf\" value=\"";
    let at = page.find(FIELD).expect("a form with a csrf field");
    let rest = &page[at + FIELD.len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

pub fn app(db: &TestDb) -> App {
    let app = App::builder(db.url())
        .pool_size(4)
        .io_timeout(Duration::from_secs(5))
        .build()
        .expect("app");
    app.migrate().expect("migrate");
    app
}

/// A database with real jobs run by a real worker, several holding hostile values.
pub struct Fixture {
    pub app: App,
    pub worker: Option<WorkerHandle>,
    /// Failed once (hostile error); succeeds when retried.
    pub flaky: JobId,
    /// Failed, hostile task name and queue.
    pub hostile: JobId,
    /// Succeeded.
    pub ok: JobId,
    /// Waiting for an hour: to cancel.
    pub later: JobId,
}

pub fn status_of(app: &App, id: JobId) -> String {
    let mut c = app.connection().unwrap();
    c.query_one(
        "SELECT status FROM postpone_jobs WHERE id = $1",
        &[&id.get()],
    )
    .unwrap()
    .get(0)
}

impl Fixture {
    pub fn new(db: &TestDb) -> Fixture {
        let app = app(db);
        let failed_once = Arc::new(AtomicBool::new(false));
        let mut tasks = Tasks::new();
        let f = failed_once.clone();
        tasks
            .register("flaky", move |_job: &Job| -> Result<(), TaskError> {
                if f.swap(true, Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err(TaskError::fail(HOSTILE_ERROR))
                }
            })
            .retry(RetryStrategy::never());
        tasks
            .register(HOSTILE_TASK, |_job: &Job| -> Result<(), TaskError> {
                Err(TaskError::fail("hostile task fails: <i>italic?</i>"))
            })
            .retry(RetryStrategy::never());
        tasks.register("ok", |_job: &Job| -> Result<(), TaskError> { Ok(()) });

        let flaky = app
            .job("flaky")
            .queue("work")
            .lock(HOSTILE_LOCK)
            .defer(&json!({"html": HOSTILE_ARG, "quote": "\"'", "nested": {"n": [1, 2, 3]}}))
            .unwrap();
        let hostile = app
            .job(HOSTILE_TASK)
            .queue(HOSTILE_QUEUE)
            .defer(&json!({"x": HOSTILE_ARG}))
            .unwrap();
        let ok = app.job("ok").queue("work").defer(&json!(null)).unwrap();
        let later = app
            .job("ok")
            .queue("work")
            .schedule_in(Duration::from_secs(3600))
            .defer(&json!({"later": true}))
            .unwrap();
        let worker = Worker::builder(&app, tasks)
            .concurrency(2)
            .queues(["work", HOSTILE_QUEUE])
            .heartbeat_interval(Duration::from_secs(3600))
            .stalled_after(Duration::from_secs(7200))
            .spawn()
            .expect("worker");
        let spawned = std::time::Instant::now();
        assert!(
            wait_until(Duration::from_secs(30), || {
                status_of(&app, flaky) == "failed"
                    && status_of(&app, hostile) == "failed"
                    && status_of(&app, ok) == "succeeded"
            }),
            "the fixture's jobs did not finish: flaky {}, hostile {}, ok {}",
            status_of(&app, flaky),
            status_of(&app, hostile),
            status_of(&app, ok)
        );
        // A worker (with a lease of 30 s) that stopped sending heartbeats an hour ago, and
        // two periodic instants. A live worker removes every worker whose lease has ended
        // when it rescues, 500 ms after its start and then once per heartbeat interval (an
        // hour here): the row goes in after that first rescue, so the pages see it.
        std::thread::sleep(Duration::from_millis(1500).saturating_sub(spawned.elapsed()));
        let mut c = app.connection().unwrap();
        c.execute(
            "INSERT INTO postpone_workers (name, host, pid, queues, concurrency, last_heartbeat,
                                           stalled_after_ms)
             VALUES ('gone-worker', $1, 4242, ARRAY[$2], 3, now() - interval '1 hour', 30000)",
            &[&HOSTILE_HOST, &HOSTILE_QUEUE],
        )
        .unwrap();
        c.execute(
            "INSERT INTO postpone_periodic (task, periodic_id, instant, job_id)
             VALUES ($1, $2, date_trunc('minute', now()) - interval '2 minutes', NULL),
                    ($1, $2, date_trunc('minute', now()) - interval '1 minute', $3)",
            &[&HOSTILE_TASK, &"id<&>", &ok.get()],
        )
        .unwrap();
        Fixture {
            app,
            worker: Some(worker),
            flaky,
            hostile,
            ok,
            later,
        }
    }

    pub fn stop(&mut self) {
        if let Some(w) = self.worker.take() {
            let report = w.shutdown(Duration::from_secs(5));
            assert!(report.is_clean(), "{report}");
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(w) = self.worker.take() {
            let _ = w.shutdown(Duration::from_secs(5));
        }
    }
}

/// A dashboard of `app` on a free loopback port, with its defaults.
pub fn dashboard(app: &App) -> postpone::DashboardHandle {
    postpone::Dashboard::new(app)
        .listen("127.0.0.1:0")
        .unwrap()
        .spawn()
        .expect("dashboard")
}
