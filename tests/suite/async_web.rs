//! The axum example (`examples/async_web.rs`) served on a multi-threaded runtime against
//! PostgreSQL: a handler defers a job, a route waits for its result, a wait that runs out
//! answers with the job's status, and an unknown job is a 404; then the server stops and
//! the worker is shut down from `spawn_blocking`.

use crate::support;

#[allow(dead_code)]
#[path = "../../examples/async_web.rs"]
mod example;

use std::time::Duration;

use postpone::{App, Worker};
use serde_json::Value;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends one HTTP/1.1 request to `addr` and returns the status code and the JSON body.
async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, Value) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut raw))
        .await
        .expect("no answer within 60 s")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    (status, json)
}

#[test]
fn the_axum_example_defers_a_job_and_waits_for_its_result() {
    init_logging();
    let db = TestDb::new();
    let url = db.url();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            // As the example's main does: all on the runtime's thread.
            let app = App::connect(&url).unwrap();
            app.migrate().unwrap();
            let worker = Worker::builder(&app, example::tasks())
                .concurrency(2)
                .poll_interval(Duration::from_millis(200))
                .spawn()
                .unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let router = example::router(app.clone());
            let server = tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(async {
                        let _ = stop_rx.await;
                    })
                    .await
            });

            let (status, body) = request(addr, "POST", "/squares/12").await;
            assert_eq!(status, 201, "{body}");
            let id = body["id"].as_i64().expect("an id");
            let (status, body) = request(addr, "GET", &format!("/jobs/{id}?wait_ms=20000")).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["status"], "succeeded", "{body}");
            assert_eq!(body["output"], 144, "{body}");

            // Many requests at once: the handlers' calls run side by side.
            let mut calls = Vec::new();
            for n in 0..20i64 {
                calls.push(tokio::spawn(async move {
                    let (status, body) = request(addr, "POST", &format!("/squares/{n}")).await;
                    assert_eq!(status, 201, "{body}");
                    let id = body["id"].as_i64().unwrap();
                    let (status, body) =
                        request(addr, "GET", &format!("/jobs/{id}?wait_ms=20000")).await;
                    assert_eq!(status, 200, "{body}");
                    assert_eq!(body["output"], n * n, "{body}");
                }));
            }
            for c in calls {
                c.await.unwrap();
            }

            // A job not due for an hour: the wait runs out and the answer is its status.
            let later = app
                .job("square")
                .schedule_in(Duration::from_secs(3600))
                .defer(&5)
                .unwrap();
            let (status, body) =
                request(addr, "GET", &format!("/jobs/{}?wait_ms=300", later.get())).await;
            assert_eq!(status, 202, "{body}");
            assert_eq!(body["status"], "todo", "{body}");

            let (status, body) = request(addr, "GET", "/jobs/987654321").await;
            assert_eq!(status, 404, "{body}");

            stop_tx.send(()).unwrap();
            server.await.unwrap().unwrap();
            let report =
                tokio::task::spawn_blocking(move || worker.shutdown(Duration::from_secs(10)))
                    .await
                    .unwrap();
            assert!(report.is_clean(), "unclean shutdown: {report}");
            drop(app);
        });
}
