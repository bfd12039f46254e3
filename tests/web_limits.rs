//! The dashboard's overview shows each queue's limits (concurrency, per key, rate) and why
//! its due jobs wait (paused, limit reached, key limit reached, rate limited, lock held),
//! over plain HTTP against PostgreSQL. (tests/web_browser.rs checks the same cells in
//! Chromium.)

mod support;
mod web_util;

use std::time::Duration;

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
