//! A job's attempts as the worker records them: the claim, the start of held jobs, the
//! outcomes (final ones through `postpone_finish`, the way back to `todo` through
//! `postpone_requeue`), expiry, and the release of claims whose reply was lost; then the
//! claim and finish of `testing`, which runs jobs in the test's own thread.

/// Claims due jobs for a worker through `postpone_claim_batch`.
///
/// Parameters: `$1` the worker's id, `$2` the most jobs to take, `$3` its queues and `$4` its
/// task names (each NULL: no filter), `$5` how many of them it can start at once (its free
/// threads).
///
/// Order: highest priority first, then the earliest due, then the oldest; rows other
/// claimers hold locked are skipped, and a job whose `lock` has a running job or an older
/// pending one is never taken, nor one past its deadline. The function fixes the plan (an
/// ordered walk of the due-jobs index) whatever the table's statistics say.
///
/// Result, one row per job: id, queue, task, args, attempts (this one counted), priority,
/// lock, abort requested, scheduled time, time it waited, its own attempt limit (NULL:
/// none), then `db_now` and `next_due` (below), `held`, and its deadline as seconds from the
/// claim's `now()` (NULL: none). The jobs are *held*: their attempt is counted, `started_at`
/// stays NULL and every view shows them waiting until the worker writes their start
/// ([`JOB_START`], or with their outcome). In a queue with a concurrency limit the claim
/// takes at most `$5` jobs and starts them (`held` false).
///
/// `db_now` is the database's `now()` in µs since the epoch; `next_due`, when the claim took
/// fewer than `$2` jobs, is when the earliest job of the worker's queues not due yet will be
/// due (`postpone_next_due`), or when a rate limit holding back due jobs of those queues
/// next allows a start (at least 1 ms ahead), capped at 9e18 µs (times up to the year
/// 294,276 overflow a bigint of µs). Both use the claim's `now()`, so a job is either
/// claimable or counted in `next_due`, never neither. A claim that takes nothing returns one
/// row with only those two (NULL id). `n` is materialized so they are computed once per
/// claim, not once per job. See `worker/due.rs`.
///
/// `$6` is the claim's byte budget (schema version 27): the jobs come in claim order while
/// their arguments, as JSON text, fit in it; `$7` whether a first job larger than it may
/// come alone (the worker holds no job waiting). The last column, `cut`, says whether the
/// claim left a job waiting for its size (set by the function, read once `n` made `c` run).
///
/// `$8` (schema version 48): the jobs that need no row of their own while they run are
/// only locked, `locked` true, left `todo` for [`LOCKED_SETTLE`] to write in the same
/// transaction, which stays open; `xid` is that transaction's id (NULL: it locked nothing)
/// and `pid` the server process of the session.
///
/// Guard: nothing is claimed when the worker's row is gone (it was presumed dead): it must
/// register again, under a new id, first.
pub(crate) const JOB_CLAIM: &str = "
WITH c AS MATERIALIZED (
    SELECT * FROM postpone_claim_batch($1::bigint, $2::int, $3::text[], $4::text[], $5::int,
                                      $6::bigint, $7::boolean, $8::boolean)
), n AS MATERIALIZED (
        SELECT floor(extract(epoch FROM now()) * 1000000)::bigint AS db_now,
               CASE WHEN (SELECT count(*) FROM c) < $2::int
                    THEN least(9000000000000000000, floor(extract(epoch FROM least(
                             postpone_next_due($3::text[]),
                             (SELECT now() + greatest(w.s, 0.001) * interval '1 second'
                                FROM postpone_rate_wait(ARRAY(
                                         SELECT r.queue FROM postpone_rate_limits r
                                          WHERE ($3::text[] IS NULL OR r.queue = ANY($3::text[]))
                                            AND (EXISTS (
                                                SELECT 1 FROM postpone_jobs d
                                                 WHERE d.queue = r.queue AND d.status = 'todo'
                                                   AND d.blocked_by IS NULL
                                                   AND d.expires_at IS NULL
                                                   AND d.scheduled_at <= now())
                                            OR EXISTS (
                                                SELECT 1 FROM postpone_jobs d
                                                 WHERE d.queue = r.queue AND d.status = 'todo'
                                                   AND d.blocked_by IS NULL
                                                   AND d.expires_at IS NOT NULL
                                                   AND d.scheduled_at <= now()
                                                   AND d.scheduled_at > postpone_expiring_from()
                                                   AND d.expires_at > now())))) AS w(s)
                               WHERE w.s IS NOT NULL
                                 -- Checked first (a one-time filter): without rate limits,
                                 -- the function is not called (0.2 ms a claim).
                                 AND EXISTS (SELECT 1 FROM postpone_rate_limits)))) * 1000000))::bigint
               END AS next_due
)
SELECT c.id, c.queue, c.task, c.args, c.attempts, c.priority, c.lock, c.abort_requested,
       c.scheduled_at, c.queue_wait, c.max_attempts, n.db_now, n.next_due, c.held,
       c.expires_in, current_setting('postpone.cut', true) IS NOT DISTINCT FROM 'on' AS cut,
       c.locked, pg_current_xact_id_if_assigned()::text AS xid, pg_backend_pid() AS pid
  FROM n LEFT JOIN c ON true";
