//! The dashboard in headless Chromium (Debian's `chromium` and `chromium-driver`), driven
//! over WebDriver by a small client written here: each page loads against a database with
//! real jobs, hostile values render as text and run nothing, the retry and cancel buttons
//! change their jobs, and a screenshot of each page lands in
//! `target/tmp/web-screenshots/`.
//!
//! Without chromium the test prints why it skips; under CI (`CI` set) it fails instead,
//! since `.ci/run` installs the packages.

mod support;
mod web_util;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use postpone::Dashboard;
use serde_json::{json, Value};
use support::*;
use web_util::*;

/// WebDriver's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/bin")]) {
        for name in names {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// A chromedriver process and one browser session.
struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    profile: PathBuf,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium (with JavaScript off unless `js`);
    /// `Err` says why it cannot.
    fn start(js: bool) -> Result<Browser, String> {
        let chromium = find_program(&["chromium", "chromium-browser"])
            .ok_or("no chromium binary on PATH (Debian package `chromium`)")?;
        let chromedriver = find_program(&["chromedriver"])
            .ok_or("no chromedriver on PATH (Debian package `chromium-driver`)")?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", chromedriver.display()))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let profile = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chromium-{port}"));
        let mut b = Browser {
            driver,
            addr,
            session: String::new(),
            profile,
        };
        let ready = wait_until(Duration::from_secs(20), || {
            std::net::TcpStream::connect(addr).is_ok()
                && b.call("GET", "/status", None)["ready"] == json!(true)
        });
        if !ready {
            return Err("chromedriver did not become ready within 20 s".into());
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1200,820",
                         "--hide-scrollbars",
                         format!("--user-data-dir={}", b.profile.display())],
                "prefs": {"profile.managed_default_content_settings.javascript": if js { 1 } else { 2 }}
            }
        }}});
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"]
            .as_str()
            .ok_or_else(|| format!("chromedriver refused a session: {v}"))?
            .to_owned();
        Ok(b)
    }

    /// One WebDriver command; returns its `value`.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let headers = [("Content-Type", "application/json; charset=utf-8")];
        let r = request(self.addr, method, path, &headers, &body);
        let v: Value = serde_json::from_str(&r.body)
            .unwrap_or_else(|e| panic!("chromedriver answered {} {}: {e}", r.status, r.body));
        v["value"].clone()
    }

    fn cmd(&self, method: &str, what: &str, body: Option<Value>) -> Value {
        let v = self.call(method, &format!("/session/{}{what}", self.session), body);
        if let Some(err) = v.get("error") {
            panic!("webdriver {method} {what}: {err} {}", v["message"]);
        }
        v
    }

    fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url })));
    }

    fn title(&self) -> String {
        self.cmd("GET", "/title", None)
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    fn url(&self) -> String {
        self.cmd("GET", "/url", None)
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    fn find_all(&self, css: &str) -> Vec<String> {
        let v = self.cmd(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        );
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn find(&self, css: &str) -> String {
        self.find_all(css)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no element {css:?} on {}", self.url()))
    }

    fn text(&self, css: &str) -> String {
        // Live updates may replace the element between finding and reading it: find again.
        for _ in 0..10 {
            let el = self.find(css);
            let v = self.call(
                "GET",
                &format!("/session/{}/element/{el}/text", self.session),
                None,
            );
            match v.get("error") {
                Some(e) if e == "stale element reference" => continue,
                Some(e) => panic!("webdriver text of {css}: {e} {}", v["message"]),
                None => return v.as_str().unwrap_or("").to_owned(),
            }
        }
        panic!("{css} kept changing under the reader")
    }

    fn click(&self, css: &str) {
        for _ in 0..10 {
            let el = self.find(css);
            let v = self.call(
                "POST",
                &format!("/session/{}/element/{el}/click", self.session),
                Some(json!({})),
            );
            match v.get("error") {
                Some(e) if e == "stale element reference" => continue,
                Some(e) => panic!("webdriver click on {css}: {e} {}", v["message"]),
                None => return,
            }
        }
        panic!("{css} kept changing under the click")
    }

    /// Clicks and waits until the page that the click loads has an address containing
    /// `url_part` and is parsed (a click returns before the navigation it starts ends).
    fn click_to(&self, css: &str, url_part: &str) {
        self.click(css);
        let arrived = wait_until(Duration::from_secs(15), || {
            self.url().contains(url_part) && !self.find_all("main").is_empty()
        });
        assert!(
            arrived,
            "clicking {css} did not lead to {url_part:?}: at {}",
            self.url()
        );
    }

    /// Runs a script in the page (WebDriver's own channel: the page itself has none).
    fn eval(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    fn screenshot(&self, name: &str) -> PathBuf {
        let b64 = self.cmd("GET", "/screenshot", None);
        let png = base64(b64.as_str().expect("screenshot data"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, &png).unwrap();
        eprintln!("screenshot: {}", path.display());
        // The docs' screenshots are refreshed on request (their times change every run).
        if std::env::var_os("UPDATE_SCREENSHOTS").is_some() {
            let docs = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("docs")
                .join(format!("dashboard-{name}.png"));
            std::fs::write(&docs, &png).unwrap();
            eprintln!("screenshot: {}", docs.display());
        }
        path
    }

    /// Presses a key (WebDriver's code point for it: Tab is U+E004, Enter U+E007).
    fn key(&self, key: char) {
        let k = key.to_string();
        self.cmd(
            "POST",
            "/actions",
            Some(
                json!({"actions": [{"type": "key", "id": "keyboard", "actions": [
                {"type": "keyDown", "value": k}, {"type": "keyUp", "value": k}]}]}),
            ),
        );
    }

    fn window_width(&self, width: u32) {
        self.cmd(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": 900})),
        );
    }

    /// Loads `url` and checks what every page must hold: its title, no script element,
    /// and no hostile script having run.
    fn load(&self, url: &str, title: &str) {
        self.goto(url);
        let t = self.title();
        assert!(t.starts_with(title), "title {t:?} on {url}");
        // The one script is the dashboard's own file (the CSP refuses any other).
        assert_eq!(
            self.eval(
                "return Array.from(document.scripts).every(s => s.src.endsWith('/static/live.js'))"
            ),
            json!(true),
            "a script other than live.js on {url}"
        );
        assert_eq!(
            self.eval("return typeof window.pwned"),
            json!("undefined"),
            "a hostile value ran as script on {url}"
        );
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("bad base64 byte {c}"),
        }
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= val(*c) << (18 - 6 * i);
        }
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    out
}

#[test]
fn every_page_in_chromium_with_retry_and_cancel() {
    init_logging();
    let browser = match Browser::start(true) {
        Ok(b) => b,
        Err(why) => {
            if std::env::var_os("CI").is_some() {
                panic!("browser test cannot run under CI: {why}");
            }
            eprintln!("SKIPPED every_page_in_chromium_with_retry_and_cancel: {why}; install with `apt-get install -y chromium chromium-driver` (.ci/run does)");
            return;
        }
    };
    let db = TestDb::new();
    let mut fx = Fixture::new(&db);
    let dash = Dashboard::new(&fx.app)
        .listen("127.0.0.1:0")
        .unwrap()
        .spawn()
        .unwrap();
    let base = dash.url();
    // A queue with a key limit and a rate limit (no worker takes its jobs): the overview
    // shows both.
    fx.app
        .admin()
        .set_rate_limit("throttled", 5, Duration::from_secs(60))
        .unwrap();
    fx.app
        .admin()
        .set_key_limit("throttled", "user", 2)
        .unwrap();
    fx.app
        .job("ok")
        .queue("throttled")
        .defer(&json!({"user": 1}))
        .unwrap();

    browser.load(&format!("{base}/"), "Overview");
    let body = browser.text("body");
    assert!(
        body.contains(HOSTILE_QUEUE),
        "the hostile queue is not shown as text"
    );
    let limits = browser.find_all("td.limits").len();
    assert!(limits >= 3, "{limits} limits cells");
    assert!(
        body.contains("at most 2 running per user") && body.contains("at most 5 starts per 1m 00s"),
        "the limits of the throttled queue are not shown: {body}"
    );
    assert!(
        browser.find_all("svg rect").len() >= 2,
        "no bars in the chart"
    );
    browser.screenshot("overview");

    browser.load(&format!("{base}/jobs"), "Jobs");
    let body = browser.text("body");
    assert!(
        body.contains(HOSTILE_TASK),
        "hostile task not shown as text"
    );
    assert!(
        body.contains(HOSTILE_LOCK),
        "hostile lock not shown as text"
    );
    browser.screenshot("jobs");
    // Filter by the hostile queue through the form, as a person would.
    browser.cmd(
        "POST",
        &format!("/element/{}/value", browser.find("input[name=queue]")),
        Some(json!({ "text": HOSTILE_QUEUE })),
    );
    browser.click_to("form.filters button", "queue=q%22");
    let rows = browser.find_all("table tr");
    assert_eq!(
        rows.len(),
        2,
        "one header and one job for the hostile queue"
    );
    assert!(browser.text("table").contains(&fx.hostile.to_string()));

    let job_url = format!("{base}/jobs/{}", fx.flaky);
    browser.load(&job_url, &format!("Job {}", fx.flaky));
    assert!(browser
        .text("#errors")
        .contains("boom <script>window.pwned=4</script> \"double\" 'single' NUL:\u{fffd}:end"));
    assert!(browser.text("#args").contains(HOSTILE_ARG));
    browser.screenshot("job");
    browser.click_to("#retry", "?done=retried");
    assert!(browser.text(".flash").starts_with("Retried"));
    assert!(
        wait_until(Duration::from_secs(20), || status_of(&fx.app, fx.flaky)
            == "succeeded"),
        "the retried job did not run again"
    );
    browser.load(&job_url, "Job");
    assert!(
        browser.text("h1").contains("succeeded"),
        "{}",
        browser.text("h1")
    );
    assert!(
        browser.find_all("#retry").is_empty(),
        "retry offered on a succeeded job"
    );

    browser.load(&format!("{base}/jobs/{}", fx.later), "Job");
    assert!(browser.text("h1").contains("todo"));
    browser.click_to("#cancel", "?done=cancelled");
    assert!(browser.text(".flash").starts_with("Cancelled"));
    assert!(browser.text("h1").contains("cancelled"));
    assert_eq!(status_of(&fx.app, fx.later), "cancelled");

    // Bulk retry of every failed job: the count first, then the confirmed action.
    let errors = || -> i32 {
        let mut c = fx.app.connection().unwrap();
        c.query_one(
            "SELECT jsonb_array_length(errors) FROM postpone_jobs WHERE id = $1",
            &[&fx.hostile.get()],
        )
        .unwrap()
        .get(0)
    };
    browser.load(&format!("{base}/jobs?status=failed"), "Jobs");
    assert_eq!(browser.text("#count"), "1 job matches");
    browser.click_to("#bulk-retry", "/jobs/bulk");
    assert!(
        browser.text("#plan").contains("1 would be retried"),
        "{}",
        browser.text("#plan")
    );
    assert_eq!(errors(), 1, "the dry run changed the job");
    browser.screenshot("bulk");
    browser.click_to("#confirm", "bulk=retry");
    assert!(
        browser.text("#bulk-done").starts_with("1 job(s) retried"),
        "{}",
        browser.text("#bulk-done")
    );
    // It ran again (and failed again: that task always fails), so it has two errors now.
    assert!(wait_until(Duration::from_secs(20), || errors() == 2));

    // Live updates: a change in the database reaches an open page without a reload, and
    // the header's switch stops them.
    let live = fx
        .app
        .job("ok")
        .queue("nowhere")
        .defer(&json!({"live": 1}))
        .unwrap();
    browser.load(&format!("{base}/jobs/{live}"), "Job");
    assert!(browser.text("h1").contains("todo"));
    browser.eval("window.notReloaded = 42; return 0");
    fx.app.admin().cancel(live).unwrap();
    let updated = wait_until(Duration::from_secs(20), || {
        browser.text("h1").contains("cancelled")
    });
    assert!(updated, "the page did not update: {}", browser.text("h1"));
    assert_eq!(
        browser.eval("return window.notReloaded"),
        json!(42),
        "the page reloaded"
    );
    assert!(browser.text("#live-state").starts_with("updated"));
    browser.click("#live-toggle");
    assert_eq!(
        browser.eval("return document.documentElement.dataset.live"),
        json!("off")
    );
    fx.app.admin().retry(live).unwrap();
    // A negative check: several update periods (3 s each) pass without a change.
    std::thread::sleep(Duration::from_secs(7));
    assert!(
        browser.text("h1").contains("cancelled"),
        "updated while switched off"
    );
    browser.click("#live-toggle");
    assert!(wait_until(Duration::from_secs(20), || browser
        .text("h1")
        .contains("todo")));
    assert_eq!(browser.eval("return window.notReloaded"), json!(42));

    browser.load(&format!("{base}/workers"), "Workers");
    assert!(browser.text("tr.stalled").contains(HOSTILE_HOST));
    assert!(browser.text("tr.stalled").contains("stalled"));
    browser.screenshot("workers");

    // A stored schedule: paused and resumed with its buttons.
    fx.app
        .admin()
        .set_schedule(&postpone::NewSchedule::new("nightly", "0 3 * * *").time_zone("Europe/Paris"))
        .unwrap();
    browser.load(&format!("{base}/periodic"), "Periodic");
    assert!(browser.text("table").contains(HOSTILE_TASK));
    assert!(browser.text("table").contains("id<&>"));
    assert!(browser.text("table").contains("0 3 * * *\nEurope/Paris"));
    browser.screenshot("periodic");
    browser.click_to("button.pause", "?done=paused");
    assert!(browser.text("body").contains("Schedule paused"));
    assert!(browser.text("table").contains("database paused"));
    assert!(fx.app.admin().schedule("nightly", "").unwrap().is_paused());
    browser.click_to("button.resume", "?done=resumed");
    assert!(!fx.app.admin().schedule("nightly", "").unwrap().is_paused());

    // The keyboard alone: Tab reaches the navigation's links in order, Enter follows one.
    browser.load(&format!("{base}/workers"), "Workers");
    for _ in 0..3 {
        browser.key('\u{E004}');
    }
    assert_eq!(
        browser.eval("return document.activeElement.textContent"),
        json!("Jobs")
    );
    browser.key('\u{E007}');
    assert!(wait_until(Duration::from_secs(10), || browser
        .url()
        .ends_with("/jobs")));
    // Interactive elements show where the focus is.
    assert!(browser.eval(
        "return Array.from(document.styleSheets[0].cssRules).some(r => r.cssText.includes(':focus-visible'))"
    ) == json!(true));

    // 420 px wide: no page is wider than the window (wide tables scroll inside their box).
    browser.window_width(420);
    for (path, title) in [
        ("/", "Overview"),
        ("/jobs", "Jobs"),
        (&*format!("/jobs/{}", fx.flaky), "Job"),
        ("/workers", "Workers"),
    ] {
        browser.load(&format!("{base}{path}"), title);
        let (doc, win) = (
            browser.eval("return document.documentElement.scrollWidth"),
            browser.eval("return window.innerWidth"),
        );
        assert!(
            doc.as_u64() <= win.as_u64(),
            "{path} is {doc} px wide in a {win} px window"
        );
    }
    browser.load(&format!("{base}/"), "Overview");
    browser.screenshot("narrow");
    browser.window_width(1200);

    // JavaScript off: the pages and their buttons work the same (plain forms and links).
    drop(browser);
    let nojs = Browser::start(false).expect("a second browser");
    // (Proof that scripts are off in it: this page's script would rename it.)
    nojs.goto("data:text/html,<title>off</title><script>document.title='on'</script>");
    assert_eq!(nojs.title(), "off", "JavaScript is not off");
    nojs.goto(&format!("{base}/jobs/{}", fx.hostile));
    assert!(nojs.title().starts_with("Job"));
    assert!(nojs.text("h1").contains("failed"));
    nojs.click_to("#retry", "?done=retried");
    assert!(nojs.text(".flash").starts_with("Retried"), "{}", nojs.url());
    // It ran again (and failed again), so it has three errors now.
    assert!(wait_until(Duration::from_secs(20), || errors() == 3));
    nojs.goto(&format!("{base}/jobs?status=cancelled"));
    assert!(nojs.text("table").contains(&fx.later.to_string()));

    dash.shutdown();
    fx.stop();
}
