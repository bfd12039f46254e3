//! The checker: reads the final job rows and the execution log, and judges them against the
//! promises of DESIGN.md.
//!
//! An execution's interval is from its task's entry to its return; one that never returned
//! ends when its process died. A worker *was disturbed* over a window when a fault that can
//! make it look dead (SIGKILL, SIGSTOP, stranded, refused or reset links, terminated backends,
//! a server restart) touched its slot within that window. Rules:
//!
//! 1. **final**: every job ends `succeeded`, `failed`, `cancelled` or `aborted`; none is left
//!    `doing` or `todo`. A job whose task asked for a retry in `Duration::MAX` may stay `todo`
//!    when scheduled more than an hour ahead ("parked").
//! 2. **overlap** (promises 4, 9): two executions of one job never overlap in time, unless the
//!    earlier one's worker was disturbed between `stalled_after` before its start and the
//!    later one's start (then it was presumed dead and rescued: at-least-once).
//! 3. **stale start** (promise 9): no execution starts after an execution of a *later*
//!    attempt of the same job started (a worker started a job it no longer owned).
//! 4. **outcome** (promises 4, 9): a finished job's status is what its last execution
//!    returned (`Ok` -> succeeded, fail/panic/timeout -> failed, cancel -> cancelled, an abort
//!    seen -> aborted, a retry on the last allowed attempt -> failed), and its `attempts` is
//!    that execution's attempt. Hostile retries (queueing-lock collision, `Duration::MAX`)
//!    may end in any status but `succeeded`. A job that ran nothing never `succeeded`. A job
//!    with a queueing lock whose requeue (rescue, retry, release) found another job waiting
//!    under it may end `cancelled` (the waiting job does the work).
//! 5. **locks** (promise 5): executions of two jobs with one `lock` never overlap, with the
//!    same exception as rule 2.
//! 6. **aborts** (promise 8): a job whose abort cancelled it (it was waiting) never starts
//!    afterwards and ends `cancelled`; a job whose abort was requested while it ran starts no
//!    new attempt afterwards and ends `aborted`, unless the attempt running at the request had
//!    already returned a final outcome; a job no abort was requested for never ends `aborted`
//!    and its task never sees `abort_requested` (a bare NOTIFY is not an abort).
//! 7. **processes** (promises 1, 3, 7): no worker process exits on its own, and each one's
//!    final shutdown (after the drain) is clean: every thread joined, the cleanup done.
//! 8. **lost** (promise 4): every defer whose commit was acknowledged (`defer` returned an id)
//!    has its job row at the end (and rule 1 wants it final). With asynchronous replication
//!    a failover may take back what was acknowledged after the last moment the standby had
//!    received everything (see [`server`](super::server)): such a loss is counted, not a
//!    violation, and so is any other broken rule of a job that did something (was deferred,
//!    started, returned) within 5 s before that moment and the stop.
//! 9. **twice** (promises 4, 9, 10): one attempt of a job starts at most once, unless the
//!    worker of the first start was disturbed (as in rule 2): a start whose record was lost
//!    with its worker may run the same attempt again. A job held by a worker and given back
//!    is not started: no execution is logged for it, and its attempt is not used.
//!
//! Jobs are matched to executions and acknowledgements by id and by the deferrer's sequence
//! number in their arguments, so that an id handed out again after a failover is not mixed
//! up with the job that had it first.

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::time::Duration;

use postgres::Client;
use postpone::AbortOutcome;

use super::child::RETRY_ATTEMPTS;
use super::run::{Config, Record};
use super::server::Replication;
use super::{Fault, Kind};

/// Before a failover's safe point, how far back an async rollback may reach an outcome: the
/// time an execution's end may take to be recorded.
const ROLLBACK_SLACK_US: i64 = 5_000_000;

/// One broken rule.
#[derive(Clone, Debug)]
pub struct Violation {
    /// The job (0: not about one job).
    pub job: i64,
    pub rule: &'static str,
    pub detail: String,
}