/// Writes the jobs a lock-only claim took (`JOB_CLAIM` with `$8` true), each once, through
/// `postpone_settle_locked`: `$1` the worker, `$2` the claim's transaction id (the current
/// one, or one that was lost), then aligned arrays: `$3` ids, `$4` attempts (as the claim
/// gave them), `$5` what to write (`succeeded`, `running`, `held`), `$6` outputs (NULL: none),
/// `$7` how long ago each started (µs; NULL: not started). Returns the ids written.
pub(crate) const LOCKED_SETTLE: &str = "
SELECT id FROM postpone_settle_locked($1::bigint, $2::text::xid8, $3::bigint[], $4::int[],
                                      $5::text[], $6::jsonb[], $7::bigint[]) AS s(id)";

/// Notes the worker's open transactions of lock-only claims (`$2`, their ids as text) and
/// the jobs they locked (ranges of ids, `$3` to `$4` each, both included) on its row, in
/// place of its note before; committed before any of them starts. False: the worker's row
/// is gone (presumed dead).
pub(crate) const CLAIM_NOTE: &str =
    "SELECT postpone_note_claim($1::bigint, $2::text[]::xid8[], $3::bigint[], $4::bigint[])";

/// Takes the lost transaction `$2` (its id as text), whose jobs the worker has written, off
/// the worker `$1`'s note.
pub(crate) const CLAIM_UNNOTE: &str = "SELECT postpone_unnote_claim($1::bigint, $2::text::xid8)";

/// What became of a transaction (`$1`, a full transaction id as text): `in progress`,
/// `committed`, `aborted`, or NULL when it is too old to know.
pub(crate) const XACT_STATUS: &str = "SELECT pg_xact_status($1::text::xid8)";

/// Ends the server process `$1` (the fetcher's old session, still holding a lost claim's
/// transaction open); a role may end its own sessions.
pub(crate) const END_SESSION: &str = "SELECT pg_terminate_backend($1::int)";

/// Writes the start of held jobs that started, through `postpone_start`: arrays `$1` ids,
/// `$2` and `$3` each attempt's fence (worker id, attempt number), `$4` how long ago it
/// started (µs). A row
/// another session holds locked is skipped: its start is written with its outcome. Returns
/// the ids written.
pub(crate) const JOB_START: &str = "
SELECT id FROM postpone_start($1::bigint[], $2::bigint[], $3::int[], $4::bigint[]) AS s(id)";

