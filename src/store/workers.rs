//! Workers: their rows (register, heartbeat, list, forget), the controls they poll, the
//! rescue of dead workers' jobs and the retirement at shutdown; the stalled jobs the admin
//! API shows and fixes; the vacuum a worker runs on the jobs table.

/// Registers a worker; returns its id. `$6` and `$7` its heartbeat interval and
/// `stalled_after` in milliseconds (its lease), `$8` the task names it
/// claims (NULL: every task).
pub(crate) const WORKER_INSERT: &str = "
INSERT INTO postpone_workers (name, host, pid, queues, concurrency, heartbeat_interval_ms,
                              stalled_after_ms, tasks)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING id";

/// Refreshes a worker's heartbeat; 0 rows means the row is gone.
pub(crate) const WORKER_HEARTBEAT: &str =
    "UPDATE postpone_workers SET last_heartbeat = now() WHERE id = $1";

/// What the controls say to worker `$1`: one row per job it holds whose abort (`cancel`
/// false) or cancel (`cancel` true: an operator cancelled it while it was held) was
/// requested, and one row per paused queue (`id` NULL; `queue` NULL when every queue is
/// paused). The truth behind every abort, cancel and pause: a notification only makes the
/// worker look sooner.
pub(crate) const WORKER_CONTROL_POLL: &str = "
SELECT j.id, j.cancel_requested AND NOT j.abort_requested AS cancel, NULL::text AS queue
  FROM postpone_jobs j
 WHERE j.worker_id = $1 AND j.status = 'doing' AND (j.abort_requested OR j.cancel_requested)
UNION ALL
SELECT NULL, NULL, p.queue FROM postpone_paused_queues p";

/// Removes workers whose own lease has ended (their last heartbeat plus their own
/// `stalled_after`; `$1` milliseconds, the caller's, stands in for a worker row that
/// recorded no lease, see `postpone_lease_end`), never `$2` (the caller), and requeues their
/// running jobs, plus any running job whose worker row has been gone for `$1` milliseconds,
/// through `postpone_rescue`. Returns (workers removed, ids of the jobs touched, their
/// outcomes). Guard: only rows still `doing` under a worker deleted in the same statement
/// are touched, and one job can never fail the rescue of the others.
pub(crate) const WORKER_RESCUE: &str = "SELECT dead, ids, outcomes FROM postpone_rescue($1, $2)";

/// At shutdown: puts every job still `doing` under worker `$1` back in the queue (the
/// attempts of `$2`, never started, are given back; the others get the note `$3`), through
/// `postpone_retire`, and deletes the worker row. Returns (id, outcome) per job touched.
pub(crate) const WORKER_RETIRE: &str =
    "SELECT job_id, outcome FROM postpone_retire($1, $2::bigint[], $3)";

/// Running jobs of workers whose lease has ended (lengthened to at least `$1` ms), or whose
/// worker row is gone.
pub(crate) const STALLED_CONDITION: &str = "j.status = 'doing'
   AND NOT EXISTS (SELECT 1 FROM postpone_workers w
                    WHERE w.id = j.worker_id
                      AND postpone_lease_end(w.last_heartbeat, w.stalled_after_ms,
                                             $1::bigint, $1::bigint) >= now())";

pub(crate) const VACUUM_COUNTERS: &str = "
SELECT s.n_dead_tup, s.n_live_tup,
       CASE WHEN s.last_analyze IS NULL AND s.last_autoanalyze IS NULL THEN NULL
            ELSE s.n_mod_since_analyze END
  FROM pg_stat_user_tables s
 WHERE s.relid = 'postpone_jobs'::regclass";

/// Every worker row by id: id, name, host, pid, queues (NULL: every queue; NULL elements
/// dropped), concurrency, started, last heartbeat, its age in seconds, jobs it holds, its
/// heartbeat interval and `stalled_after` (ms), its tasks (NULL: every task), whether its
/// lease has ended (lengthened to at least `$1` ms), jobs it has started.
pub(crate) const WORKER_LIST: &str = "SELECT w.id, w.name, w.host, w.pid,
                    -- NULL is every queue; written by hand, the array may hold NULLs (or
                    -- have two dimensions), which no worker serves.
                    CASE WHEN w.queues IS NOT NULL
                         THEN ARRAY(SELECT q FROM unnest(w.queues) AS q WHERE q IS NOT NULL)
                    END,
                    w.concurrency, w.started_at,
                    w.last_heartbeat,
                    date_part('epoch', now()) - date_part('epoch', w.last_heartbeat),
                    coalesce(r.n, 0),
                    w.heartbeat_interval_ms, w.stalled_after_ms,
                    CASE WHEN w.tasks IS NOT NULL
                         THEN ARRAY(SELECT t FROM unnest(w.tasks) AS t WHERE t IS NOT NULL
                                     ORDER BY t)
                    END,
                    postpone_lease_end(w.last_heartbeat, w.stalled_after_ms, $1::bigint,
                                       $1::bigint) < now(),
                    coalesce(r.started, 0)
               FROM postpone_workers w
               -- One pass over the running jobs (postpone_jobs_doing_idx holds them by
               -- queue, then worker), rather than one per worker.
               LEFT JOIN (SELECT j.worker_id, count(*) AS n,
                                 count(*) FILTER (WHERE j.started_at IS NOT NULL) AS started
                            FROM postpone_jobs j
                           WHERE j.status = 'doing' GROUP BY j.worker_id) r
                      ON r.worker_id = w.id
              ORDER BY w.id";

/// How many workers have a lease that ended (lengthened to at least `$1` ms).
pub(crate) const WORKER_STALE_COUNT: &str = "SELECT count(*) FROM postpone_workers
              WHERE postpone_lease_end(last_heartbeat, stalled_after_ms, $1::bigint,
                                       $1::bigint) < now()";

/// Deletes the workers counted by [`WORKER_STALE_COUNT`] (their jobs stay as they are).
/// Returns how many.
pub(crate) const WORKER_STALE_DELETE: &str = "WITH d AS (DELETE FROM postpone_workers
                         WHERE postpone_lease_end(last_heartbeat, stalled_after_ms, $1::bigint,
                                                  $1::bigint) < now()
                        RETURNING id)
             SELECT count(*) FROM d";

/// Whether the session's role may act as the owner of `postpone_jobs` (which a vacuum
/// needs).
pub(crate) const JOBS_TABLE_OWNED: &str = "SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c
              WHERE c.oid = 'postpone_jobs'::regclass";

/// The session's role.
pub(crate) const CURRENT_ROLE: &str = "SELECT current_user::text";
