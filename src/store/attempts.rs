//! A job's attempts as the worker records them: the claim, the start of held jobs, the
//! outcomes (final ones through `postpone_finish`, the way back to `todo` through
//! `postpone_requeue`), expiry, and the release of claims whose reply was lost; then the
//! claim and finish of `testing`, which runs jobs in the test's own thread.

/// Claims up to `$2` due jobs for worker `$1` through `postpone_claim_jobs` (schema version 12;
/// `postpone_claim` of version 3 and later, which returns the same less the attempt limit):
/// highest priority first, then the earliest due, then the oldest; skipping rows other
/// claimers hold, and never a job whose lock has a running job or an older pending one. `$3`
/// the worker's queues and `$4` its task names (each NULL: no filter). Nothing is claimed if
/// the worker's row is gone (it was presumed dead): it must register again first. The
/// function fixes the plan (an ordered walk of the due-jobs index; see migration 3),
/// whatever the table's statistics say.
///
/// Each job's own attempt limit (schema version 5) comes with it, or NULL (none), and its
/// deadline as seconds from the claim's `now()` (schema version 25; NULL: none). The claim
/// never takes a job past its deadline.
///
/// `$5` is how many of the jobs the worker can start at once (its free threads). The jobs
/// are *held* (schema version 20): counted as attempts, `started_at` NULL, shown as waiting
/// by every view until the worker writes their start ([`JOB_START`], or with their outcome);
/// the last column says so. In a queue with a limit the claim takes at most `$5` jobs and
/// starts them (`held` false).
///
/// Every row also carries the database's `now()` and, when the claim took fewer jobs than
/// asked, when the earliest job of the worker's queues not due yet will be due
/// (`postpone_next_due`, schema version 9), both in µs since the epoch: the same `now()` as
/// the claim's, so a job is either claimable or counted there, never neither. When a rate
/// limit of one of those queues holds its due jobs back (schema version 8), the time its
/// next start is allowed counts as a due time too (`postpone_rate_wait`, over the
/// rate-limited queues that have due jobs; at least 1 ms ahead, since the start may have
/// become allowed between the claim's look and this one), so that the worker comes back then
/// rather than at its next poll. A claim that takes nothing returns one row
/// with only those (NULL id). See `worker/due.rs`. Those two are computed once per claim
/// (`n` is materialized): as a plain subquery, the planner pulled them into the join and
/// called `postpone_next_due` once per job returned. The due time is capped at 9e18 µs
/// (about the year 287,000): PostgreSQL stores times up to the year 294,276, past what a
/// bigint holds in µs, and a job moved there by hand would otherwise make every claim that
/// takes fewer jobs than it asks for fail.
pub(crate) const JOB_CLAIM: &str = "
WITH c AS MATERIALIZED (
    SELECT * FROM postpone_claim_jobs($1::bigint, $2::int, $3::text[], $4::text[], $5::int)
), n AS MATERIALIZED (
        SELECT floor(extract(epoch FROM now()) * 1000000)::bigint AS db_now,
               CASE WHEN (SELECT count(*) FROM c) < $2::int
                    THEN least(9000000000000000000, floor(extract(epoch FROM least(
                             postpone_next_due($3::text[]),
                             (SELECT now() + greatest(w.s, 0.001) * interval '1 second'
                                FROM postpone_rate_wait(ARRAY(
                                         SELECT r.queue FROM postpone_rate_limits r
                                          WHERE ($3::text[] IS NULL OR r.queue = ANY($3::text[]))
                                            AND EXISTS (
                                                SELECT 1 FROM postpone_jobs d
                                                 WHERE d.queue = r.queue AND d.status = 'todo'
                                                   AND d.blocked_by IS NULL
                                                   AND d.scheduled_at <= now()))) AS w(s)
                               WHERE w.s IS NOT NULL
                                 -- Checked first (a one-time filter): without rate limits,
                                 -- the function is not called (0.2 ms a claim).
                                 AND EXISTS (SELECT 1 FROM postpone_rate_limits)))) * 1000000))::bigint
               END AS next_due
)
SELECT c.id, c.queue, c.task, c.args, c.attempts, c.priority, c.lock, c.abort_requested,
       c.scheduled_at, c.queue_wait, c.max_attempts, n.db_now, n.next_due, c.held,
       c.expires_in
  FROM n LEFT JOIN c ON true";

/// Writes the start of held jobs that started (schema version 20, `postpone_start`): arrays
/// `$1` ids, `$2` and `$3` each attempt's fence, `$4` how long ago it started (µs). A row
/// another session holds locked is skipped: its start is written with its outcome. Returns
/// the ids written.
pub(crate) const JOB_START: &str = "
SELECT id FROM postpone_start($1::bigint[], $2::bigint[], $3::int[], $4::bigint[]) AS s(id)";

/// Records the final outcomes of many attempts at once through `postpone_finish` (schema
/// version 12; the statement itself is there, planned once per session). Arrays: `$1` job
/// ids, `$2` and `$3` the fence of each attempt (the worker identity that claimed it and the
/// attempt number the claim gave it), `$4` outcome (`succeeded`, `failed`, `cancelled`,
/// `aborted`, `delete`), `$5` error text (appended to the job's errors), `$6` output (stored
/// with `succeeded` only, see `Job::set_output`). Returns the ids whose outcome was
/// recorded; a missing id was no longer that attempt's (it was requeued after its worker was
/// presumed dead, and maybe claimed again). Outcomes that put a job back in the queue go
/// through [`JOB_REQUEUE`] instead.
///
/// The plan drives from the outcomes and reaches each row by primary key, whatever the
/// statistics say: the guards are written with `IS NOT DISTINCT FROM`, which no index can
/// serve, so that the planner cannot scan the partial index on `doing` rows instead (it
/// estimates it at one row, then loops over every outcome for every row it finds: O(n²)).
/// Measured per batch of 1,000 before schema 12: with `=` guards, 4.4 s after 20,000 jobs
/// (dead index entries) and 334 ms with a million finished rows; with an `id = ANY($1)`
/// filter, 256 ms; as written, 12-16 ms in both cases.
///
/// Nothing here can collide with a unique index (final statuses are in none), and the error
/// texts are made safe by the caller (no NUL, bounded length).
///
/// The table is the truth about aborts: a job whose abort was recorded while it ran ends
/// `aborted` whatever its task returned, even if the worker never saw the request (its links
/// were down), with a note in its errors; it is never deleted then.
pub(crate) const JOB_FINISH_BATCH: &str = "
SELECT id FROM postpone_finish($1::bigint[], $2::bigint[], $3::int[], $4::text[], $5::text[],
                               $6::jsonb[], $7::bigint[]) AS f(id)";

/// Puts jobs back in the queue through `postpone_requeue` (schema version 2), the one
/// definition every path back to `todo` uses: arrays `$1` ids, `$2` workers and `$3` attempts
/// (the fences; empty: no guard), `$4` delays in microseconds, `$5` error texts, `$6` whether
/// each attempt is given back. Returns (id, outcome) for each job changed: `todo`, `aborted`
/// (its abort was requested), `superseded` (another job of its queueing lock waits).
pub(crate) const JOB_REQUEUE: &str = "
SELECT job_id, outcome
  FROM postpone_requeue($1::bigint[], $2::bigint[], $3::int[], $4::bigint[], $5::text[],
                        $6::boolean[])";

/// Snoozes attempts through `postpone_snooze` (schema version 5): back to `todo` through
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
/// (NULL: the earliest), as `cancelled`, `expired` (schema version 25, `postpone_expire`),
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
/// first then oldest; never one past its deadline (schema version 25), as a worker's claim.
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