/// Records the final outcomes of many attempts at once through `postpone_finish`.
///
/// Parameters, aligned arrays: `$1` job ids, `$2` and `$3` the fence of each attempt (the
/// worker id that claimed it and the attempt number the claim gave it), `$4` the outcome
/// (`succeeded`, `failed`, `cancelled`, `aborted`, `expired`, `delete`), `$5` error text
/// (appended to the job's errors), `$6` output (kept with `succeeded` only, see
/// `Job::set_output`), `$7` for a job whose start was not written yet, how long ago it
/// started in µs (NULL: it never started, and its attempt is given back).
///
/// Result: the ids whose outcome was recorded. A missing id was no longer that attempt's
/// (it was requeued after its worker was presumed dead, and maybe claimed again).
///
/// Guard: a row is touched only while it is `doing` under that fence. The table is the
/// truth about aborts: a job whose abort was recorded while it ran ends `aborted` whatever
/// its task returned, with a note in its errors, and is never deleted then. Final statuses
/// are in no unique index and the caller makes error texts safe (no NUL, bounded length),
/// so one outcome cannot fail the others. Outcomes that put a job back in the queue go
/// through [`JOB_REQUEUE`] instead.
///
/// Plan: the function drives from the outcomes and reaches each row by its primary key
/// (its guards use `IS NOT DISTINCT FROM`, which no index serves, so the planner cannot
/// loop over the partial index of `doing` rows once per outcome).
pub(crate) const JOB_FINISH_BATCH: &str = "
SELECT id FROM postpone_finish($1::bigint[], $2::bigint[], $3::int[], $4::text[], $5::text[],
                               $6::jsonb[], $7::bigint[]) AS f(id)";

/// Puts jobs back in the queue through `postpone_requeue`, the one definition every path back
/// to `todo` uses: arrays `$1` ids, `$2` workers and `$3` attempts
/// (the fences; empty: no guard), `$4` delays in microseconds, `$5` error texts, `$6` whether
/// each attempt is given back. Returns (id, outcome) for each job changed: `todo`, `aborted`
/// (its abort was requested), `superseded` (another job of its queueing lock waits).
pub(crate) const JOB_REQUEUE: &str = "
SELECT job_id, outcome
  FROM postpone_requeue($1::bigint[], $2::bigint[], $3::int[], $4::bigint[], $5::text[],
                        $6::boolean[])";

/// Snoozes attempts through `postpone_snooze`: back to `todo` through
/// `postpone_requeue`, due after `$4` microseconds, the attempt given back, one more snooze
/// counted. Arrays `$1` ids, `$2` workers and `$3` attempts (the fences). Returns what
/// [`JOB_REQUEUE`] returns.
pub(crate) const JOB_SNOOZE: &str = "
SELECT job_id, outcome
  FROM postpone_snooze($1::bigint[], $2::bigint[], $3::int[], $4::bigint[])";

/// The last resort for an outcome the database refused (a trigger of the user's, say): the
/// attempt `$1`/`$2`/`$3` ends `failed` with error `$4`, a text of ours. Returns its id.
pub(crate) const JOB_FAIL_UNRECORDABLE: &str = "
UPDATE postpone_jobs j
   SET status = 'failed', finished_at = now(),
       errors = coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(
           jsonb_build_object('attempt', j.attempts, 'at', now(), 'error', $4::text))
 WHERE j.id = $1 AND j.status = 'doing' AND j.worker_id = $2 AND j.attempts = $3
RETURNING j.id";

/// Status, worker and attempts of the jobs `$1` (to explain outcomes a guarded update did not
/// apply).
pub(crate) const JOB_STATES: &str =
    "SELECT id, status, worker_id, attempts FROM postpone_jobs WHERE id = ANY($1::bigint[])";

/// The database's clock minus `$1` milliseconds: the cutoff of [`JOB_LOST_CLAIMS_RELEASE`],
/// read before the worker takes the set of jobs it holds.
pub(crate) const LOST_CLAIMS_CUTOFF: &str = "SELECT now() - $1::bigint * interval '1 millisecond'";

