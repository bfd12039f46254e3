//! Testing a program that defers jobs, with `postpone::testing` (feature `test-util`): assert
//! what a piece of code deferred, and run those jobs synchronously with the real task code,
//! against a real database.
//!
//! ```sh
//! cargo test --example testing --features test-util   # runs the tests below
//! cargo run --example testing --features test-util     # runs the same steps once
//! ```
//!
//! In your own crate, enable the feature for tests only:
//!
//! ```toml
//! [dev-dependencies]
//! postpone = { version = "0.1", features = ["test-util"] }
//! ```

use postpone::{App, Job, TaskError, Tasks};
use serde::{Deserialize, Serialize};

/// The code under test: a signup defers a welcome mail on the `emails` queue.
pub fn sign_up(app: &App, email: &str) -> postpone::Result<()> {
    app.job("welcome")
        .queue("emails")
        .queueing_lock(format!("welcome:{email}"))
        .defer(&Welcome {
            to: email.to_owned(),
        })?;
    Ok(())
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct Welcome {
    to: String,
}

/// The program's tasks, as its worker registers them.
pub fn tasks() -> Tasks {
    let mut tasks = Tasks::new();
    tasks.register("welcome", |job: &Job| -> Result<(), TaskError> {
        let w: Welcome = job.args()?;
        job.set_output(&format!("sent to {}", w.to))?;
        Ok(())
    });
    tasks
}

/// A database of its own, dropped at the end (tests run in parallel).
pub struct ScratchDb {
    name: String,
    base: String,
}

impl ScratchDb {
    pub fn new(tag: &str) -> ScratchDb {
        let base = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let name = format!("postpone_example_{tag}_{}", std::process::id());
        let mut c = postgres::Client::connect(&base, postgres::NoTls).expect("connect");
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .and_then(|()| c.batch_execute(&format!("CREATE DATABASE {name}")))
            .expect("create the scratch database");
        ScratchDb { name, base }
    }

    pub fn url(&self) -> String {
        match self.base.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{}", self.name),
            None => panic!("DATABASE_URL must be a URL ending with /dbname"),
        }
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.base, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

fn check_sign_up(app: &App) {
    let mark = postpone::testing::Mark::new(app).unwrap();
    sign_up(app, "a@b.c").unwrap();
    let deferred = mark.deferred().unwrap();
    let job = deferred.assert_one("welcome", &Welcome { to: "a@b.c".into() });
    assert_eq!(job.queue, "emails");
    assert_eq!(job.queueing_lock.as_deref(), Some("welcome:a@b.c"));
    let ran = mark.run(&tasks()).unwrap();
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0].output, Some(serde_json::json!("sent to a@b.c")));
}

fn main() {
    let db = ScratchDb::new("main");
    let app = App::builder(db.url()).pool_size(2).build().unwrap();
    app.migrate().unwrap();
    check_sign_up(&app);
    println!("sign_up deferred one welcome job, which ran and succeeded");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_up_defers_a_welcome_mail_that_runs() {
        let db = ScratchDb::new("test");
        let app = App::builder(db.url()).pool_size(2).build().unwrap();
        app.migrate().unwrap();
        check_sign_up(&app);
    }
}
