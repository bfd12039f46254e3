//! The orchestrator of a chaos run.
//!
//! On a fresh database (on the shared server, or on a server of the run's own: see
//! [`server`](super::server)): fault proxies per worker slot (one per host the slot's URL
//! lists), one worker process per slot (its links through its proxies), a deferrer thread
//! ([`feed`](super::feed)), and a fault schedule drawn from the seed. The
//! sequence of decisions (which fault, which slot, how long, which task kind) is a function
//! of the seed; what the faults hit depends on timing, so two runs of one seed are alike,
//! not identical. After `run_for`: every fault is healed, dead slots get a process again,
//! and the run drains (bounded) until no job is running or due; the processes are shut down
//! by closing their standard input; then [`check`](super::check::check) judges the logs.
//!
//! Everything the orchestrator did is kept in a [`Record`] for the checker and the report.
//! Dropping a run (a panic included) continues and kills every process it started.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use postgres::Client;
use postpone::{AbortOutcome, App, JobId};

use super::child;
use super::feed::{self, Deferral};
use super::server::{Failover, OwnServer, Replication, Server};
use super::{check, now_us, Fault, Kind, Mix, Report, Rng};
use crate::support::{FaultProxy, NewConns};

/// Builds the command that starts one worker process (the env is added by the run).
pub type ChildCommand = Arc<dyn Fn() -> Command + Send + Sync>;

/// What a run does.
#[derive(Clone)]
pub struct Config {
    pub seed: u64,
    /// How long faults are injected and jobs deferred.
    pub run_for: Duration,
    /// Worker processes (slots).
    pub workers: usize,
    /// Executor threads per worker.
    pub concurrency: usize,
    pub jobs_per_sec: u32,
    /// After the faults stop, the run waits for every job to end, as long as something
    /// progresses (an execution starts, a job finishes) at least this often, and at most
    /// twice `run_for` (or this, if longer).
    pub drain_timeout: Duration,
    pub stalled_after: Duration,
    pub heartbeat: Duration,
    /// Time between two faults: uniform in this range.
    pub fault_every: (Duration, Duration),
    pub mix: Mix,
    /// Shell command that restarts the server, for [`Fault::Restart`] (never in CI).
    pub restart_cmd: Option<String>,
    /// A server of the run's own (initdb on a spare port) instead of a database on the
    /// shared server; the server's faults need one.
    pub own: Option<OwnServer>,
    pub child_cmd: ChildCommand,
    /// Directory for the worker processes' stderr (`chaos-<seed>-<slot>-<pid>.log`); none:
    /// discarded.
    pub child_logs: Option<PathBuf>,
    /// Print each fault as it is injected.
    pub verbose: bool,
}

impl Config {
    /// The CI defaults for `seed`: 3 workers of 2 threads, 8 s of faults, a drain
    /// that stops after 20 s without progress.
    pub fn new(seed: u64, child_cmd: ChildCommand) -> Config {
        Config {
            seed,
            run_for: Duration::from_secs(8),
            workers: 3,
            concurrency: 2,
            jobs_per_sec: 10,
            drain_timeout: Duration::from_secs(20),
            stalled_after: Duration::from_secs(2),
            heartbeat: Duration::from_millis(250),
            fault_every: (Duration::from_millis(250), Duration::from_millis(900)),
            mix: Mix::default(),
            restart_cmd: None,
            own: None,
            child_cmd,
            child_logs: None,
            verbose: false,
        }
    }
}

/// One injected fault. `from`/`to` in microseconds since the epoch (equal for instant ones;
/// `to` is when it was healed, for those that last).
#[derive(Clone, Debug)]
pub struct FaultEvent {
    pub fault: Fault,
    /// The slot it hit; None for faults on every slot (terminate, the server's faults but a
    /// PgBouncer restart).
    pub slot: Option<usize>,
    pub pid: Option<u32>,
    pub from: i64,
    pub to: i64,
    pub note: String,
}

