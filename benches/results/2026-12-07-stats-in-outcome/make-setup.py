#!/usr/bin/env python3
"""Prints the --setup SQL of the experiment in this directory: the statistics counted by the
outcome statement (postpone_finish, 7 arguments) instead of its trigger, which skips the
statement's rows while `postpone.counted` is on at trigger depth 1. Built from the functions
of schema 49 as they stood at 7c5dbcc, so that only the changes live here:

    benches/instructions.sh --setup "$(python3 benches/results/2026-12-07-stats-in-outcome/make-setup.py)"
"""
import subprocess

SRC = subprocess.run(
    ["git", "show", "7c5dbcc:src/schema/present/functions.sql"],
    check=True, capture_output=True, text=True,
).stdout


def function(start):
    i = SRC.index(start)
    return SRC[i:SRC.index("$function$;", i) + len("$function$;")]


def edit(text, old, new):
    assert old in text, old
    return text.replace(old, new, 1)


record = edit(
    function("CREATE OR REPLACE FUNCTION public.postpone_stats_record()"),
    "BEGIN\n    -- The finished jobs of this statement,",
    "BEGIN\n"
    "    IF pg_trigger_depth() = 1 AND current_setting('postpone.counted', true) = 'on' THEN\n"
    "        RETURN NULL;\n"
    "    END IF;\n"
    "    -- The finished jobs of this statement,",
)
finish = function(
    "CREATE OR REPLACE FUNCTION public.postpone_finish(p_ids bigint[], p_workers bigint[], "
    "p_attempts integer[], p_outcomes text[], p_errors text[], p_outputs jsonb[], p_ran_us bigint[])"
)
split = finish.index("    ELSE\n        RETURN QUERY\n        WITH o AS (")
kept = finish[split:]
kept = edit(
    kept,
    "    ELSE\n        RETURN QUERY\n        WITH o AS (",
    "    ELSE\n        PERFORM set_config('postpone.counted', 'on', true);\n        WITH o AS (",
)
kept = edit(
    kept,
    """            RETURNING j.id
        )
        SELECT id FROM updated;
    END IF;""",
    """            RETURNING j.id, j.queue, j.status,
                      CASE WHEN isfinite(j.started_at) AND isfinite(j.scheduled_at)
                           THEN j.started_at - j.scheduled_at END AS wait
        ), g AS (
            SELECT u.queue, u.status, width_bucket(u.wait, v_bounds) AS b, count(*) AS n
              FROM updated u GROUP BY u.queue, u.status, 3
        )
        SELECT (SELECT array_agg(u.id) FROM updated u),
               array_agg(g.queue), array_agg(g.status), array_agg(g.b), array_agg(g.n)
          INTO v_ids, v_queues, v_outcomes, v_buckets, v_counts
          FROM g;
        PERFORM set_config('postpone.counted', '', true);
        IF v_queues IS NOT NULL THEN
            PERFORM postpone_stats_add_counts(v_queues, v_outcomes, v_buckets, v_counts);
        END IF;
        RETURN QUERY SELECT unnest(v_ids);
    END IF;""",
)
print(record + "\n\n" + finish[:split] + kept)
