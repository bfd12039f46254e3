//! The schema as an operator sees it: which version is installed against which this
//! library supports ([`SchemaState`]), a strict check that refuses a schema newer than the
//! library, a migration bounded by a deadline, and the SQL a migration would run.
//!
//! Refusing a newer schema is the admin API's choice, not the worker's: a worker of the old
//! release keeps running through a rolling upgrade (migrations only add), but an admin tool
//! that does not know a newer status would list, count and change jobs wrongly.
//!
//! A database whose postpone tables exist but whose `postpone_migrations` table does not
//! (created by hand, or the table was dropped) is named as such: migrating it would fail on
//! the first `CREATE TABLE`, and "run migrate" would be a dead end.

use std::time::Duration;

use serde::Serialize;

use super::Admin;
use crate::error::{fmt_duration, Error, ErrorKind, Result};
use crate::namespace::{quote_ident, Namespace};
use crate::schema::{self, LATEST, MIGRATE_LOCK, MIGRATIONS, MIGRATIONS_TABLE};
use crate::store;

/// The schema of a database against this library; from [`Admin::schema_state`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SchemaState {
    /// The highest migration recorded, if any.
    pub installed: Option<i32>,
    /// The version this library needs and knows.
    pub supported: i32,
    /// True when postpone's tables exist but no migration is recorded.
    pub unrecorded_tables: bool,
    /// The schema of the App ([`AppBuilder::schema`](crate::AppBuilder::schema)), or `None`
    /// for the default.
    pub schema: Option<String>,
}

impl SchemaState {
    /// Ok with the installed version if it is exactly the supported one; otherwise the
    /// error an operator needs: missing, unrecorded, older or newer (with both versions).
    pub fn require_current(&self) -> Result<i32> {
        let supported = self.supported;
        let ns = match &self.schema {
            Some(name) => Namespace::named(name)?,
            None => Namespace::DEFAULT,
        };
        match self.installed {
            None if self.unrecorded_tables => Err(unrecorded()),
            None => Err(Error::new(
                ErrorKind::SchemaMissing,
                format!(
                    "schema not installed{}: run {}",
                    ns.in_schema(),
                    ns.migrate_command()
                ),
            )),
            Some(v) if v < supported => Err(Error::new(
                ErrorKind::SchemaOutdated,
                format!(
                    "schema{} is older than this postpone (version {v}, this postpone needs {supported}): run {}",
                    ns.in_schema(),
                    ns.migrate_command()
                ),
            )),
            Some(v) if v > supported => Err(newer(v, supported)),
            Some(v) => Ok(v),
        }
    }
}

fn newer(v: i32, supported: i32) -> Error {
    Error::new(
        ErrorKind::SchemaNewer,
        format!(
            "the database schema is at version {v}, newer than this postpone (version {supported}): a newer postpone migrated it; use that release's tool (workers of this release keep running; see the rolling-upgrade notes)"
        ),
    )
}

fn unrecorded() -> Error {
    Error::new(
        ErrorKind::SchemaMissing,
        "postpone's tables exist but no migration is recorded (table postpone_migrations is missing or empty): \
         they were created by hand or the record was dropped, and `migrate` would fail on them. \
         `postpone migrate --adopt` records them if they match this postpone's schema exactly \
         (and says what differs if not); otherwise rename or drop them first",
    )
}

/// What [`Admin::migrate`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MigrateReport {
    /// Migrations this call applied (none when the schema was current).
    pub applied: Vec<i32>,
    /// The version installed now.
    pub version: i32,
}

impl Admin {
    /// The schema installed against the one this library supports.
    pub fn schema_state(&self) -> Result<SchemaState> {
        let mut conn = self.app.connection_unchecked()?;
        let row = conn
            .query(store::SCHEMA_TABLES_FOUND, &[])
            .map_err(|e| e.context("checking the schema version"))?;
        let (has_record, has_jobs) = row.first().map_or((false, false), |r| {
            (r.get::<_, bool>(0), r.get::<_, bool>(1))
        });
        let installed = if has_record {
            schema::installed_version(&mut conn, self.app.namespace())
                .map_err(|e| e.context("checking the schema version"))?
        } else {
            None
        };
        Ok(SchemaState {
            installed,
            supported: LATEST,
            unrecorded_tables: installed.is_none() && has_jobs,
            schema: self.app.schema().map(str::to_owned),
        })
    }

    /// The schema version installed, if it is exactly the one this library supports:
    /// [`SchemaMissing`](ErrorKind::SchemaMissing) (also for tables without a migration
    /// record), [`SchemaOutdated`](ErrorKind::SchemaOutdated) or
    /// [`SchemaNewer`](ErrorKind::SchemaNewer) otherwise, with both versions. For health
    /// checks and admin tools.
    pub fn check_schema(&self) -> Result<i32> {
        self.schema_state()?.require_current()
    }