/// Gives back the jobs `doing` under worker `$1` that it does not hold (`$2`): a claim that
/// committed but whose reply was lost (connection reset or stranded) left them there, and
/// no rescue would ever touch them while the worker lives. Only rows claimed before `$3`
/// (see [`LOST_CLAIMS_CUTOFF`]), so a claim whose reply is still on its way is never
/// touched. They never ran: their attempt is given back. Wakes listening workers. Returns
/// the ids given back.
pub(crate) const JOB_LOST_CLAIMS_RELEASE: &str = "
WITH lost AS (
    SELECT j.id, j.attempts
      FROM postpone_jobs j
     WHERE j.worker_id = $1 AND j.status = 'doing'
       AND coalesce(j.claimed_at, j.started_at) < $3::timestamptz
       AND NOT (j.id = ANY($2::bigint[]))
)
SELECT coalesce(array_agg(r.job_id), '{}'::bigint[])
  FROM postpone_requeue(ARRAY(SELECT id FROM lost ORDER BY id),
                        ARRAY(SELECT $1::bigint FROM lost ORDER BY id),
                        ARRAY(SELECT attempts FROM lost ORDER BY id),
                        '{}', '{}',
                        ARRAY(SELECT true FROM lost ORDER BY id)) r";

/// Ends up to `$1` waiting jobs past their deadline, earliest first from deadline `$2` on
/// (NULL: the earliest), as `cancelled`, `expired` (`postpone_expire`),
/// skipping rows others hold locked. Returns how many it ended (`$1`: there may be more) and
/// the latest deadline among them (the next call's `$2` while a backlog lasts).
pub(crate) const JOB_EXPIRE: &str =
    "SELECT ended, reached FROM postpone_expire($1::int, $2::timestamptz)";

/// The newest job id (0 when there is none).
#[cfg(feature = "test-util")]
pub(crate) const TESTING_MARK: &str = "SELECT coalesce(max(id), 0)::bigint FROM postpone_jobs";

/// Jobs with an id above `$1`, oldest first.
#[cfg(feature = "test-util")]
pub(crate) const TESTING_DEFERRED: &str = "
SELECT id, task, args, queue, priority, lock, queueing_lock, scheduled_at, status
  FROM postpone_jobs WHERE id > $1 ORDER BY id";

/// Claims the next waiting job with an id above `$1`, due now unless `$2`, highest priority
/// first then oldest; never one past its deadline, as a worker's claim.
#[cfg(feature = "test-util")]
pub(crate) const TESTING_CLAIM: &str = "
UPDATE postpone_jobs
   SET status = 'doing', attempts = attempts + 1, started_at = now()
 WHERE id = (SELECT id FROM postpone_jobs
              WHERE status = 'todo' AND id > $1 AND ($2 OR scheduled_at <= now())
                AND (expires_at IS NULL OR expires_at > now())
              ORDER BY priority DESC, id
              LIMIT 1
                FOR UPDATE SKIP LOCKED)
RETURNING id, queue, task, args, attempts, priority, lock, max_attempts";

/// Opens the transaction of a claim that carries outcomes ([`JOB_FINISH_BATCH`] then
/// [`JOB_CLAIM`]): a job row another session holds locked makes it fail after 100 ms (the
/// claim then goes again alone; the outcomes go to the completer) rather than wait.
pub(crate) const CLAIM_WITH_FINISH_BEGIN: &str = "BEGIN; SET LOCAL lock_timeout = '100ms'";

/// Opens the transaction of a lock-only claim (`JOB_CLAIM` with `$8` true), which stays open
/// while its jobs run. A claim that waits for a lock gives up after 200 ms: the worker's
/// other claiming connection may hold one (the pauses' shared lock, with a pause waiting
/// for it) until this claim's round-trip ends. A session its worker lost (a half-open link)
/// is ended by the server after a minute idle in the transaction, if the worker has not
/// ended it first.
pub(crate) const LOCKED_BEGIN: &str = "BEGIN; SET LOCAL lock_timeout = '200ms'; \
SET LOCAL idle_in_transaction_session_timeout = '60s'";
