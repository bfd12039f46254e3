//! Workflows: a workflow's row and its members (`postpone_workflows`,
//! `postpone_workflow_jobs`), and the operations on a whole workflow.

/// A new workflow row named `$1`; its id.
pub(crate) const WORKFLOW_INSERT: &str =
    "INSERT INTO postpone_workflows (name) VALUES ($1) RETURNING id";

/// Workflow `$1` gets its jobs `$2`, their step names `$3` aligned with them.
pub(crate) const WORKFLOW_MEMBERS: &str = "
INSERT INTO postpone_workflow_jobs (job_id, workflow_id, step)
SELECT m.job_id, $1, m.step FROM unnest($2::bigint[], $3::text[]) AS m(job_id, step)";

/// The workflow of job `$1`, if it is in one.
pub(crate) const WORKFLOW_OF_JOB: &str =
    "SELECT workflow_id FROM postpone_workflow_jobs WHERE job_id = $1";

/// Workflow `$1`: its row, and its members counted by state (a job held by a worker but not
/// started waits; a member whose job row is gone is deleted).
pub(crate) const WORKFLOW_GET: &str = "
SELECT f.id, f.name, f.created_at, c.total,
       c.waiting, c.running, c.succeeded, c.failed, c.cancelled, c.aborted
  FROM postpone_workflows f
 CROSS JOIN LATERAL (
       SELECT count(*) AS total,
              count(*) FILTER (WHERE j.status = 'todo'
                                  OR (j.status = 'doing' AND j.started_at IS NULL)) AS waiting,
              count(*) FILTER (WHERE j.status = 'doing' AND j.started_at IS NOT NULL) AS running,
              count(*) FILTER (WHERE j.status = 'succeeded') AS succeeded,
              count(*) FILTER (WHERE j.status = 'failed') AS failed,
              count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled,
              count(*) FILTER (WHERE j.status = 'aborted') AS aborted
         FROM postpone_workflow_jobs w
         LEFT JOIN postpone_jobs j ON j.id = w.job_id
        WHERE w.workflow_id = f.id) c
 WHERE f.id = $1";

/// The first `$2` members of workflow `$1` by id: id, step name, task, queue, status as
/// every view shows it (NULL: deleted), whether it waits for its dependencies, its last
/// error, and the jobs it runs after (`after`, then `after_finished`), by id.
pub(crate) const WORKFLOW_JOBS: &str = "
SELECT w.job_id, w.step, j.task, j.queue,
       CASE WHEN j.status = 'doing' AND j.started_at IS NULL THEN 'todo' ELSE j.status END,
       coalesce(j.has_dependencies AND j.status = 'todo' AND j.scheduled_at = 'infinity', false),
       CASE WHEN jsonb_typeof(j.errors) = 'array' THEN j.errors -> -1 ->> 'error' END,
       ARRAY(SELECT d.dep_id FROM postpone_deps d
              WHERE d.job_id = w.job_id AND NOT d.any_outcome ORDER BY d.dep_id),
       ARRAY(SELECT d.dep_id FROM postpone_deps d
              WHERE d.job_id = w.job_id AND d.any_outcome ORDER BY d.dep_id)
  FROM postpone_workflow_jobs w
  LEFT JOIN postpone_jobs j ON j.id = w.job_id
 WHERE w.workflow_id = $1
 ORDER BY w.job_id
 LIMIT $2";

/// Cancels workflow `$1`: its waiting members (`todo`) become `cancelled`, with an error
/// saying why; its members held or running get `abort_requested` and their workers are told
/// (`abort:<id>` on channel `$2`; a held job ends aborted without running). Members are
/// locked in id order first. Returns how many were cancelled and how many asked to abort.
pub(crate) const WORKFLOW_CANCEL: &str = "
WITH m AS (
    SELECT j.id FROM postpone_jobs j
     WHERE j.id IN (SELECT w.job_id FROM postpone_workflow_jobs w WHERE w.workflow_id = $1)
       AND j.status IN ('todo', 'doing')
     ORDER BY j.id
       FOR UPDATE
), a AS (
    UPDATE postpone_jobs j
       SET status = CASE WHEN j.status = 'todo' THEN 'cancelled' ELSE j.status END,
           finished_at = CASE WHEN j.status = 'todo' THEN now() ELSE j.finished_at END,
           abort_requested = (j.status = 'doing'),
           cancel_requested = false,
           errors = CASE WHEN j.status = 'todo'
                         THEN coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                             'attempt', j.attempts, 'at', now(),
                             'error', format('cancelled with its workflow %s', $1::bigint)))
                         ELSE j.errors END
      FROM m
     WHERE j.id = m.id AND j.status IN ('todo', 'doing')
    RETURNING j.id, j.status
)
SELECT count(*) FILTER (WHERE a.status = 'cancelled'),
       count(*) FILTER (WHERE a.status = 'doing'),
       (SELECT count(pg_notify($2::text, 'abort:' || a2.id)) FROM a a2
         WHERE a2.status = 'doing')
  FROM a";

/// Retries workflow `$1`: its failed, cancelled and aborted members, in id order, through
/// `postpone_requeue` (as `Admin::retry`, all in one call, so that a dependent retried with
/// its dependency waits for it). One row per member: its id and `todo`, `collision` (a job
/// of its queueing lock waits) or `error: ...` (refused: a dependency outside the retried
/// ones ended badly, say).
pub(crate) const WORKFLOW_RETRY: &str = "
SELECT r.job_id, r.outcome
  FROM postpone_requeue(
           ARRAY(SELECT j.id FROM postpone_workflow_jobs w JOIN postpone_jobs j ON j.id = w.job_id
                  WHERE w.workflow_id = $1 AND j.status IN ('failed', 'cancelled', 'aborted')
                  ORDER BY j.id),
           '{}', '{}', '{}', '{}', '{}', true) r";

/// Whether workflow `$1` exists.
pub(crate) const WORKFLOW_EXISTS: &str = "SELECT 1 FROM postpone_workflows WHERE id = $1";

/// The recent workflows, newest first: id, name, created_at, members, members not
/// finished.
pub(crate) const WORKFLOW_LIST: &str = "
SELECT f.id, f.name, f.created_at,
       (SELECT count(*) FROM postpone_workflow_jobs w WHERE w.workflow_id = f.id),
       (SELECT count(*) FROM postpone_workflow_jobs w JOIN postpone_jobs j ON j.id = w.job_id
         WHERE w.workflow_id = f.id AND j.status IN ('todo', 'doing'))
  FROM postpone_workflows f
 ORDER BY f.id DESC
 LIMIT $1";
