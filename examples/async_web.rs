//! An axum server whose handlers defer jobs and wait for their results.
//!
//! ```sh
//! cargo run --example async_web -- postgres://postgres@127.0.0.1/postgres
//! curl -X POST 127.0.0.1:3000/squares/12            # {"id":1}
//! curl '127.0.0.1:3000/jobs/1?wait_ms=5000'         # {"id":1,"status":"succeeded","output":144,...}
//! ```
//!
//! postpone's calls block the thread that makes them, and work on any thread, an async
//! task's included. In a handler:
//! - a defer is one round-trip (bounded by `io_timeout`): it may be called directly, and
//!   holds the runtime's thread meanwhile;
//! - a call that waits (`app.wait`, up to its timeout) goes through
//!   `tokio::task::spawn_blocking`, so that the runtime's threads serve other requests
//!   meanwhile.
//!
//! The worker runs on threads of its own. Shut it down before `main` returns: a
//! `WorkerHandle` dropped on a runtime's thread stops on a thread that nothing waits for.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use postpone::{App, ErrorKind, Job, JobId, TaskError, Tasks, Worker};
use serde::Deserialize;
use serde_json::json;

/// The tasks this server's worker runs: `square` records `n * n` as the job's output.
pub fn tasks() -> Tasks {
    let mut tasks = Tasks::new();
    tasks.register("square", |job: &Job| -> Result<(), TaskError> {
        let n: i64 = job.args()?;
        let square = n
            .checked_mul(n)
            .ok_or_else(|| TaskError::fail("the square does not fit in an i64"))?;
        job.set_output(&square)?;
        Ok(())
    });
    tasks
}

/// `POST /squares/{n}` defers a `square` job; `GET /jobs/{id}?wait_ms=..` waits up to
/// `wait_ms` (default 0) for its result.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/squares/{n}", post(defer_square))
        .route("/jobs/{id}", get(job_result))
        .with_state(app)
}

async fn defer_square(State(app): State<App>, Path(n): Path<i64>) -> Response {
    // One round-trip: called directly.
    match app.job("square").defer(&n) {
        Ok(id) => (StatusCode::CREATED, Json(json!({ "id": id }))).into_response(),
        Err(e) => server_error(e),
    }
}

#[derive(Deserialize)]
struct Wait {
    #[serde(default)]
    wait_ms: u64,
}

async fn job_result(
    State(app): State<App>,
    Path(id): Path<i64>,
    Query(q): Query<Wait>,
) -> Response {
    let id = JobId(id);
    let wait = Duration::from_millis(q.wait_ms.min(30_000));
    // A wait blocks for up to `wait`: off the runtime's threads.
    let got = tokio::task::spawn_blocking(move || match app.wait(id, wait) {
        // Not finished in time: what it is doing now.
        Err(e) if e.kind() == ErrorKind::Timeout => {
            app.job_result(id).map(|r| (StatusCode::ACCEPTED, r))
        }
        other => other.map(|r| (StatusCode::OK, r)),
    })
    .await;
    match got {
        Ok(Ok((status, result))) => (status, Json(result)).into_response(),
        Ok(Err(e)) if e.kind() == ErrorKind::NotFound => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": e.to_string() })),
        )
            .into_response(),
        Ok(Err(e)) => server_error(e),
        Err(join) => server_error(join),
    }
}

fn server_error(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({ "error": e.to_string() })),
    )
        .into_response()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    env_logger::init();
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1/postgres".into());
    // Connecting and migrating are blocking calls too, made here on the runtime's thread
    // before it serves anything.
    let app = App::connect(&url)?;
    app.migrate()?;
    let worker = Worker::builder(&app, tasks()).concurrency(4).spawn()?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router(app))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;

    let report =
        tokio::task::spawn_blocking(move || worker.shutdown(Duration::from_secs(10))).await?;
    println!("worker stopped: {report}");
    Ok(())
}