/// One admin abort.
#[derive(Clone, Debug)]
pub struct AbortEvent {
    pub job: i64,
    pub before: i64,
    pub after: i64,
    /// What the admin API answered (an error: the abort may or may not have been recorded).
    pub outcome: Result<AbortOutcome, String>,
    /// The job's attempts read just before and just after the call.
    pub attempts_before: Option<i32>,
    pub attempts_after: Option<i32>,
}

/// One worker process.
#[derive(Clone, Debug)]
pub struct Proc {
    pub slot: usize,
    pub pid: u32,
    pub spawned: i64,
    pub ready: Option<i64>,
    pub worker_id: Option<i64>,
    pub died: Option<i64>,
    /// Ended by SIGKILL (a fault, or at the end because it did not stop in time).
    pub killed: bool,
    /// Its `CHAOS_REPORT` line (shutdown report), if it printed one.
    pub report: Option<String>,
}

/// Everything the orchestrator did.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub t0: i64,
    pub faults: Vec<FaultEvent>,
    pub aborts: Vec<AbortEvent>,
    /// Bare NOTIFY `abort:<id>`: (job, when).
    pub notifies: Vec<(i64, i64)>,
    pub procs: Vec<Proc>,
    pub deferred: BTreeMap<Kind, usize>,
    pub defer_errors: usize,
    /// Acknowledged defers: (seq, job id, when `defer` returned).
    pub acks: Vec<(u64, i64, i64)>,
    /// The longest a defer took, acknowledged or not (µs).
    pub defer_longest: i64,
    /// Failovers, and the replication they happened under.
    pub failovers: Vec<Failover>,
    pub replication: Option<Replication>,
    pub drained: bool,
    /// Why the drain stopped early (empty when drained).
    pub drain_end: String,
    pub drain_took: Duration,
    pub run_took: Duration,
}

impl Record {
    pub fn faults_by_kind(&self) -> BTreeMap<Fault, usize> {
        let mut m = BTreeMap::new();
        for f in &self.faults {
            *m.entry(f.fault).or_insert(0) += 1;
        }
        m
    }

    /// The process `pid`.
    pub fn proc(&self, pid: u32) -> Option<&Proc> {
        self.procs.iter().find(|p| p.pid == pid)
    }
}

enum Heal {
    Cont {
        slot: usize,
        pid: u32,
        event: usize,
    },
    Net {
        slot: usize,
        reset: bool,
        event: usize,
    },
    Respawn {
        slot: usize,
    },
}

struct Slot {
    /// One per host of the slot's URL.
    proxies: Vec<FaultProxy>,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    pid: u32,
    stopped: bool,
    net_fault: bool,
    respawn_pending: bool,
}

struct Run<'a> {
    cfg: &'a Config,
    server: &'a mut Server,
    app: App,
    /// The jobs' database (reconnected after a restart or failover).
    ctl: Client,
    /// The execution log (on a server no fault touches).
    obs: Client,
    rng: Rng,
    slots: Vec<Slot>,
    heals: Vec<(Instant, Heal)>,
    lines_tx: Sender<(u32, String)>,
    lines_rx: Receiver<(u32, String)>,
    feed_rx: Receiver<Deferral>,
    feed: Option<thread::JoinHandle<()>>,
    rec: Record,
    recent: Vec<i64>,
}

const EXEC_TABLE: &str = "
CREATE TABLE chaos_exec (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint  NOT NULL,
    seq         bigint,
    attempt     integer NOT NULL,
    kind        text    NOT NULL,
    pid         integer NOT NULL,
    slot        integer NOT NULL,
    lock        text,
    t_start     bigint  NOT NULL,
    t_end       bigint,
    outcome     text,
    abort_seen  boolean
)";

