-- postpone schema, version 26: periodic schedules stored in the database.
--
-- A row of postpone_schedules is a periodic schedule that operators create, change, pause
-- and delete at runtime (Admin::set_schedule and friends, `postpone schedule ...`, the
-- dashboard). Every worker that registers the row's task reads the rows of its tasks (the
-- beat thread compares a fingerprint, count and highest revision, every poll interval) and
-- defers the instants through the same statement as the schedules given in code, so each
-- instant is still deferred once across all workers by the primary key of
-- postpone_periodic (task, periodic_id, instant).
--
-- * revision: a new value from the identity sequence at every change (`SET revision =
--   DEFAULT`), so that (count, max(revision)) changes with every insert, update and delete.
-- * since: the instant from which the schedule counts. Set when it is created, when its cron
--   expression or time zone changes, and when it is resumed: instants at or before it are
--   never deferred (no flood after a pause or a change), and instants after it that no
--   worker deferred yet are caught up within catch_up_ms.
-- * paused_at: set while paused; a paused schedule defers nothing.
-- * A row with the (task, periodic_id) of a schedule given in a worker's code replaces that
--   schedule on the worker while the row exists (a paused row pauses it).
--
-- Only additions: one table. Workers of earlier versions ignore it.

CREATE TABLE IF NOT EXISTS postpone_schedules (
    task          text        NOT NULL,
    periodic_id   text        NOT NULL DEFAULT '',
    cron          text        NOT NULL,
    time_zone     text,
    args          jsonb       NOT NULL DEFAULT 'null',
    queue         text,
    priority      integer,
    lock          text,
    queueing_lock text,
    catch_up_ms   bigint      NOT NULL DEFAULT 600000,
    paused_at     timestamptz,
    since         timestamptz NOT NULL DEFAULT now(),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    revision      bigint      GENERATED ALWAYS AS IDENTITY,
    CONSTRAINT postpone_schedules_pkey PRIMARY KEY (task, periodic_id),
    CONSTRAINT postpone_schedules_task CHECK (task <> ''),
    CONSTRAINT postpone_schedules_cron CHECK (cron <> ''),
    CONSTRAINT postpone_schedules_catch_up CHECK (catch_up_ms BETWEEN 0 AND 86400000)
);
