//! Installing and inspecting postpone's schema: the migrations' bookkeeping, adoption of
//! tables installed elsewhere, and the catalogue reads of `grants`.

/// Every postpone object in the schema of `postpone_migrations` (as the search path finds
/// it), with what the rules need to know: relations, then functions, then types, by name.
pub(crate) const SCHEMA_OBJECTS: &str = r"
WITH ns AS (
    SELECT c.relnamespace AS oid FROM pg_class c WHERE c.oid = to_regclass('postpone_migrations')
)
SELECT 'r' AS what, c.relkind::text AS kind, c.relname::text AS name, '' AS args,
       EXISTS (SELECT 1 FROM pg_depend d
                WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                  AND d.refobjsubid > 0 AND d.deptype IN ('a', 'i')) AS flag1,
       EXISTS (SELECT 1 FROM pg_depend d
                WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                  AND d.refobjsubid > 0 AND d.deptype = 'i') AS flag2,
       false AS flag3, false AS flag4
  FROM pg_class c, ns
 WHERE c.relnamespace = ns.oid AND c.relname LIKE 'postpone\_%'
UNION ALL
SELECT 'f', p.prokind::text, p.proname::text, pg_get_function_identity_arguments(p.oid),
       p.prorettype = 'trigger'::regtype, p.prosecdef, p.provolatile = 'v', false
  FROM pg_proc p, ns
 WHERE p.pronamespace = ns.oid AND p.proname LIKE 'postpone\_%'
UNION ALL
SELECT 't', t.typtype::text, t.typname::text, '', false, false, false, false
  FROM pg_type t, ns
 WHERE t.typnamespace = ns.oid AND t.typname LIKE 'postpone\_%' AND t.typrelid = 0
ORDER BY 1, 3, 4";

/// Describes the postpone objects of schema `$1`: columns, constraints, indexes and
/// triggers, one text per object, with the schema's name taken out.
pub(crate) const SCHEMA_SHAPE: &str = r"
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
  FROM pg_class c
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
 WHERE c.relnamespace = $1::text::regnamespace AND c.relkind = 'r' AND c.relname LIKE 'postpone\_%'
   AND c.relname <> 'postpone_migrations'
UNION ALL
SELECT 'constraint ' || c.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid)
  FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
 WHERE c.relnamespace = $1::text::regnamespace AND c.relname LIKE 'postpone\_%'
   AND c.relname <> 'postpone_migrations'
UNION ALL
SELECT 'index ' || replace(pg_get_indexdef(i.indexrelid), quote_ident($1::text) || '.', '')
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
 WHERE c.relnamespace = $1::text::regnamespace AND c.relname LIKE 'postpone\_%'
   AND c.relname <> 'postpone_migrations'
UNION ALL
SELECT 'trigger ' || replace(pg_get_triggerdef(t.oid), quote_ident($1::text) || '.', '')
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = $1::text::regnamespace AND c.relname LIKE 'postpone\_%' AND NOT t.tgisinternal
UNION ALL
SELECT 'function ' || p.proname || ' ' || md5(p.prosrc)
  FROM pg_proc p
 WHERE p.pronamespace = $1::text::regnamespace AND p.proname LIKE 'postpone\_%'";

/// Whether `postpone_migrations` and `postpone_jobs` are found on the search path.
pub(crate) const SCHEMA_TABLES_FOUND: &str =
    "SELECT to_regclass('postpone_migrations') IS NOT NULL,
                        to_regclass('postpone_jobs') IS NOT NULL";

/// The schema that holds the `postpone_jobs` the search path finds.
pub(crate) const SCHEMA_OF_JOBS: &str = "SELECT relnamespace::regnamespace::text FROM pg_class
              WHERE oid = to_regclass('postpone_jobs')";

/// Creates the scratch schema an adoption installs a fresh copy in, first on the search path
/// for the transaction (which is rolled back).
pub(crate) const SCHEMA_SCRATCH_CREATE: &str =
    "CREATE SCHEMA postpone_adopt_scratch; SET LOCAL search_path = postpone_adopt_scratch";

/// Records migration `$1` named `$2` as applied, unless it is recorded already.
pub(crate) const MIGRATION_RECORD_MISSING: &str =
    "INSERT INTO postpone_migrations (version, name) VALUES ($1, $2)
             ON CONFLICT (version) DO NOTHING";

/// Records migration `$1` named `$2` as applied.
pub(crate) const MIGRATION_RECORD: &str =
    "INSERT INTO postpone_migrations (version, name) VALUES ($1, $2)";

/// Whether schema `$1` exists.
pub(crate) const SCHEMA_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)";

/// Whether `postpone_migrations` is found on the search path.
pub(crate) const MIGRATIONS_TABLE_FOUND: &str =
    "SELECT to_regclass('postpone_migrations') IS NOT NULL";

/// The first of postpone's functions in schema `$1` whose `search_path` is not pinned
/// (NULL: none).
pub(crate) const SCHEMA_UNPINNED_FUNCTION: &str = "SELECT min(p.proname::text) FROM pg_proc p
                  WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1)
                    AND p.prokind = 'f' AND p.proname LIKE 'postpone\\_%'
                    AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) c
                                     WHERE c LIKE 'search_path=%')";

/// The versions of the migrations applied.
pub(crate) const MIGRATIONS_APPLIED: &str = "SELECT version FROM postpone_migrations";

/// The latest migration applied (NULL: none); fails when the table is missing.
pub(crate) const MIGRATIONS_LATEST: &str = "SELECT max(version) FROM postpone_migrations";

/// The current database and the schema of the `postpone_migrations` the search path finds
/// (NULL: not installed).
pub(crate) const SCHEMA_LOCATION: &str = "SELECT current_database()::text,
                    (SELECT c.relnamespace::regnamespace::text FROM pg_class c
                      WHERE c.oid = to_regclass('postpone_migrations'))";

/// Takes transaction-scoped advisory lock `$1` (the migration lock): one migrator at a time.
pub(crate) const MIGRATE_LOCK_TAKE: &str = "SELECT pg_advisory_xact_lock($1)";
