//! The database schema: numbered SQL migrations embedded in the binary.
//!
//! The migrations are the history. What a fresh migrate leaves (every table with its indexes
//! and triggers, every function) is in `src/schema/present/`, as the server describes it:
//! read those files to learn what is live; `tests/suite/schema_present.rs` fails when they differ
//! from a fresh migrate, and rewrites them when run with `POSTPONE_WRITE_PRESENT=1`.
//!
//! `migrate` applies the missing ones in a single transaction under an advisory lock, so any
//! number of processes may run it at once: one applies, the others wait and find nothing to
//! do. Applied versions are recorded in `postpone_migrations`.
//!
//! `check` reads the recorded version: no table means the schema is not installed, a lower
//! version means it is older than this library (both are errors that say to run
//! `postpone migrate`); a higher version is accepted with a warning (a newer library migrated
//! first; migrations only add).

use std::time::Duration;

use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::namespace::Namespace;
use crate::store;

/// A migration: its version, a short name, and its SQL.
pub(crate) struct Migration {
    pub(crate) version: i32,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// Every migration, in order.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "integrity",
        sql: include_str!("0002_integrity.sql"),
    },
    Migration {
        version: 3,
        name: "claim",
        sql: include_str!("0003_claim.sql"),
    },
    Migration {
        version: 4,
        name: "results",
        sql: include_str!("0004_results.sql"),
    },
    Migration {
        version: 5,
        name: "flow",
        sql: include_str!("0005_flow.sql"),
    },
    Migration {
        version: 6,
        name: "unique",
        sql: include_str!("0006_unique.sql"),
    },
    Migration {
        version: 7,
        name: "limits",
        sql: include_str!("0007_limits.sql"),
    },
    Migration {
        version: 8,
        name: "rates",
        sql: include_str!("0008_rates.sql"),
    },
    Migration {
        version: 9,
        name: "due",
        sql: include_str!("0009_due.sql"),
    },
    Migration {
        version: 10,
        name: "quiet",
        sql: include_str!("0010_quiet.sql"),
    },
    Migration {
        version: 11,
        name: "parked",
        sql: include_str!("0011_parked.sql"),
    },
    Migration {
        version: 12,
        name: "lean",
        sql: include_str!("0012_lean.sql"),
    },
    Migration {
        version: 13,
        name: "finish_wait",
        sql: include_str!("0013_finish_wait.sql"),
    },
    Migration {
        version: 14,
        name: "park_lean",
        sql: include_str!("0014_park_lean.sql"),
    },
    Migration {
        version: 15,
        name: "no_row_trigger",
        sql: include_str!("0015_no_row_trigger.sql"),
    },
    Migration {
        version: 16,
        name: "less_per_claim",
        sql: include_str!("0016_less_per_claim.sql"),
    },
    Migration {
        version: 17,
        name: "bounded_inputs",
        sql: include_str!("0017_bounded_inputs.sql"),
    },
    Migration {
        version: 19,
        name: "stats",
        sql: include_str!("0019_stats.sql"),
    },
    Migration {
        version: 20,
        name: "claimed_not_started",
        sql: include_str!("0020_claimed_not_started.sql"),
    },
    Migration {
        version: 22,
        name: "leases",
        sql: include_str!("0022_leases.sql"),
    },
    Migration {
        version: 23,
        name: "dependencies",
        sql: include_str!("0023_dependencies.sql"),
    },
    Migration {
        version: 24,
        name: "batches",
        sql: include_str!("0024_batches.sql"),
    },
    Migration {
        version: 25,
        name: "expiry",
        sql: include_str!("0025_expiry.sql"),
    },
    Migration {
        version: 26,
        name: "schedules",
        sql: include_str!("0026_schedules.sql"),
    },
    Migration {
        version: 27,
        name: "bounded_args",
        sql: include_str!("0027_bounded_args.sql"),
    },
    Migration {
        version: 28,
        name: "workflows",
        sql: include_str!("0028_workflows.sql"),
    },
    Migration {
        version: 29,
        name: "claim_sizes",
        sql: include_str!("0029_claim_sizes.sql"),
    },
    Migration {
        version: 30,
        name: "expiring_apart",
        sql: include_str!("0030_expiring_apart.sql"),
    },
    Migration {
        version: 31,
        name: "stats_without_locks",
        sql: include_str!("0031_stats_without_locks.sql"),
    },
    Migration {
        version: 32,
        name: "args_bytes",
        sql: include_str!("0032_args_bytes.sql"),
    },
    Migration {
        version: 34,
        name: "lz4",
        sql: include_str!("0034_lz4.sql"),
    },
    Migration {
        version: 35,
        name: "stats_cheaper",
        sql: include_str!("0035_stats_cheaper.sql"),
    },
    Migration {
        version: 36,
        name: "page_room",
        sql: include_str!("0036_page_room.sql"),
    },
    Migration {
        version: 37,
        name: "per_call",
        sql: include_str!("0037_per_call.sql"),
    },
    Migration {
        version: 38,
        name: "claim_generic_plans",
        sql: include_str!("0038_claim_generic_plans.sql"),
    },
    Migration {
        version: 39,
        name: "lease_end_of_time",
        sql: include_str!("0039_lease_end_of_time.sql"),
    },
    Migration {
        version: 40,
        name: "stats_saturate",
        sql: include_str!("0040_stats_saturate.sql"),
    },
    Migration {
        version: 41,
        name: "late_start_end_of_time",
        sql: include_str!("0041_late_start_end_of_time.sql"),
    },
    Migration {
        version: 42,
        name: "requeue_lock_timeout",
        sql: include_str!("0042_requeue_lock_timeout.sql"),
    },
    Migration {
        version: 43,
        name: "expire_lock_timeout",
        sql: include_str!("0043_expire_lock_timeout.sql"),
    },
    Migration {
        version: 44,
        name: "rescue_around_locks",
        sql: include_str!("0044_rescue_around_locks.sql"),
    },
    Migration {
        version: 45,
        name: "less_per_job",
        sql: include_str!("0045_less_per_job.sql"),
    },
    Migration {
        version: 46,
        name: "args_json",
        sql: include_str!("0046_args_json.sql"),
    },
    Migration {
        version: 47,
        name: "dependency_args_json",
        sql: include_str!("0047_dependency_args_json.sql"),
    },
    Migration {
        version: 48,
        name: "claim_in_outcome",
        sql: include_str!("0048_claim_in_outcome.sql"),
    },
    Migration {
        version: 49,
        name: "delete_once",
        sql: include_str!("0049_delete_once.sql"),
    },
    Migration {
        version: 50,
        name: "merge_locks",
        sql: include_str!("0050_merge_locks.sql"),
    },
    Migration {
        version: 51,
        name: "many_queues",
        sql: include_str!("0051_many_queues.sql"),
    },
];