    /// Installs or upgrades the schema like [`App::migrate`](crate::App::migrate), but
    /// refuses a newer schema or unrecorded tables, and gives up after `timeout` waiting
    /// for the migration lock (another process migrating) or for any one statement.
    pub fn migrate(&self, timeout: Duration) -> Result<MigrateReport> {
        let state = self.schema_state()?;
        if let Some(v) = state.installed {
            if v > state.supported {
                return Err(newer(v, state.supported));
            }
        } else if state.unrecorded_tables {
            return Err(unrecorded());
        }
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128);
        let mut conn = self.app.connection_unchecked()?;
        conn.batch_execute(&format!(
            "SET lock_timeout = {ms}; SET statement_timeout = {ms}"
        ))?;
        let res = schema::migrate(&mut conn, self.app.namespace());
        if conn
            .batch_execute("RESET lock_timeout; RESET statement_timeout")
            .is_err()
        {
            conn.sever();
        }
        let applied = res.map_err(|e| match e.sqlstate() {
            Some("55P03") | Some("57014") => Error::new(
                ErrorKind::Timeout,
                format!(
                    "migrating the schema: gave up after {} (the timeout): another process holds the migration lock, or a migration statement ran longer; nothing was changed ({e})",
                    fmt_duration(timeout)
                ),
            ),
            _ => e,
        })?;
        let version = schema::installed_version(&mut conn, self.app.namespace())?.unwrap_or(0);
        Ok(MigrateReport { applied, version })
    }

    /// Records the schema version of postpone tables that exist without a migration record
    /// (created by hand, or `postpone_migrations` was dropped), if they match this
    /// library's schema exactly: columns, types, defaults, constraints, indexes, triggers and
    /// functions are compared with a fresh install made in a scratch schema inside a
    /// transaction that is rolled back. Otherwise [`SchemaMissing`](ErrorKind::SchemaMissing)
    /// with the first differences, and nothing is changed. Returns the version recorded.
    pub fn adopt_schema(&self) -> Result<i32> {
        if let Some(name) = self.app.schema() {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!(
                    "adopting tables is for the default schema only, not schema {}: move the \
                     tables out of it, or drop them and run `postpone migrate --schema`",
                    quote_ident(name)
                ),
            ));
        }
        let state = self.schema_state()?;
        if !state.unrecorded_tables {
            return Err(Error::new(
                ErrorKind::InvalidState,
                match state.installed {
                    Some(v) => format!("nothing to adopt: migrations are recorded (version {v})"),
                    None => {
                        "nothing to adopt: postpone's tables do not exist; run `postpone migrate`"
                            .to_owned()
                    }
                },
            ));
        }
        let mut conn = self.app.connection_unchecked()?;
        let res = adopt(&mut conn);
        if conn.in_transaction() && conn.rollback().is_err() {
            conn.sever();
        }
        res
    }

    /// The SQL [`migrate`](Self::migrate) would run on this database: the missing
    /// migrations, in one transaction under the same advisory lock, each recorded in
    /// `postpone_migrations`.
    pub fn migration_sql(&self) -> Result<String> {
        let state = self.schema_state()?;
        let from = match state.installed {
            Some(v) if v > state.supported => return Err(newer(v, state.supported)),
            None if state.unrecorded_tables => return Err(unrecorded()),
            v => v.unwrap_or(0),
        };
        Ok(migration_script(from, self.app.namespace()))
    }

    /// The SQL of every migration of this library, as [`migration_sql`](Self::migration_sql)
    /// writes it for an empty database. Needs no database.
    pub fn migration_script_all() -> String {
        migration_script(0, &Namespace::DEFAULT)
    }

    /// [`migration_script_all`](Self::migration_script_all) for an installation in schema
    /// `schema` ([`AppBuilder::schema`](crate::AppBuilder::schema)): it creates the schema,
    /// installs into it and pins its functions, as `migrate` does. Needs no database; a
    /// name PostgreSQL cannot hold is an error of kind [`Config`](ErrorKind::Config).
    pub fn migration_script_all_in(schema: &str) -> Result<String> {
        Ok(migration_script(0, &Namespace::named(schema)?))
    }
}

