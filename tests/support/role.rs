//! A login role per test, named `postpone_role_<pid>_<counter>_<nanos>`, dropped afterwards
//! with every privilege it was given (roles belong to the whole server, not to a test's
//! database, so each test makes its own and leaves none behind).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use postgres::{Client, NoTls};

use super::db::{quote_ident, TestDb};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A `LOGIN` role with a password (so the URL works whatever the server's auth), no
/// superuser, no `CREATEDB`, no `CREATEROLE`, and no privilege on anything until a test
/// grants it some.
pub struct TestRole {
    name: String,
    password: String,
    /// The test database's URL as the server's own user, to revoke what was granted there.
    db_url: String,
    admin_url: String,
}

impl TestRole {
    /// A new role; `tag` goes into its name to tell the roles of one test apart.
    pub fn new(db: &TestDb, tag: &str) -> TestRole {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "postpone_role_{tag}_{}_{}_{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let password = format!("pw-{nanos}-{}", std::process::id());
        let role = TestRole {
            name,
            password,
            db_url: db.url(),
            admin_url: db.server().url("postgres"),
        };
        let mut c = Client::connect(&role.admin_url, NoTls).expect("admin connection");
        c.batch_execute(&format!(
            "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{}'",
            quote_ident(&role.name),
            role.password
        ))
        .unwrap_or_else(|e| panic!("creating role {}: {e}", role.name));
        role
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL of `db` as this role.
    pub fn url(&self, db: &TestDb) -> String {
        let mut spec = db.server().clone();
        spec.user = self.name.clone();
        spec.password = Some(self.password.clone());
        spec.url(db.name())
    }

    /// A plain client of `db` as this role.
    pub fn client(&self, db: &TestDb) -> Client {
        Client::connect(&self.url(db), NoTls)
            .unwrap_or_else(|e| panic!("connecting as {}: {e}", self.name))
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let q = quote_ident(&self.name);
        // Its privileges in the test database (if it still exists), then the role.
        if let Ok(mut c) = Client::connect(&self.db_url, NoTls) {
            let _ = c.batch_execute(&format!(
                "REASSIGN OWNED BY {q} TO CURRENT_USER; DROP OWNED BY {q}"
            ));
        }
        if let Ok(mut c) = Client::connect(&self.admin_url, NoTls) {
            let _ = c.batch_execute(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{}';
                 DROP ROLE IF EXISTS {q}",
                self.name
            ));
        }
    }
}