/// The schema version this library needs.
pub(crate) const LATEST: i32 = 51;

/// The schema version this library installs and needs ([`App::migrate`](crate::App::migrate)
/// brings a database to it; an older one is refused with `SchemaOutdated`).
pub const SCHEMA_VERSION: i32 = LATEST;

/// Key of the advisory lock that serialises migrations (any constant works; this one spells
/// "postpone" in ASCII).
pub(crate) const MIGRATE_LOCK: i64 = 0x706f_7374_706f_6e65;

/// The table that records applied migrations.
pub(crate) const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS postpone_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)";

/// Migrations may run long on big tables: they get at least this deadline per round-trip.
const MIGRATE_TIMEOUT: Duration = Duration::from_secs(120);

/// Applies every missing migration to namespace `ns` (`conn` was opened for it: its
/// `search_path` is the schema's); returns the versions applied by this call. A named
/// schema is created if missing, and its functions are pinned after the migrations (see
/// `namespace.rs`), in the same transaction.
pub(crate) fn migrate(conn: &mut Connection, ns: &Namespace) -> Result<Vec<i32>> {
    let previous = conn.io_timeout();
    conn.set_io_timeout(previous.max(MIGRATE_TIMEOUT));
    let res = migrate_inner(conn, ns);
    conn.set_io_timeout(previous);
    if res.is_err() && conn.in_transaction() {
        // Roll back if the link still works; otherwise the server rolls back when it sees
        // the connection go.
        if conn.rollback().is_err() {
            conn.sever();
        }
    }
    res.map_err(|e| {
        if e.sqlstate() == Some("42501") {
            e.context(
                "migrating the schema: this role may not change postpone's objects \
                 (run migrate as the role that owns them; see docs/roles.md)",
            )
        } else {
            e.context(format_args!("migrating the schema{}", ns.in_schema()))
        }
    })
}