fn adopt(conn: &mut crate::Connection) -> Result<i32> {
    let shape = |conn: &mut crate::Connection, schema: &str| -> Result<Vec<String>> {
        let mut v: Vec<String> = conn
            .query(store::SCHEMA_SHAPE, &[&schema])?
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        v.sort();
        Ok(v)
    };
    conn.begin()?;
    conn.execute(store::MIGRATE_LOCK_TAKE, &[&MIGRATE_LOCK])?;
    let home: String = conn.query_one(store::SCHEMA_OF_JOBS, &[])?.get(0);
    let have = shape(conn, &home)?;
    // A fresh install in a scratch schema, rolled back with the transaction.
    conn.batch_execute(store::SCHEMA_SCRATCH_CREATE)?;
    for m in MIGRATIONS {
        conn.batch_execute(m.sql)?;
    }
    let want = shape(conn, "postpone_adopt_scratch")?;
    conn.rollback()?;
    if have != want {
        let missing: Vec<&String> = want.iter().filter(|w| !have.contains(w)).take(3).collect();
        let extra: Vec<&String> = have.iter().filter(|h| !want.contains(h)).take(3).collect();
        return Err(Error::new(
            ErrorKind::SchemaMissing,
            format!(
                "cannot adopt the postpone tables in schema {home}: they differ from this postpone's version {LATEST} (missing: {}; unexpected: {}); nothing was changed",
                if missing.is_empty() { "none".to_owned() } else { missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ") },
                if extra.is_empty() { "none".to_owned() } else { extra.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ") },
            ),
        ));
    }
    conn.begin()?;
    conn.execute(store::MIGRATE_LOCK_TAKE, &[&MIGRATE_LOCK])?;
    conn.batch_execute(MIGRATIONS_TABLE)?;
    for m in MIGRATIONS {
        conn.execute(store::MIGRATION_RECORD_MISSING, &[&m.version, &m.name])?;
    }
    conn.commit()?;
    log::info!("adopted the postpone tables of schema {home} as version {LATEST}");
    Ok(LATEST)
}

/// The script applying every migration after version `from` to namespace `ns`.
pub(crate) fn migration_script(from: i32, ns: &Namespace) -> String {
    let pending: Vec<_> = MIGRATIONS.iter().filter(|m| m.version > from).collect();
    if pending.is_empty() {
        return format!(
            "-- postpone: the schema{} is current (version {LATEST}); nothing to run\n",
            ns.in_schema()
        );
    }
    let mut s = format!(
        "-- postpone schema migrations {}..{LATEST}{}, as `postpone migrate` runs them\nBEGIN;\nSELECT pg_advisory_xact_lock({MIGRATE_LOCK});\n",
        pending[0].version,
        ns.in_schema()
    );
    if let (Some(create), Some(name)) = (ns.create_sql(), ns.name()) {
        s.push_str(&format!(
            "{create};\nSET LOCAL search_path TO {};\n",
            quote_ident(name)
        ));
    }
    s.push_str(&format!("{MIGRATIONS_TABLE};\n"));
    for m in pending {
        s.push_str(&format!(
            "\n-- migration {} ({})\n{}\nINSERT INTO postpone_migrations (version, name) VALUES ({}, '{}');\n",
            m.version,
            m.name,
            m.sql.trim_end(),
            m.version,
            m.name
        ));
    }
    if let Some(pin) = ns.pin_sql() {
        s.push_str(&format!(
            "\n-- the schema's functions: its search_path, channels and lock keys\n{pin};\n"
        ));
    }
    s.push_str("COMMIT;\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(installed: Option<i32>, unrecorded: bool) -> SchemaState {
        SchemaState {
            installed,
            supported: 3,
            unrecorded_tables: unrecorded,
            schema: None,
        }
    }

    #[test]
    fn only_the_supported_version_passes() {
        assert_eq!(state(Some(3), false).require_current().unwrap(), 3);
        let e = state(Some(4), false).require_current().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::SchemaNewer);
        assert!(
            e.to_string()
                .contains("version 4, newer than this postpone (version 3)"),
            "{e}"
        );
        let e = state(Some(2), false).require_current().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::SchemaOutdated);
        assert!(
            e.to_string().contains("version 2, this postpone needs 3"),
            "{e}"
        );
        let e = state(None, false).require_current().unwrap_err();
        assert!(e.to_string().starts_with("schema not installed"), "{e}");
        let e = state(None, true).require_current().unwrap_err();
        assert!(e.to_string().contains("no migration is recorded"), "{e}");
    }

    #[test]
    fn the_script_records_what_it_applies() {
        let s = migration_script(0, &Namespace::DEFAULT);
        assert!(s.starts_with("-- postpone schema migrations 1.."), "{s}");
        assert!(s.contains("CREATE TABLE postpone_jobs"));
        assert!(s.contains("INSERT INTO postpone_migrations (version, name) VALUES (1, 'init');"));
        assert!(s.trim_end().ends_with("COMMIT;"));
        assert!(migration_script(LATEST, &Namespace::DEFAULT).contains("nothing to run"));
    }
}