/// Runs one seed and checks it; panics only on setup failures (no database, no process).
pub fn run(cfg: &Config) -> Report {
    crate::support::init_logging();
    let mut server = Server::new(cfg.own.as_ref());
    let mut obs = server.observer.client();
    obs.batch_execute(EXEC_TABLE)
        .expect("chaos: creating chaos_exec");
    let ctl = server.client().expect("chaos: control connection");
    let app = App::builder(server.url())
        .pool_size(2)
        .io_timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("chaos: the orchestrator's App");
    app.migrate().expect("chaos: migrate");
    let (lines_tx, lines_rx) = unbounded();
    let slots = (0..cfg.workers)
        .map(|slot| Slot {
            proxies: server
                .upstreams(slot)
                .iter()
                .map(|up| FaultProxy::start(up))
                .collect(),
            child: None,
            stdin: None,
            pid: 0,
            stopped: false,
            net_fault: false,
            respawn_pending: false,
        })
        .collect();
    let (_, feed_rx) = unbounded();
    let replication = server.is_own().then(|| server.replication());
    let mut run = Run {
        cfg,
        server: &mut server,
        app,
        ctl,
        obs,
        rng: Rng::new(cfg.seed),
        slots,
        heals: Vec::new(),
        lines_tx,
        lines_rx,
        feed_rx,
        feed: None,
        rec: Record {
            replication,
            ..Record::default()
        },
        recent: Vec::new(),
    };
    run.go();
    let mut rec = std::mem::take(&mut run.rec);
    rec.failovers = run.server.failovers();
    let mut obs = run.server.observer.client();
    drop(run);
    let mut jobs = server
        .client()
        .expect("chaos: connecting to the jobs' database for the check");
    check::check(cfg, &rec, &mut jobs, &mut obs)
}