/// The outcome of a run: its counts, its violations, and the histories of the jobs involved.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    pub mix: String,
    pub faults: BTreeMap<Fault, usize>,
    pub deferred: BTreeMap<Kind, usize>,
    pub defer_errors: usize,
    /// The longest a defer took, acknowledged or not.
    pub defer_longest: Duration,
    /// Acknowledged defers lost with an asynchronous failover (not violations).
    pub lost_async: usize,
    /// Other broken rules of jobs an asynchronous failover may have rolled back (not
    /// violations; listed with the violations).
    pub excused: Vec<Violation>,
    pub replication: Option<Replication>,
    pub failovers: usize,
    pub jobs: usize,
    pub executions: usize,
    pub statuses: BTreeMap<String, usize>,
    pub processes: usize,
    pub unclean_shutdowns: usize,
    pub drained: bool,
    pub drain_end: String,
    pub run_took: Duration,
    pub drain_took: Duration,
    pub violations: Vec<Violation>,
    /// Histories of the first violating jobs.
    pub histories: String,
}

impl Report {
    /// Violations per rule.
    pub fn by_rule(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry(v.rule).or_insert(0) += 1;
        }
        m
    }

    /// The counts, one paragraph.
    pub fn summary(&self) -> String {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(f, n)| format!("{f}={n}"))
            .collect();
        let kinds: Vec<String> = self
            .deferred
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}={n}"))
            .collect();
        let rules: Vec<String> = self
            .by_rule()
            .iter()
            .map(|(r, n)| format!("{r}={n}"))
            .collect();
        let server = match self.replication {
            None => "shared server".to_owned(),
            Some(r) => format!(
                "own server, {} replication, {} failovers{}",
                r.name(),
                self.failovers,
                if r == Replication::Async {
                    format!(
                        ", {} acknowledged defers lost and {} other rules broken within a failover's unreplicated window (allowed)",
                        self.lost_async,
                        self.excused.len()
                    )
                } else {
                    String::new()
                }
            ),
        };
        format!(
            "chaos seed {} ({server}): {} faults injected ({}); {} jobs ({} deferred: {}; {} defer errors, \
             longest defer {:.1}s), {} executions, {} worker processes ({} unclean shutdowns); final: {}; \
             run {:.1}s, drain {:.1}s{}; violations: {}{}\n  mix: {}",
            self.seed,
            self.faults.values().sum::<usize>(),
            faults.join(" "),
            self.jobs,
            self.deferred.values().sum::<usize>(),
            kinds.join(" "),
            self.defer_errors,
            self.defer_longest.as_secs_f64(),
            self.executions,
            self.processes,
            self.unclean_shutdowns,
            statuses.join(" "),
            self.run_took.as_secs_f64(),
            self.drain_took.as_secs_f64(),
            if self.drained {
                String::new()
            } else {
                format!(" (NOT drained: {})", self.drain_end)
            },
            self.violations.len(),
            if rules.is_empty() {
                String::new()
            } else {
                format!(" ({})", rules.join(" "))
            },
            self.mix,
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary())?;
        for v in self.violations.iter().take(40) {
            writeln!(f, "  VIOLATION [{}] job {}: {}", v.rule, v.job, v.detail)?;
        }
        if self.violations.len() > 40 {
            writeln!(f, "  ... and {} more", self.violations.len() - 40)?;
        }
        for v in self.excused.iter().take(10) {
            writeln!(
                f,
                "  allowed (async failover) [{}] job {}: {}",
                v.rule, v.job, v.detail
            )?;
        }
        f.write_str(&self.histories)
    }
}

/// A job row as the checker reads it.
#[derive(Clone, Debug)]
pub struct JobRow {
    pub id: i64,
    /// The deferrer's sequence number (None: deferred by a task).
    pub seq: Option<i64>,
    pub task: String,
    pub status: String,
    pub attempts: i32,
    pub lock: Option<String>,
    pub queueing_lock: Option<String>,
    pub parked: bool,
    pub scheduled_in_s: f64,
    pub errors: String,
}

