-- postpone schema, version 28: workflows.
--
-- A workflow is a named graph of jobs inserted together: each job runs after the jobs of
-- the workflow it names, through the dependencies of version 23 (the triggers there release
-- or cancel a dependent in the statement that records its last dependency's outcome). This
-- version only records which jobs belong to which workflow, so that a workflow can be
-- inspected, cancelled and retried as a whole.
--
-- * postpone_workflows: one row per workflow, its name and when it was inserted.
-- * postpone_workflow_jobs: one row per member job, with the name of its step (NULL when
--   the step was not named). Kept apart from postpone_jobs: a job outside a workflow has
--   no row here, no column and no index entry, so neither its defer nor its claim nor its
--   finish does anything more than before. A member's row stays when retention or
--   `DeleteJobs` deletes its job, so the workflow still counts it (as deleted).
--
-- Only additions: two tables. Workers of earlier versions ignore them.

CREATE TABLE IF NOT EXISTS postpone_workflows (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS postpone_workflow_jobs (
    job_id      bigint NOT NULL PRIMARY KEY,
    workflow_id bigint NOT NULL
                REFERENCES postpone_workflows (id) ON DELETE CASCADE,
    step        text
);
-- The members of a workflow, in id order (inspect, cancel, retry: one index scan).
CREATE INDEX IF NOT EXISTS postpone_workflow_jobs_workflow_idx
    ON postpone_workflow_jobs (workflow_id, job_id);