fn migrate_inner(conn: &mut Connection, ns: &Namespace) -> Result<Vec<i32>> {
    conn.begin()?;
    conn.execute(store::MIGRATE_LOCK_TAKE, &[&MIGRATE_LOCK])?;
    if let (Some(name), Some(create)) = (ns.name(), ns.create_sql()) {
        // Only when missing: CREATE SCHEMA IF NOT EXISTS needs the right to create schemas
        // even when it exists, and a worker's role may have none.
        let exists: bool = conn.query_one(store::SCHEMA_EXISTS, &[&name])?.get(0);
        if !exists {
            conn.batch_execute(&create)?;
        }
    }
    // Created only when missing: `CREATE TABLE IF NOT EXISTS` needs the right to create in
    // the schema even when the table exists, and a worker's role has none (so its
    // `migrate` of a current schema would fail instead of finding nothing to do).
    let recorded: bool = conn.query_one(store::MIGRATIONS_TABLE_FOUND, &[])?.get(0);
    if !recorded {
        conn.batch_execute(MIGRATIONS_TABLE)?;
    } else if let Some(name) = ns.name() {
        // Every install made for a named schema has its functions pinned. Unpinned ones were
        // installed without `.schema` (the schema was first in the search_path): pinning
        // them would move the notifications of the Apps that use it so, as they are.
        let unpinned: Option<String> = conn
            .query_one(store::SCHEMA_UNPINNED_FUNCTION, &[&name])?
            .get(0);
        if let Some(f) = unpinned {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!(
                    "schema {} holds an installation made without a schema setting (its \
                     function {f} is not pinned to it): the Apps that use it listen on the \
                     default channels, which migrating it as a named schema would change; \
                     use it without .schema / --schema, as it was installed; nothing was changed",
                    crate::namespace::quote_ident(name)
                ),
            ));
        }
    }
    let applied: Vec<i32> = conn
        .query(store::MIGRATIONS_APPLIED, &[])?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut done = Vec::new();
    for m in MIGRATIONS {
        if applied.contains(&m.version) {
            continue;
        }
        conn.batch_execute(m.sql).map_err(|e| {
            e.context(format_args!(
                "applying migration {} ({})",
                m.version, m.name
            ))
        })?;
        conn.execute(store::MIGRATION_RECORD, &[&m.version, &m.name])?;
        log::info!("applied migration {} ({})", m.version, m.name);
        done.push(m.version);
    }
    if let Some(pin) = ns.pin_sql() {
        conn.batch_execute(&pin)
            .map_err(|e| e.context("pinning the functions of the schema"))?;
    }
    conn.commit()?;
    Ok(done)
}

/// The schema version installed in namespace `ns`, or `None` when postpone is not installed
/// there (a named schema that does not exist included).
pub(crate) fn installed_version(conn: &mut Connection, ns: &Namespace) -> Result<Option<i32>> {
    let sql = ns.qualify(store::MIGRATIONS_LATEST);
    match conn.query_one(&*sql, &[]) {
        Ok(row) => Ok(row.get::<_, Option<i32>>(0)),
        Err(e) if matches!(e.sqlstate(), Some("42P01") | Some("3F000")) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Fails unless the schema is installed in `ns` and at least as new as this library.
pub(crate) fn check(conn: &mut Connection, ns: &Namespace) -> Result<i32> {
    match installed_version(conn, ns).map_err(|e| e.context("checking the schema version"))? {
        None => Err(Error::new(
            ErrorKind::SchemaMissing,
            format!(
                "schema not installed{}: run {}",
                ns.in_schema(),
                ns.migrate_command()
            ),
        )),
        Some(v) if v < LATEST => Err(Error::new(
            ErrorKind::SchemaOutdated,
            format!(
                "schema{} is older than this library (version {v}, need {LATEST}): run {}",
                ns.in_schema(),
                ns.migrate_command()
            ),
        )),
        Some(v) => {
            if v > LATEST {
                log::warn!(
                    "schema version {v}{} is newer than this library ({LATEST}); continuing, \
                     but upgrade postpone",
                    ns.in_schema()
                );
            }
            Ok(v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order_and_latest_is_last() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            if i > 0 {
                assert!(m.version > MIGRATIONS[i - 1].version, "{}", m.name);
            }
            assert!(!m.sql.trim().is_empty());
        }
        assert_eq!(MIGRATIONS.last().unwrap().version, LATEST);
    }
}