/// One logged execution.
#[derive(Clone, Debug)]
pub struct Exec {
    pub job: i64,
    pub seq: Option<i64>,
    pub attempt: i32,
    pub pid: u32,
    pub slot: usize,
    pub lock: Option<String>,
    pub start: i64,
    pub end: Option<i64>,
    pub outcome: Option<String>,
    pub abort_seen: bool,
}

struct Checker<'a> {
    cfg: &'a Config,
    rec: &'a Record,
    violations: Vec<Violation>,
}

/// Judges a finished run: the jobs from `jobs` (the jobs' database), the executions from
/// `log` (the execution log).
pub fn check(cfg: &Config, rec: &Record, jobs: &mut Client, log: &mut Client) -> Report {
    // The run's faults may have left a low timeout on the server; the judge reads everything.
    for c in [&mut *jobs, &mut *log] {
        c.batch_execute("SET statement_timeout = 0; SET lock_timeout = 0")
            .expect("chaos: clearing the session's timeouts for the check");
    }
    let rows: Vec<JobRow> = jobs
        .query(
            "SELECT id, (args->>'seq')::bigint, task, status, attempts, lock, queueing_lock, \
                    status = 'todo' AND scheduled_at > now() + interval '1 hour', \
                    extract(epoch FROM scheduled_at - now())::float8, \
                    coalesce(errors::text, '') \
               FROM postpone_jobs ORDER BY id",
            &[],
        )
        .expect("chaos: reading the jobs")
        .iter()
        .map(|r| JobRow {
            id: r.get(0),
            seq: r.get(1),
            task: r.get(2),
            status: r.get(3),
            attempts: r.get(4),
            lock: r.get(5),
            queueing_lock: r.get(6),
            parked: r.get(7),
            scheduled_in_s: r.get(8),
            errors: r.get(9),
        })
        .collect();
    let execs: Vec<Exec> = log
        .query(
            "SELECT job_id, seq, attempt, pid, slot, lock, t_start, t_end, outcome, \
                    coalesce(abort_seen, false) \
               FROM chaos_exec ORDER BY t_start, id",
            &[],
        )
        .expect("chaos: reading the execution log")
        .iter()
        .map(|r| Exec {
            job: r.get(0),
            seq: r.get(1),
            attempt: r.get(2),
            pid: r.get::<_, i32>(3) as u32,
            slot: r.get::<_, i32>(4) as usize,
            lock: r.get(5),
            start: r.get(6),
            end: r.get(7),
            outcome: r.get(8),
            abort_seen: r.get(9),
        })
        .collect();

    judge(cfg, rec, &rows, &execs)
}

