//! Deferring a job inside the program's own transaction, from an `r2d2_postgres` pool: the
//! usual setup of a synchronous Rust program. The job exists if and only if the transaction
//! that records the order commits.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run --example r2d2_transaction
//! ```
//!
//! The program's pool stays as it is: postpone's `defer_in` takes any
//! `postgres::GenericClient`, so a `Transaction` borrowed from a pooled client works. (The
//! App keeps a small pool of its own, with deadlines, for its other calls.)

use std::time::Duration;

use postpone::App;
use r2d2_postgres::postgres::NoTls;
use r2d2_postgres::PostgresConnectionManager;
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());

    // The program's own pool.
    let manager = PostgresConnectionManager::new(url.parse()?, NoTls);
    let pool = r2d2_postgres::r2d2::Pool::builder()
        .max_size(4)
        .connection_timeout(Duration::from_secs(5))
        .build(manager)?;

    let app = App::builder(&url).pool_size(2).build()?;
    app.migrate()?;

    let mut client = pool.get()?;
    client.batch_execute(
        "CREATE TABLE IF NOT EXISTS example_orders (id serial PRIMARY KEY, item text NOT NULL)",
    )?;

    // Committed: the order and its job, together.
    let mut tx = client.transaction()?;
    let order: i32 = tx
        .query_one(
            "INSERT INTO example_orders (item) VALUES ($1) RETURNING id",
            &[&"book"],
        )?
        .get(0);
    let job = app
        .job("ship_order")
        .queue("shipping")
        .defer_in(&mut tx, &json!({ "order": order }))?;
    tx.commit()?;
    println!("order {order} recorded with job {job}");

    // Rolled back: neither the order nor its job exists.
    let mut tx = client.transaction()?;
    let order: i32 = tx
        .query_one(
            "INSERT INTO example_orders (item) VALUES ($1) RETURNING id",
            &[&"lamp"],
        )?
        .get(0);
    let job = app
        .job("ship_order")
        .defer_in(&mut tx, &json!({ "order": order }))?;
    tx.rollback()?;
    let exists: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM postpone_jobs WHERE id = $1)",
            &[&job.get()],
        )?
        .get(0);
    println!("order {order} rolled back; its job {job} exists: {exists}");
    assert!(!exists);
    Ok(())
}