impl Run<'_> {
    fn go(&mut self) {
        for slot in 0..self.slots.len() {
            self.spawn(slot);
        }
        // Every worker running before the clock starts (bounded: a slow machine).
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && self.rec.procs.iter().any(|p| p.ready.is_none()) {
            self.read_lines(Duration::from_millis(50));
        }
        let start = Instant::now();
        self.rec.t0 = now_us();
        let end = start + self.cfg.run_for;
        let (feed_tx, feed_rx) = unbounded();
        self.feed_rx = feed_rx;
        self.feed = Some(feed::spawn(
            self.app.clone(),
            self.cfg.mix.clone(),
            self.cfg.seed,
            self.cfg.jobs_per_sec,
            end,
            feed_tx,
        ));
        let mut next_fault = start + self.next_gap();
        while Instant::now() < end {
            self.tick();
            self.read_feed();
            if Instant::now() >= next_fault {
                self.inject();
                next_fault = Instant::now() + self.next_gap();
            }
            self.read_lines(Duration::from_millis(20));
        }
        self.rec.run_took = start.elapsed();

        // Heal everything now, then drain.
        let heals = std::mem::take(&mut self.heals);
        for (_, heal) in heals {
            self.heal(heal);
        }
        let ended = self.server.heal_all(Duration::from_secs(120));
        self.ended(ended);
        if let Some(feed) = self.feed.take() {
            let _ = feed.join();
        }
        self.read_feed();
        // Until nothing is pending; or nothing progressed (no execution started, no job
        // finished) for `drain_timeout`; or past the cap (twice the run, at least that).
        let drain_start = Instant::now();
        let cap = drain_start + self.cfg.drain_timeout.max(self.cfg.run_for * 2);
        let mut last_progress = (Instant::now(), None);
        let mut last_print = Instant::now();
        loop {
            self.tick();
            self.read_lines(Duration::from_millis(100));
            let pending = self.pending_jobs();
            if pending == Some(0) {
                self.rec.drained = true;
                break;
            }
            let now = Instant::now();
            let progress = self.progress();
            if progress.is_some() && progress != last_progress.1 {
                last_progress = (now, progress);
            }
            if self.cfg.verbose && now - last_print >= Duration::from_secs(5) {
                last_print = now;
                eprintln!(
                    "chaos: draining for {:.0}s: {pending:?} jobs pending; (executions, finished) {progress:?}",
                    (now - drain_start).as_secs_f64()
                );
            }
            if now - last_progress.0 >= self.cfg.drain_timeout {
                self.rec.drain_end = format!(
                    "no progress for {:?}, {pending:?} jobs pending",
                    self.cfg.drain_timeout
                );
                break;
            }
            if now >= cap {
                self.rec.drain_end = format!("drain cap reached, {pending:?} jobs pending");
                break;
            }
        }
        self.rec.drain_took = drain_start.elapsed();
        self.stop_all();
    }

    fn next_gap(&mut self) -> Duration {
        let (lo, hi) = self.cfg.fault_every;
        self.rng.duration(lo, hi)
    }

    /// (executions logged, jobs finished), to tell a slow drain from a stuck one.
    fn progress(&mut self) -> Option<(i64, i64)> {
        let execs = self
            .obs
            .query_one("SELECT count(*) FROM chaos_exec", &[])
            .map(|r| r.get(0))
            .ok()?;
        let finished = self
            .ctl
            .query_one(
                "SELECT count(*) FROM postpone_jobs \
                  WHERE status IN ('succeeded', 'failed', 'cancelled', 'aborted')",
                &[],
            )
            .map(|r| r.get(0))
            .ok()?;
        Some((execs, finished))
    }

    /// Takes in what the deferrer reported.
    fn read_feed(&mut self) {
        while let Ok(d) = self.feed_rx.try_recv() {
            self.rec.defer_longest = self.rec.defer_longest.max(d.returned - d.called);
            match d.result {
                Ok(id) => {
                    *self.rec.deferred.entry(d.kind).or_insert(0) += 1;
                    self.rec.acks.push((d.seq, id, d.returned));
                    self.recent.push(id);
                    if self.recent.len() > 40 {
                        self.recent.remove(0);
                    }
                }
                Err(e) => {
                    self.rec.defer_errors += 1;
                    if self.cfg.verbose {
                        eprintln!("chaos: defer {} failed: {e}", d.seq);
                    }
                }
            }
        }
    }

    /// Records when faults that lasted ended.
    fn ended(&mut self, ended: Vec<(usize, i64)>) {
        for (event, at) in ended {
            if let Some(f) = self.rec.faults.get_mut(event) {
                f.to = f.to.max(at);
            }
        }
    }

    /// Jobs running, or due within the hour (a job parked further is not waited for).
    fn pending_jobs(&mut self) -> Option<i64> {
        self.ctl
            .query_one(
                "SELECT count(*) FROM postpone_jobs WHERE status = 'doing' \
                  OR (status = 'todo' AND scheduled_at < now() + interval '1 hour')",
                &[],
            )
            .map(|r| r.get(0))
            .ok()
    }

    fn spawn(&mut self, slot: usize) {
        let cfg = self.cfg;
        let mut cmd = (cfg.child_cmd)();
        let log_url = format!("{}?application_name=chaos-log", self.server.log_url());
        let ports: Vec<u16> = self.slots[slot].proxies.iter().map(|p| p.port()).collect();
        let (url, listen) = self.server.slot_urls(slot, &ports);
        if let Some(listen) = listen {
            cmd.env(child::ENV_LISTEN_URL, listen);
        }
        cmd.env(child::ENV_URL, url)
            .env(child::ENV_LOG_URL, log_url)
            .env(child::ENV_SLOT, slot.to_string())
            .env(child::ENV_CONCURRENCY, cfg.concurrency.to_string())
            .env(
                child::ENV_STALLED_MS,
                cfg.stalled_after.as_millis().to_string(),
            )
            .env(
                child::ENV_HEARTBEAT_MS,
                cfg.heartbeat.as_millis().to_string(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let log_file = cfg.child_logs.as_ref().and_then(|dir| {
            let path = dir.join(format!("chaos-{}-{slot}-{}.log", cfg.seed, now_us()));
            File::create(path).ok()
        });
        cmd.stderr(match log_file {
            Some(f) => Stdio::from(f),
            None => Stdio::null(),
        });
        let mut child = cmd.spawn().expect("chaos: starting a worker process");
        let pid = child.id();
        let stdout = child.stdout.take().expect("piped stdout");
        let tx = self.lines_tx.clone();
        thread::Builder::new()
            .name(format!("chaos-read-{pid}"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((pid, line)).is_err() {
                        break;
                    }
                }
            })
            .expect("chaos: a reader thread");
        let s = &mut self.slots[slot];
        s.stdin = child.stdin.take();
        s.child = Some(child);
        s.pid = pid;
        s.stopped = false;
        s.respawn_pending = false;
        self.rec.procs.push(Proc {
            slot,
            pid,
            spawned: now_us(),
            ready: None,
            worker_id: None,
            died: None,
            killed: false,
            report: None,
        });
    }

    fn read_lines(&mut self, wait: Duration) {
        let mut first = true;
        loop {
            let got = if first {
                self.lines_rx.recv_timeout(wait).ok()
            } else {
                self.lines_rx.try_recv().ok()
            };
            first = false;
            let Some((pid, line)) = got else { return };
            let Some(p) = self.rec.procs.iter_mut().find(|p| p.pid == pid) else {
                continue;
            };
            // The test harness prints "test ... " before the child's first line.
            if let Some((_, rest)) = line.split_once("CHAOS_READY ") {
                p.ready = Some(now_us());
                p.worker_id = rest.split_whitespace().nth(1).and_then(|w| w.parse().ok());
            } else if let Some((_, rest)) = line.split_once("CHAOS_REPORT ") {
                p.report = Some(rest.to_owned());
            }
        }
    }

    /// Applies due heals; notices processes that exited on their own; reconnects the
    /// control connection if it broke (a server restart).
    fn tick(&mut self) {
        if self.ctl.is_closed() {
            if let Ok(c) = self.server.client() {
                self.ctl = c;
            }
        }
        let ended = self.server.tick(false);
        self.ended(ended);
        for (fault, slot, from, to, note) in self.server.take_unplanned() {
            eprintln!(
                "chaos: +{:.1}s {fault} slot {slot:?}: {note}",
                (from - self.rec.t0) as f64 / 1e6
            );
            self.rec.faults.push(FaultEvent {
                fault,
                slot,
                pid: None,
                from,
                to,
                note,
            });
        }
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.heals)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.heals = later;
        for (_, heal) in due {
            self.heal(heal);
        }
        for slot in 0..self.slots.len() {
            let exited = match self.slots[slot].child.as_mut() {
                Some(c) => c.try_wait().ok().flatten().is_some(),
                None => false,
            };
            if exited {
                let pid = self.slots[slot].pid;
                self.slots[slot].child = None;
                self.slots[slot].stdin = None;
                self.mark_died(pid, false);
                if self.cfg.verbose {
                    eprintln!("chaos: worker process {pid} (slot {slot}) exited on its own");
                }
                self.slots[slot].respawn_pending = true;
                self.heals
                    .push((now + Duration::from_millis(300), Heal::Respawn { slot }));
            }
        }
    }

    fn mark_died(&mut self, pid: u32, killed: bool) {
        if let Some(p) = self.rec.procs.iter_mut().find(|p| p.pid == pid) {
            p.died.get_or_insert(now_us());
            p.killed |= killed;
        }
    }

    fn heal(&mut self, heal: Heal) {
        match heal {
            Heal::Cont { slot, pid, event } => {
                if self.slots[slot].pid == pid && self.slots[slot].child.is_some() {
                    signal("CONT", pid);
                    self.slots[slot].stopped = false;
                }
                self.ended(vec![(event, now_us())]);
            }
            Heal::Net { slot, reset, event } => {
                let s = &mut self.slots[slot];
                for p in &s.proxies {
                    p.set_new_conns(NewConns::Forward);
                    if reset {
                        p.reset_all();
                    }
                }
                s.net_fault = false;
                self.ended(vec![(event, now_us())]);
            }
            Heal::Respawn { slot } => {
                if self.slots[slot].child.is_none() {
                    self.spawn(slot);
                }
            }
        }
    }

    fn inject(&mut self) {
        let weights: Vec<u32> = self.cfg.mix.faults.iter().map(|(_, w)| *w).collect();
        if weights.iter().all(|&w| w == 0) {
            return;
        }
        let fault = self.cfg.mix.faults[self.rng.weighted(&weights)].0;
        let slot = self.rng.range(0, self.slots.len() as u64) as usize;
        let event = self.rec.faults.len();
        let now = Instant::now();
        let t = now_us();
        let live = self.slots[slot].child.is_some();
        let pid = self.slots[slot].pid;
        let stalled = self.cfg.stalled_after;
        let happened = match fault {
            Fault::Kill if live => {
                if let Some(mut c) = self.slots[slot].child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                self.slots[slot].stdin = None;
                self.slots[slot].stopped = false;
                self.mark_died(pid, true);
                let d = self
                    .rng
                    .duration(Duration::from_millis(200), Duration::from_millis(1200));
                self.slots[slot].respawn_pending = true;
                self.heals.push((now + d, Heal::Respawn { slot }));
                Some((Some(slot), Some(pid), t, "SIGKILL".to_owned()))
            }
            Fault::Stop if live && !self.slots[slot].stopped => {
                let d = stalled
                    + self
                        .rng
                        .duration(Duration::from_millis(300), Duration::from_millis(2000));
                signal("STOP", pid);
                self.slots[slot].stopped = true;
                self.heals.push((now + d, Heal::Cont { slot, pid, event }));
                Some((
                    Some(slot),
                    Some(pid),
                    t + d.as_micros() as i64,
                    format!("SIGSTOP for {d:?}"),
                ))
            }
            Fault::Strand if !self.slots[slot].net_fault => {
                let d = self.rng.duration(
                    Duration::from_millis(300),
                    stalled + Duration::from_millis(1500),
                );
                let reset = self.rng.chance(0.5);
                let s = &mut self.slots[slot];
                for p in &s.proxies {
                    p.set_new_conns(NewConns::Strand);
                    p.strand_all();
                }
                s.net_fault = true;
                self.heals.push((now + d, Heal::Net { slot, reset, event }));
                Some((
                    Some(slot),
                    Some(pid),
                    t + d.as_micros() as i64,
                    format!(
                        "links stranded for {d:?}, then {}",
                        if reset { "reset" } else { "left" }
                    ),
                ))
            }
            Fault::Refuse if !self.slots[slot].net_fault => {
                let d = self
                    .rng
                    .duration(Duration::from_millis(200), Duration::from_millis(1500));
                let s = &mut self.slots[slot];
                for p in &s.proxies {
                    p.set_new_conns(NewConns::Refuse);
                    p.reset_all();
                }
                s.net_fault = true;
                self.heals.push((
                    now + d,
                    Heal::Net {
                        slot,
                        reset: false,
                        event,
                    },
                ));
                Some((
                    Some(slot),
                    Some(pid),
                    t + d.as_micros() as i64,
                    format!("links reset, connections refused for {d:?}"),
                ))
            }
            Fault::Reset => {
                for p in &self.slots[slot].proxies {
                    p.reset_all();
                }
                Some((Some(slot), Some(pid), t, "links reset".to_owned()))
            }
            Fault::Terminate => {
                let n: i64 = self
                    .ctl
                    .query_one(
                        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) \
                           FROM pg_stat_activity \
                          WHERE datname = current_database() AND application_name = 'postpone' \
                            AND pid <> pg_backend_pid() AND random() < 0.6",
                        &[],
                    )
                    .map(|r| r.get(0))
                    .unwrap_or(-1);
                Some((None, None, t, format!("{n} worker backends terminated")))
            }
            Fault::Abort => self.abort_one().map(|note| (None, None, t, note)),
            Fault::BareNotify => self.notify_one().map(|note| (None, None, t, note)),
            Fault::Restart => {
                let Some(cmd) = self.cfg.restart_cmd.clone() else {
                    return;
                };
                let status = Command::new("sh").arg("-c").arg(&cmd).status();
                Some((
                    None,
                    None,
                    now_us(),
                    format!("server restarted by {cmd:?}: {status:?}"),
                ))
            }
            f if f.is_server() && self.server.can(f) => {
                // Over already, or healed by a later tick (which sets `to`).
                self.server
                    .inject(f, &mut self.rng, event)
                    .map(|(slot, to, note)| (slot, None, to.unwrap_or(t), note))
            }
            _ => None,
        };
        let Some((slot, pid, to, note)) = happened else {
            return;
        };
        if self.cfg.verbose {
            eprintln!(
                "chaos: +{:.1}s {fault} slot {slot:?} pid {pid:?}: {note}",
                (t - self.rec.t0) as f64 / 1e6
            );
        }
        self.rec.faults.push(FaultEvent {
            fault,
            slot,
            pid,
            from: t,
            to,
            note,
        });
    }

    fn aborted(&self) -> HashSet<i64> {
        self.rec.aborts.iter().map(|a| a.job).collect()
    }

    /// A random running job (or, half of the time, a recent one) not aborted yet.
    fn pick_job(&mut self, running_first: bool) -> Option<i64> {
        let aborted = self.aborted();
        let notified: HashSet<i64> = self.rec.notifies.iter().map(|n| n.0).collect();
        let mut candidates: Vec<i64> = if running_first || self.rng.chance(0.5) {
            self.ctl
                .query(
                    "SELECT id FROM postpone_jobs \
                      WHERE status = 'doing' AND started_at IS NOT NULL ORDER BY id",
                    &[],
                )
                .map(|rows| rows.iter().map(|r| r.get(0)).collect())
                .unwrap_or_default()
        } else {
            self.recent.clone()
        };
        candidates.retain(|id| !aborted.contains(id) && !notified.contains(id));
        if candidates.is_empty() {
            return None;
        }
        let i = self.rng.range(0, candidates.len() as u64) as usize;
        Some(candidates[i])
    }

    fn attempts_of(&mut self, id: i64) -> Option<i32> {
        self.ctl
            .query_opt("SELECT attempts FROM postpone_jobs WHERE id = $1", &[&id])
            .ok()
            .flatten()
            .map(|r| r.get(0))
    }

    fn abort_one(&mut self) -> Option<String> {
        let id = self.pick_job(false)?;
        let attempts_before = self.attempts_of(id);
        let before = now_us();
        let outcome = self.app.admin().abort(JobId(id)).map_err(|e| e.to_string());
        let after = now_us();
        let attempts_after = self.attempts_of(id);
        let note = format!("job {id}: {outcome:?}");
        self.rec.aborts.push(AbortEvent {
            job: id,
            before,
            after,
            outcome,
            attempts_before,
            attempts_after,
        });
        Some(note)
    }

    fn notify_one(&mut self) -> Option<String> {
        let id = self.pick_job(true)?;
        let at = now_us();
        self.ctl
            .execute(
                "SELECT pg_notify('postpone', $1)",
                &[&format!("abort:{id}")],
            )
            .ok()?;
        self.rec.notifies.push((id, at));
        Some(format!("NOTIFY postpone 'abort:{id}' (no abort recorded)"))
    }

    /// Closes every process's stdin (its worker shuts down), waits (bounded), kills the rest.
    fn stop_all(&mut self) {
        for s in &mut self.slots {
            if s.stopped {
                signal("CONT", s.pid);
                s.stopped = false;
            }
            s.stdin = None;
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut running = 0;
            for slot in 0..self.slots.len() {
                let exited = match self.slots[slot].child.as_mut() {
                    Some(c) => c.try_wait().ok().flatten().is_some(),
                    None => continue,
                };
                if exited {
                    let pid = self.slots[slot].pid;
                    self.slots[slot].child = None;
                    self.mark_died(pid, false);
                } else {
                    running += 1;
                }
            }
            self.read_lines(Duration::from_millis(50));
            if running == 0 || Instant::now() >= deadline {
                break;
            }
        }
        for slot in 0..self.slots.len() {
            if let Some(mut c) = self.slots[slot].child.take() {
                let pid = self.slots[slot].pid;
                eprintln!("chaos: worker process {pid} did not stop within 15 s; killed");
                let _ = c.kill();
                let _ = c.wait();
                self.mark_died(pid, true);
            }
        }
        // Reports printed just before exit.
        self.read_lines(Duration::from_millis(200));
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if let Some(mut c) = s.child.take() {
                signal("CONT", s.pid);
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Sends SIGSTOP/SIGCONT through kill(1) (the crates here forbid unsafe code).
fn signal(sig: &str, pid: u32) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