/// Judges the final rows `jobs` and the execution log `execs` (sorted by start) of a run.
pub fn judge(cfg: &Config, rec: &Record, jobs: &[JobRow], execs: &[Exec]) -> Report {
    let mut by_job: HashMap<(i64, Option<i64>), Vec<&Exec>> = HashMap::new();
    for e in execs {
        by_job.entry((e.job, e.seq)).or_default().push(e);
    }
    let mut ck = Checker {
        cfg,
        rec,
        violations: Vec::new(),
    };
    for job in jobs {
        let ex = by_job.get(&(job.id, job.seq)).cloned().unwrap_or_default();
        ck.job(job, &ex);
    }
    ck.locks(execs);
    ck.processes();
    let lost_async = ck.lost(jobs);
    let excused = ck.excuse_rollbacks(jobs, &by_job);

    let mut statuses = BTreeMap::new();
    for j in jobs {
        let s = if j.parked {
            "todo(parked)".to_owned()
        } else {
            j.status.clone()
        };
        *statuses.entry(s).or_insert(0) += 1;
    }
    let mut histories = String::new();
    // The histories of up to 5 jobs with the rarer violations first, then of 2 left unfinished.
    let mut shown: Vec<i64> = Vec::new();
    for (rare, most) in [(true, 5), (false, 7)] {
        for v in &ck.violations {
            if v.job != 0
                && (v.rule != "final") == rare
                && !shown.contains(&v.job)
                && shown.len() < most
            {
                shown.push(v.job);
                if let Some(job) = jobs.iter().find(|j| j.id == v.job) {
                    let ex = by_job.get(&(job.id, job.seq)).cloned().unwrap_or_default();
                    ck.history(&mut histories, job, &ex);
                }
            }
        }
    }
    let unclean_shutdowns = rec
        .procs
        .iter()
        .filter(|p| p.report.as_deref().is_some_and(|r| r.starts_with("false")))
        .count();
    Report {
        seed: cfg.seed,
        mix: cfg.mix.enabled(),
        faults: rec.faults_by_kind(),
        deferred: rec.deferred.clone(),
        defer_errors: rec.defer_errors,
        defer_longest: Duration::from_micros(rec.defer_longest.max(0) as u64),
        lost_async,
        excused,
        replication: rec.replication,
        failovers: rec.failovers.len(),
        jobs: jobs.len(),
        executions: execs.len(),
        statuses,
        processes: rec.procs.len(),
        unclean_shutdowns,
        drained: rec.drained,
        drain_end: rec.drain_end.clone(),
        run_took: rec.run_took,
        drain_took: rec.drain_took,
        violations: ck.violations,
        histories,
    }
}

impl Checker<'_> {
    fn violation(&mut self, job: i64, rule: &'static str, detail: String) {
        self.violations.push(Violation { job, rule, detail });
    }

    /// Milliseconds since the start of the run, for messages.
    fn rel(&self, t: i64) -> String {
        format!("{:+.0}ms", (t - self.rec.t0) as f64 / 1000.0)
    }

    /// When the execution ended: its return, else its process's death.
    fn end(&self, e: &Exec) -> i64 {
        e.end
            .or_else(|| self.rec.proc(e.pid).and_then(|p| p.died))
            .unwrap_or(i64::MAX)
    }

    /// A fault that can make slot `slot`'s worker look dead touched it within `[w0, w1]`.
    fn disturbed(&self, slot: usize, w0: i64, w1: i64) -> bool {
        self.rec.faults.iter().any(|f| {
            let hits_slot = f.slot.is_none_or(|s| s == slot);
            hits_slot && f.fault.disturbs() && f.from <= w1 && f.to >= w0
        })
    }

    /// Rule 8: every acknowledged defer has its row. Returns how many were lost within an
    /// asynchronous failover's unreplicated window (allowed).
    fn lost(&mut self, jobs: &[JobRow]) -> usize {
        let rows: std::collections::HashSet<(i64, Option<i64>)> =
            jobs.iter().map(|j| (j.id, j.seq)).collect();
        let mut allowed = 0;
        for &(seq, id, at) in &self.rec.acks {
            if rows.contains(&(id, Some(seq as i64))) {
                continue;
            }
            if self.unreplicated(at) {
                allowed += 1;
                continue;
            }
            let other = jobs.iter().find(|j| j.id == id).map_or(String::new(), |j| {
                format!(" (id {id} now belongs to a job with seq {:?})", j.seq)
            });
            let detail = format!(
                "defer {seq} was acknowledged with id {id} at {}, and no such job exists at the end{other}",
                self.rel(at)
            );
            self.violation(id, "lost", detail);
        }
        allowed
    }

    /// Whether a commit at `t` may have been taken back by an asynchronous failover: after
    /// the last moment its standby had everything, before the stop.
    fn unreplicated(&self, t: i64) -> bool {
        self.rec.replication == Some(Replication::Async)
            && self
                .rec
                .failovers
                .iter()
                .any(|f| t <= f.stop && f.safe.is_none_or(|s| t > s))
    }

    /// With asynchronous replication, moves the violations of jobs that did something
    /// within a failover's unreplicated window (or the slack before it) out of the
    /// violations, and returns them.
    fn excuse_rollbacks(
        &mut self,
        jobs: &[JobRow],
        by_job: &HashMap<(i64, Option<i64>), Vec<&Exec>>,
    ) -> Vec<Violation> {
        if self.rec.replication != Some(Replication::Async) {
            return Vec::new();
        }
        let windows: Vec<(i64, i64)> = self
            .rec
            .failovers
            .iter()
            .map(|f| (f.safe.unwrap_or(i64::MIN / 2) - ROLLBACK_SLACK_US, f.stop))
            .collect();
        let touched = |t: i64| windows.iter().any(|(a, b)| t >= *a && t <= *b);
        let mut excused = Vec::new();
        let violations = std::mem::take(&mut self.violations);
        for v in violations {
            let job = jobs.iter().find(|j| j.id == v.job);
            let acked = self
                .rec
                .acks
                .iter()
                .filter(|(seq, id, _)| {
                    *id == v.job && job.is_none_or(|j| j.seq == Some(*seq as i64))
                })
                .any(|(_, _, at)| touched(*at));
            let ran = job
                .and_then(|j| by_job.get(&(j.id, j.seq)))
                .is_some_and(|ex| {
                    ex.iter()
                        .any(|e| touched(e.start) || e.end.is_some_and(touched))
                });
            // A lost defer is judged by the precise moment already (rule 8).
            if v.job != 0 && v.rule != "lost" && (acked || ran) {
                excused.push(v);
            } else {
                self.violations.push(v);
            }
        }
        excused
    }

    fn stalled_us(&self) -> i64 {
        self.cfg.stalled_after.as_micros() as i64
    }

    fn job(&mut self, job: &JobRow, ex: &[&Exec]) {
        let kind = Kind::from_task(&job.task);
        let aborts: Vec<_> = self.rec.aborts.iter().filter(|a| a.job == job.id).collect();
        let abort_recorded = aborts
            .iter()
            .any(|a| !matches!(a.outcome, Err(ref e) if e.contains("only waiting or running")));
        let finished = matches!(
            job.status.as_str(),
            "succeeded" | "failed" | "cancelled" | "aborted"
        );

        // 1. final
        if !finished {
            if job.parked {
                if kind != Some(Kind::HugeDelay) {
                    self.violation(
                        job.id,
                        "final",
                        format!(
                            "left todo, scheduled {:.0} s ahead, though its task never asked for a long delay",
                            job.scheduled_in_s
                        ),
                    );
                }
            } else {
                self.violation(
                    job.id,
                    "final",
                    format!(
                        "left {} after the drain (attempts {}, scheduled in {:.1} s)",
                        job.status, job.attempts, job.scheduled_in_s
                    ),
                );
            }
        }

        // 2. overlap, 3. stale start
        for (i, x) in ex.iter().enumerate() {
            for y in &ex[i + 1..] {
                if y.start < self.end(x)
                    && !self.disturbed(x.slot, x.start - self.stalled_us(), y.start)
                {
                    self.violation(
                        job.id,
                        "overlap",
                        format!(
                            "attempt {} (pid {}, slot {}) ran {}..{} while attempt {} (pid {}) started at {}, and pid {}'s worker was not disturbed",
                            x.attempt, x.pid, x.slot, self.rel(x.start), self.end_text(x),
                            y.attempt, y.pid, self.rel(y.start), x.pid
                        ),
                    );
                }
                if y.attempt == x.attempt
                    && !self.disturbed(x.slot, x.start - self.stalled_us(), y.start)
                {
                    self.violation(
                        job.id,
                        "twice",
                        format!(
                            "attempt {} started at {} (pid {}) and again at {} (pid {}), and pid {}'s worker was not disturbed",
                            x.attempt, self.rel(x.start), x.pid, self.rel(y.start), y.pid, x.pid
                        ),
                    );
                }
                if y.attempt < x.attempt {
                    self.violation(
                        job.id,
                        "stale_start",
                        format!(
                            "attempt {} started at {} (pid {}) after attempt {} had started at {} (pid {}): a worker started a job it no longer owned",
                            y.attempt, self.rel(y.start), y.pid, x.attempt, self.rel(x.start), x.pid
                        ),
                    );
                }
            }
        }

        // 6. aborts
        let mut abort_excuses = false;
        for a in &aborts {
            match &a.outcome {
                Ok(AbortOutcome::Cancelled) => {
                    abort_excuses = true;
                    for e in ex.iter().filter(|e| e.start > a.after) {
                        self.violation(
                            job.id,
                            "abort",
                            format!(
                                "its abort cancelled it at {} (it was waiting), yet attempt {} started at {} (pid {})",
                                self.rel(a.after), e.attempt, self.rel(e.start), e.pid
                            ),
                        );
                    }
                    if finished && !matches!(job.status.as_str(), "cancelled" | "aborted") {
                        self.violation(
                            job.id,
                            "abort",
                            format!(
                                "its abort cancelled it at {}, yet it ended {}",
                                self.rel(a.after),
                                job.status
                            ),
                        );
                    }
                }
                Ok(AbortOutcome::Requested) => {
                    abort_excuses = true;
                    if let (Some(b), Some(a0)) = (a.attempts_before, a.attempts_after) {
                        if b == a0 {
                            for e in ex.iter().filter(|e| e.attempt > a0 && e.start > a.after) {
                                self.violation(
                                    job.id,
                                    "abort",
                                    format!(
                                        "its abort was requested at {} during attempt {a0}, yet attempt {} started at {} (pid {})",
                                        self.rel(a.after), e.attempt, self.rel(e.start), e.pid
                                    ),
                                );
                            }
                            if finished && job.status != "aborted" {
                                // Fine only if attempt a0 had already returned that outcome.
                                let done_before =
                                    ex.iter().rev().find(|e| e.attempt == a0).is_some_and(|e| {
                                        e.end.is_some_and(|t| t < a.after)
                                            && expected(kind, e).contains(&job.status.as_str())
                                    });
                                if !done_before {
                                    self.violation(
                                        job.id,
                                        "abort",
                                        format!(
                                            "its abort was requested at {} while attempt {a0} ran, yet it ended {}",
                                            self.rel(a.after),
                                            job.status
                                        ),
                                    );
                                }
                            }
                        }
                    }
                }
                // An error: uncertain, unless the job had finished already.
                Err(e) if !e.contains("only waiting or running") => abort_excuses = true,
                _ => {}
            }
        }
        if !abort_recorded {
            if job.status == "aborted" {
                let hint = if self.rec.notifies.iter().any(|n| n.0 == job.id) {
                    " (a bare NOTIFY 'abort:<id>' was sent)"
                } else {
                    ""
                };
                self.violation(
                    job.id,
                    "abort",
                    format!("ended aborted, but no abort was ever requested{hint}"),
                );
            }
            for e in ex.iter().filter(|e| e.abort_seen) {
                self.violation(
                    job.id,
                    "abort",
                    format!(
                        "attempt {} (pid {}) saw abort_requested() = true, but no abort was ever requested",
                        e.attempt, e.pid
                    ),
                );
            }
        }

        // 4. outcome
        if !finished {
            return;
        }
        // The last attempt: the highest attempt number, the latest of those (a stale start
        // of an older attempt is rule 3's business).
        let Some(last) = ex.iter().max_by_key(|e| (e.attempt, e.start)) else {
            // A job claimed by a worker that died before it logged a start, whose rescue
            // found another job waiting under its queueing lock: that job does the work, and
            // this one ends `cancelled` with the note saying so.
            let superseded = job.queueing_lock.is_some()
                && job
                    .errors
                    .contains("already waits with the same queueing lock");
            let ok = match job.status.as_str() {
                "failed" => true,
                "cancelled" => abort_excuses || superseded,
                "aborted" => abort_excuses,
                _ => false,
            };
            if !ok {
                self.violation(
                    job.id,
                    "outcome",
                    format!("ended {} without any logged execution", job.status),
                );
            }
            return;
        };
        if job.attempts > last.attempt {
            // Claimed again after its last logged run, and ended without running: a job
            // given up after too many rescues, or an aborted one.
            let ok = job.status == "failed"
                || (abort_excuses && matches!(job.status.as_str(), "aborted" | "cancelled"));
            if !ok {
                self.violation(
                    job.id,
                    "outcome",
                    format!(
                        "ended {} at attempt {}, but its last logged execution is attempt {}",
                        job.status, job.attempts, last.attempt
                    ),
                );
            }
            return;
        }
        if job.attempts < last.attempt {
            self.violation(
                job.id,
                "outcome",
                format!(
                    "ended {} at attempt {}, after attempt {} had run (pid {}, {}): an older attempt's outcome was recorded last",
                    job.status, job.attempts, last.attempt, last.pid, self.rel(last.start)
                ),
            );
            return;
        }
        // A requeue (rescue, retry, release) that finds another job waiting under the same
        // queueing lock ends the requeued job `cancelled` instead (the rule of one way back
        // to `todo`: the waiting job does the work).
        let collided = job.queueing_lock.is_some() && job.status == "cancelled";
        if last.end.is_none() {
            let excused = collided
                || (abort_excuses && matches!(job.status.as_str(), "aborted" | "cancelled"));
            if !excused {
                self.violation(
                    job.id,
                    "outcome",
                    format!(
                        "ended {} for attempt {}, whose execution (pid {}) never returned",
                        job.status, last.attempt, last.pid
                    ),
                );
            }
            return;
        }
        let want = expected(kind, last);
        let status = job.status.as_str();
        let abort_ok = abort_excuses && matches!(status, "aborted" | "cancelled");
        let requeued = matches!(
            last.outcome.as_deref(),
            Some("retry" | "retry_huge" | "interrupted")
        );
        let allowed = want.contains(&status) || abort_ok || (collided && requeued);
        if !allowed {
            self.violation(
                job.id,
                "outcome",
                format!(
                    "ended {status}, but its last execution (attempt {}, pid {}) returned {:?}{} (expected one of {want:?})",
                    last.attempt,
                    last.pid,
                    last.outcome.as_deref().unwrap_or("?"),
                    if last.abort_seen { " having seen an abort request" } else { "" },
                ),
            );
        }
    }

    fn end_text(&self, e: &Exec) -> String {
        match e.end {
            Some(t) => self.rel(t),
            None => match self.rec.proc(e.pid).and_then(|p| p.died) {
                Some(t) => format!("(never returned; process died {})", self.rel(t)),
                None => "(never returned)".to_owned(),
            },
        }
    }

    fn locks(&mut self, execs: &[Exec]) {
        let mut by_lock: BTreeMap<&str, Vec<&Exec>> = BTreeMap::new();
        for e in execs {
            if let Some(l) = &e.lock {
                by_lock.entry(l).or_default().push(e);
            }
        }
        for (lock, ex) in by_lock {
            for (i, x) in ex.iter().enumerate() {
                let x_end = self.end(x);
                // Sorted by start: once one starts after x ended, all the rest do.
                for y in ex[i + 1..].iter().take_while(|y| y.start < x_end) {
                    if x.job != y.job
                        && !self.disturbed(x.slot, x.start - self.stalled_us(), y.start)
                    {
                        self.violation(
                            y.job,
                            "lock",
                            format!(
                                "lock {lock:?}: job {} attempt {} (pid {}) started at {} while job {} attempt {} (pid {}, undisturbed) held it {}..{}",
                                y.job, y.attempt, y.pid, self.rel(y.start), x.job, x.attempt, x.pid,
                                self.rel(x.start), self.end_text(x)
                            ),
                        );
                    }
                }
            }
        }
    }

    fn processes(&mut self) {
        for p in &self.rec.procs {
            if p.died.is_some() && !p.killed && p.report.is_none() {
                let detail = format!(
                    "worker process {} (slot {}) exited on its own at {} without a shutdown report",
                    p.pid,
                    p.slot,
                    self.rel(p.died.unwrap_or(0))
                );
                self.violations.push(Violation {
                    job: 0,
                    rule: "process",
                    detail,
                });
            }
            // After the drain nothing runs: a shutdown then is clean (threads joined, the
            // cleanup done). "never started": closed before its worker could register.
            if let Some(report) = &p.report {
                if report.starts_with("false") && !report.contains("never started") {
                    let detail = format!(
                        "worker process {} (slot {}) stopped uncleanly: {report}",
                        p.pid, p.slot
                    );
                    self.violations.push(Violation {
                        job: 0,
                        rule: "shutdown",
                        detail,
                    });
                }
            }
        }
    }

    fn history(&self, out: &mut String, job: &JobRow, ex: &[&Exec]) {
        let errors: String = job.errors.chars().take(900).collect();
        let _ = writeln!(
            out,
            "  history of job {} ({}, lock {:?}, queueing lock {:?}): {} at attempt {}; errors: {}",
            job.id, job.task, job.lock, job.queueing_lock, job.status, job.attempts, errors
        );
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        for e in ex {
            lo = lo.min(e.start);
            hi = hi.max(self.end(e).min(e.start + 60_000_000));
            let proc = self.rec.proc(e.pid);
            let _ = writeln!(
                out,
                "    exec attempt {} pid {} slot {} (worker id {:?}) {}..{} returned {:?}{}",
                e.attempt,
                e.pid,
                e.slot,
                proc.and_then(|p| p.worker_id),
                self.rel(e.start),
                self.end_text(e),
                e.outcome.as_deref().unwrap_or("-"),
                if e.abort_seen { ", saw abort" } else { "" },
            );
        }
        for a in self.rec.aborts.iter().filter(|a| a.job == job.id) {
            let _ = writeln!(
                out,
                "    admin abort {}..{}: {:?} (attempts {:?} -> {:?})",
                self.rel(a.before),
                self.rel(a.after),
                a.outcome,
                a.attempts_before,
                a.attempts_after
            );
        }
        for n in self.rec.notifies.iter().filter(|n| n.0 == job.id) {
            let _ = writeln!(out, "    bare NOTIFY abort:{} at {}", job.id, self.rel(n.1));
        }
        if lo <= hi {
            let lo = lo - self.stalled_us();
            for f in self
                .rec
                .faults
                .iter()
                .filter(|f| f.from <= hi && f.to >= lo)
            {
                if matches!(f.fault, Fault::Abort | Fault::BareNotify) {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "    fault {} slot {:?} pid {:?} {}..{}: {}",
                    f.fault,
                    f.slot,
                    f.pid,
                    self.rel(f.from),
                    self.rel(f.to),
                    f.note
                );
            }
        }
    }
}

/// The statuses a job may end in when `e` was its last execution.
fn expected(kind: Option<Kind>, e: &Exec) -> Vec<&'static str> {
    const NOT_SUCCEEDED: [&str; 3] = ["failed", "cancelled", "aborted"];
    if e.abort_seen {
        return vec!["aborted"];
    }
    match e.outcome.as_deref() {
        Some("ok") => vec!["succeeded"],
        Some("fail" | "timeout" | "panic") => vec!["failed"],
        Some("cancel") => vec!["cancelled"],
        Some("aborted") => vec!["aborted"],
        Some("retry_huge") => NOT_SUCCEEDED.to_vec(),
        Some("retry") if kind == Some(Kind::QlockCollide) => NOT_SUCCEEDED.to_vec(),
        Some("retry") if e.attempt >= RETRY_ATTEMPTS as i32 => vec!["failed"],
        _ => Vec::new(),
    }
}
