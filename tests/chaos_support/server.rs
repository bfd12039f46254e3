//! The server of a chaos run, and the faults injected into it.
//!
//! - **Shared** (the default, CI): a fresh database on the machine's server (`DATABASE_URL`).
//!   No fault touches the server itself, unless the example is given a restart command.
//! - **Own** ([`OwnServer`]): a cluster the run creates with initdb on a spare port
//!   (`tests/support/cluster.rs`), with `synchronous_commit = on`, optionally a streaming
//!   standby (asynchronous or synchronous replication) and PgBouncers in front of it for slots
//!   0 (transaction pooling) and 1 (session pooling). The run's URLs list both hosts with
//!   `target_session_attrs=read-write`. Faults on the server, one at a time:
//!   - `restart_fast`, `restart_immediate`: `pg_ctl restart -m fast|immediate` (the latter is
//!     a crash and its recovery); over when the standby streams again.
//!   - `failover`: stop the primary (immediate), promote the standby, point the bouncers at
//!     it. The old primary is rebuilt as the new standby with pg_basebackup in the background
//!     (on its old port); the next failover waits until it streams (and, with synchronous
//!     replication, is the synchronous standby again: until then the new primary commits
//!     alone, as a non-strict synchronous setup does).
//!   - `bouncer_restart`: one PgBouncer stops (every client and server link cut) and starts
//!     again on its port after a while.
//!   - `conns_exhausted`: every connection slot of the server, the superuser's reserve
//!     included, held by idle sessions for a while.
//!   - `read_only`, `statement_timeout`, `lock_timeout`: set by an administrator
//!     (`ALTER SYSTEM` and a reload, so open sessions get it too) for a while, then reset.
//!
//! The execution log lives apart from the server under test (a fresh database on the shared
//! server, the *observer*), so that nothing the faults do to the server touches the evidence.
//!
//! For the checker, every failover records the moment before which every commit had reached
//! the standby (from the primary's WAL position sampled every 100 ms and the standby's
//! received position at the stop): with asynchronous replication, what was acknowledged
//! after it may be gone.

use std::collections::VecDeque;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use postgres::{Client, NoTls};

use super::{now_us, Fault, Rng};
use crate::support::{Cluster, PgBouncer, PoolMode, TestDb};

/// How a standby follows the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replication {
    /// No standby (no failover).
    None,
    /// Asynchronous streaming: a commit is acknowledged once the primary has it.
    Async,
    /// Synchronous streaming (`synchronous_standby_names = '*'`): a commit is acknowledged
    /// once the standby has it too.
    Sync,
}

impl Replication {
    pub fn parse(s: &str) -> Result<Replication, String> {
        match s {
            "none" => Ok(Replication::None),
            "async" => Ok(Replication::Async),
            "sync" => Ok(Replication::Sync),
            other => Err(format!(
                "replication {other:?} is not one of none, async, sync"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Replication::None => "none",
            Replication::Async => "async",
            Replication::Sync => "sync",
        }
    }
}

/// A server of the run's own (see the module's summary).
#[derive(Clone, Debug)]
pub struct OwnServer {
    pub replication: Replication,
    /// PgBouncer in front of slot 0 (transaction pooling) and slot 1 (session pooling).
    pub bouncers: bool,
    /// The server's `max_connections`.
    pub max_connections: u32,
}

impl Default for OwnServer {
    fn default() -> OwnServer {
        OwnServer {
            replication: Replication::Sync,
            bouncers: true,
            max_connections: 80,
        }
    }
}

/// One failover, for the checker.
#[derive(Clone, Debug)]
pub struct Failover {
    /// When the primary was stopped (µs since the epoch).
    pub stop: i64,
    /// Every commit acknowledged before this had reached the standby (None: unknown).
    pub safe: Option<i64>,
}

/// A server fault in progress, and when it ends.
enum Active {
    Hog {
        stop: Sender<()>,
        join: JoinHandle<usize>,
    },
    Setting {
        name: &'static str,
    },
    BouncerDown {
        bouncer: usize,
    },
}

/// Name of the database of the jobs on a server of our own.
const DB: &str = "chaos";

/// The jobs' server of a run, its observer database, and its faults.
pub struct Server {
    /// The execution log (and, on the shared server, the jobs).
    pub observer: TestDb,
    own: Option<Own>,
}

struct Own {
    setup: OwnServer,
    /// The nodes by index (None while being rebuilt); node i listens on `ports[i]`.
    nodes: Vec<Option<Cluster>>,
    ports: Vec<u16>,
    primary: usize,
    /// (slot, bouncer).
    bouncers: Vec<(usize, PgBouncer)>,
    /// The node being rebuilt as a standby, in the background.
    rebuild: Option<(usize, JoinHandle<Result<Cluster, String>>)>,
    active: Option<(Active, Instant, usize)>,
    /// (µs since the epoch, the primary's WAL insert position).
    lsn: VecDeque<(i64, i64)>,
    last_sample: Instant,
    /// The connection that samples the primary's WAL position (and its port).
    sampler: Option<(u16, Client)>,
    /// When the last tick ran (µs since the epoch).
    last_tick: i64,
    /// Faults nobody injected (a PgBouncer that crashed): fault, slot, from, to, note.
    unplanned: Vec<(Fault, Option<usize>, i64, i64, String)>,
    pub failovers: Vec<Failover>,
}

impl Server {
    /// The shared server (a fresh database, dropped with this value), or a cluster of our own.
    pub fn new(own: Option<&OwnServer>) -> Server {
        let observer = TestDb::new();
        let own = own.map(Own::start);
        Server { observer, own }
    }

    /// Why a server of our own cannot run here (None: it can, or none is asked for).
    pub fn skip_reason(own: Option<&OwnServer>) -> Option<String> {
        let own = own?;
        if let Some(r) = crate::support::cluster::skip_reason() {
            return Some(r);
        }
        if own.bouncers {
            return PgBouncer::skip_reason();
        }
        None
    }

    pub fn is_own(&self) -> bool {
        self.own.is_some()
    }

    pub fn replication(&self) -> Replication {
        self.own
            .as_ref()
            .map_or(Replication::None, |o| o.setup.replication)
    }

    /// The execution log's URL.
    pub fn log_url(&self) -> String {
        self.observer.url()
    }

    /// The jobs' database, direct (every host listed, the writable one picked).
    pub fn url(&self) -> String {
        match &self.own {
            None => self.observer.url(),
            Some(o) => o.url_at(
                &o.ports
                    .iter()
                    .map(|p| format!("127.0.0.1:{p}"))
                    .collect::<Vec<_>>(),
            ),
        }
    }

    /// Where a slot's fault proxies forward to: one proxy per address.
    pub fn upstreams(&self, slot: usize) -> Vec<String> {
        match &self.own {
            None => vec![self.observer.server_addr()],
            Some(o) => match o.bouncer_of(slot) {
                Some(b) => vec![format!("127.0.0.1:{}", b.port())],
                None => o.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
            },
        }
    }

    /// The URL of a slot's worker, through its proxies (listening on `proxy_ports`, in the
    /// order of [`upstreams`](Self::upstreams)), and the URL its LISTEN connection takes
    /// instead (a slot behind a transaction pooler listens directly).
    pub fn slot_urls(&self, slot: usize, proxy_ports: &[u16]) -> (String, Option<String>) {
        let hosts: Vec<String> = proxy_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        match &self.own {
            None => (
                self.observer
                    .server()
                    .url_at(&hosts[0], self.observer.name()),
                None,
            ),
            Some(o) => match o.bouncer_of(slot) {
                Some(b) if b.mode() == PoolMode::Transaction => (
                    format!(
                        "postgres://postgres@{}/{DB}?pooler_mode=transaction",
                        hosts[0]
                    ),
                    Some(self.url()),
                ),
                Some(_) => (format!("postgres://postgres@{}/{DB}", hosts[0]), None),
                None => (o.url_at(&hosts), None),
            },
        }
    }

    /// The pool mode in front of `slot`, if a PgBouncer is.
    pub fn pooler(&self, slot: usize) -> Option<PoolMode> {
        self.own.as_ref()?.bouncer_of(slot).map(PgBouncer::mode)
    }

    /// A plain client to the jobs' database (the current primary).
    pub fn client(&self) -> Result<Client, postgres::Error> {
        let url = self.url();
        let sep = if url.contains('?') { '&' } else { '?' };
        Client::connect(
            &format!("{url}{sep}connect_timeout=5&application_name=chaos-ctl"),
            NoTls,
        )
    }

    /// The failovers so far.
    pub fn failovers(&self) -> Vec<Failover> {
        self.own
            .as_ref()
            .map(|o| o.failovers.clone())
            .unwrap_or_default()
    }

    /// Whether `fault` can be injected now (server faults: one at a time, each only where it
    /// applies).
    pub fn can(&self, fault: Fault) -> bool {
        let Some(o) = &self.own else {
            return false;
        };
        if o.active.is_some() {
            return false;
        }
        match fault {
            Fault::RestartFast | Fault::RestartImmediate => o.rebuild.is_none(),
            Fault::Failover => o.setup.replication != Replication::None && o.rebuild.is_none(),
            Fault::BouncerRestart => !o.bouncers.is_empty(),
            Fault::ConnsExhausted => o.rebuild.is_none(),
            Fault::ReadOnly | Fault::StatementTimeout | Fault::LockTimeout => true,
            _ => false,
        }
    }

    /// Injects a server fault (after [`can`](Self::can) said yes). Returns the slot it is
    /// limited to (None: every slot), when it is over if it is over already (else it ends at
    /// a later [`tick`](Self::tick)), and a note; `event` is the index its record will have.
    pub fn inject(
        &mut self,
        fault: Fault,
        rng: &mut Rng,
        event: usize,
    ) -> Option<(Option<usize>, Option<i64>, String)> {
        let o = self.own.as_mut()?;
        o.inject(fault, rng, event)
    }

    /// Samples the WAL position, ends the server fault in progress when its time is up,
    /// collects a finished rebuild. Returns the events that ended, with when.
    pub fn tick(&mut self, heal_all: bool) -> Vec<(usize, i64)> {
        match self.own.as_mut() {
            Some(o) => o.tick(heal_all),
            None => Vec::new(),
        }
    }

    /// Faults that happened without being injected since the last call (a PgBouncer that
    /// crashed): fault, slot, from, to, note.
    pub fn take_unplanned(&mut self) -> Vec<(Fault, Option<usize>, i64, i64, String)> {
        self.own
            .as_mut()
            .map(|o| std::mem::take(&mut o.unplanned))
            .unwrap_or_default()
    }

    /// Ends every server fault now and waits (up to `timeout`) for a rebuild in progress,
    /// and for a setting whose reset failed (the server was restarting) to be reset: a low
    /// `statement_timeout` left behind would fail the drain's and the judge's reads.
    pub fn heal_all(&mut self, timeout: Duration) -> Vec<(usize, i64)> {
        let mut ended = self.tick(true);
        let deadline = Instant::now() + timeout;
        while self
            .own
            .as_ref()
            .is_some_and(|o| o.rebuild.is_some() || o.active.is_some())
            && Instant::now() < deadline
        {
            thread::sleep(Duration::from_millis(50));
            ended.extend(self.tick(true));
        }
        ended
    }
}

impl Own {
    fn start(setup: &OwnServer) -> Own {
        let mut a = Cluster::primary_with("chaos-a", "", "");
        let mut admin = a.client("postgres");
        // Each alone: ALTER SYSTEM refuses to run in a transaction block, and a multi-
        // statement query is one.
        for sql in [
            format!(
                "ALTER SYSTEM SET max_connections = {}",
                setup.max_connections
            ),
            "ALTER SYSTEM SET synchronous_commit = on".to_owned(),
            "ALTER SYSTEM SET wal_retrieve_retry_interval = '200ms'".to_owned(),
            format!("CREATE DATABASE {DB}"),
        ] {
            admin
                .batch_execute(&sql)
                .unwrap_or_else(|e| panic!("chaos: configuring the server of our own: {sql}: {e}"));
        }
        drop(admin);
        a.restart("fast");
        let mut nodes = vec![Some(a)];
        let mut ports = vec![nodes[0].as_ref().map_or(0, Cluster::port)];
        if setup.replication != Replication::None {
            let b = Cluster::standby_of(nodes[0].as_ref().expect("node a"), "chaos-b");
            ports.push(b.port());
            nodes.push(Some(b));
        }
        let mut own = Own {
            setup: setup.clone(),
            nodes,
            ports,
            primary: 0,
            bouncers: Vec::new(),
            rebuild: None,
            active: None,
            lsn: VecDeque::new(),
            last_sample: Instant::now(),
            sampler: None,
            last_tick: now_us(),
            unplanned: Vec::new(),
            failovers: Vec::new(),
        };
        if setup.replication == Replication::Sync {
            own.set_sync(true)
                .expect("chaos: turning synchronous replication on");
        }
        if setup.replication != Replication::None {
            assert!(
                own.wait_streaming(Duration::from_secs(30)),
                "chaos: the standby did not stream within 30 s"
            );
        }
        if setup.bouncers {
            let upstream = own.primary_addr();
            own.bouncers
                .push((0, PgBouncer::start(&upstream, PoolMode::Transaction, 8)));
            own.bouncers
                .push((1, PgBouncer::start(&upstream, PoolMode::Session, 8)));
        }
        own
    }

    fn url_at(&self, hosts: &[String]) -> String {
        let mut url = format!("postgres://postgres@{}/{DB}", hosts.join(","));
        if hosts.len() > 1 {
            url.push_str("?target_session_attrs=read-write");
        }
        url
    }

    fn bouncer_of(&self, slot: usize) -> Option<&PgBouncer> {
        self.bouncers
            .iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, b)| b)
    }

    fn primary_addr(&self) -> String {
        format!("127.0.0.1:{}", self.ports[self.primary])
    }

    fn standby(&self) -> Option<usize> {
        (self.ports.len() > 1).then_some(1 - self.primary)
    }

    fn admin(&self, i: usize) -> Result<Client, postgres::Error> {
        admin(self.ports[i])
    }

    fn set_sync(&self, on: bool) -> Result<(), String> {
        set_sync(self.ports[self.primary], on)
    }

    /// Waits until the primary answers and, with a standby that is not being rebuilt, sends
    /// it WAL (as its synchronous standby with synchronous replication).
    fn wait_streaming(&self, timeout: Duration) -> bool {
        let standby = self.standby().is_some() && self.rebuild.is_none();
        let sync = self.setup.replication == Replication::Sync;
        wait_streaming(self.ports[self.primary], standby, sync, timeout)
    }

    fn inject(
        &mut self,
        fault: Fault,
        rng: &mut Rng,
        event: usize,
    ) -> Option<(Option<usize>, Option<i64>, String)> {
        let now = Instant::now();
        match fault {
            Fault::RestartFast | Fault::RestartImmediate => {
                let mode = if fault == Fault::RestartFast {
                    "fast"
                } else {
                    "immediate"
                };
                let started = Instant::now();
                self.nodes[self.primary]
                    .as_mut()
                    .expect("the primary exists")
                    .restart(mode);
                let restarted = started.elapsed();
                let streaming = self.wait_streaming(Duration::from_secs(30));
                Some((
                    None,
                    Some(now_us()),
                    format!(
                        "pg_ctl restart -m {mode} took {restarted:?}; {} after {:?}",
                        if streaming {
                            "writable (and streaming)"
                        } else {
                            "NOT streaming"
                        },
                        started.elapsed()
                    ),
                ))
            }
            Fault::Failover => {
                let old = self.primary;
                let new = self.standby()?;
                let stop = now_us();
                self.nodes[old]
                    .as_mut()
                    .expect("the primary exists")
                    .stop("immediate");
                // Everything the standby received is replayed by the promotion.
                let received: Option<i64> = self.admin(new).ok().and_then(|mut c| {
                    c.query_one(
                        "SELECT (pg_last_wal_receive_lsn() - '0/0'::pg_lsn)::bigint",
                        &[],
                    )
                    .ok()
                    .and_then(|r| r.get(0))
                });
                let safe = received.and_then(|lsn| {
                    self.lsn
                        .iter()
                        .filter(|(_, l)| *l <= lsn)
                        .map(|(t, _)| *t)
                        .max()
                });
                self.nodes[new]
                    .as_ref()
                    .expect("the standby exists")
                    .promote();
                self.primary = new;
                self.lsn.clear();
                let mut notes = Vec::new();
                if self.setup.replication == Replication::Sync {
                    // Alone until the old primary streams again.
                    if let Err(e) = self.set_sync(false) {
                        notes.push(e);
                    }
                }
                let upstream = self.primary_addr();
                for (_, b) in &mut self.bouncers {
                    if let Err(e) = b.set_upstream(&upstream) {
                        notes.push(e);
                    }
                }
                let promoted = now_us();
                self.failovers.push(Failover { stop, safe });
                // Rebuild the old primary as the new standby, in the background.
                let node = self.nodes[old].take().expect("the old primary exists");
                let port = self.ports[new];
                let sync = self.setup.replication == Replication::Sync;
                let join = thread::Builder::new()
                    .name("chaos-rebuild".into())
                    .spawn(move || rebuild(node, port, sync))
                    .expect("chaos: the rebuild thread");
                self.rebuild = Some((old, join));
                Some((
                    None,
                    Some(promoted),
                    format!(
                        "primary :{} stopped (immediate), standby :{} promoted in {:.0} ms; \
                         safe up to {}{}",
                        self.ports[old],
                        self.ports[new],
                        (promoted - stop) as f64 / 1000.0,
                        safe.map_or("unknown".to_owned(), |s| format!(
                            "{:.0} ms before the stop",
                            (stop - s) as f64 / 1000.0
                        )),
                        if notes.is_empty() {
                            String::new()
                        } else {
                            format!("; {}", notes.join("; "))
                        }
                    ),
                ))
            }
            Fault::BouncerRestart => {
                let i = rng.range(0, self.bouncers.len() as u64) as usize;
                let d = rng.duration(Duration::from_millis(100), Duration::from_millis(1500));
                let (slot, b) = &mut self.bouncers[i];
                b.stop();
                let note = format!("pgbouncer ({}) stopped for {d:?}", b.mode().as_str());
                let slot = *slot;
                self.active = Some((Active::BouncerDown { bouncer: i }, now + d, event));
                Some((Some(slot), None, note))
            }
            Fault::ConnsExhausted => {
                let d = rng.duration(Duration::from_millis(500), Duration::from_millis(4000));
                let port = self.ports[self.primary];
                let (stop, stop_rx) = bounded::<()>(1);
                let (held_tx, held_rx) = bounded::<usize>(1);
                let join = thread::Builder::new()
                    .name("chaos-hog".into())
                    .spawn(move || hog(port, held_tx, stop_rx))
                    .expect("chaos: the connection hog");
                let held = held_rx.recv_timeout(Duration::from_secs(30)).unwrap_or(0);
                self.active = Some((Active::Hog { stop, join }, Instant::now() + d, event));
                Some((
                    None,
                    None,
                    format!("every connection slot held ({held} sessions) for {d:?}"),
                ))
            }
            Fault::ReadOnly | Fault::StatementTimeout | Fault::LockTimeout => {
                let d = rng.duration(Duration::from_millis(300), Duration::from_millis(3000));
                let (name, value) = match fault {
                    Fault::ReadOnly => ("default_transaction_read_only", "on".to_owned()),
                    Fault::StatementTimeout => {
                        ("statement_timeout", format!("{}ms", rng.range(5, 200)))
                    }
                    _ => ("lock_timeout", format!("{}ms", rng.range(1, 50))),
                };
                let set =
                    alter_system(self.ports[self.primary], &format!("SET {name} = '{value}'"));
                if let Err(e) = set {
                    return Some((None, Some(now_us()), format!("setting {name}: {e}")));
                }
                self.active = Some((Active::Setting { name }, now + d, event));
                Some((None, None, format!("{name} = {value} for {d:?}")))
            }
            _ => None,
        }
    }

    fn tick(&mut self, heal_all: bool) -> Vec<(usize, i64)> {
        let mut ended = Vec::new();
        for (slot, b) in &mut self.bouncers {
            if let Some(how) = b.exited() {
                // Not a fault of the run's: say so, start it again, and tell the checker
                // (from the last tick, when it was seen alive, to now).
                eprintln!("chaos: the PgBouncer of slot {slot} ended on its own: {how}");
                b.start_again();
                let last_line = how.lines().last().unwrap_or_default().to_owned();
                self.unplanned.push((
                    Fault::BouncerCrash,
                    Some(*slot),
                    self.last_tick,
                    now_us(),
                    format!(
                        "pgbouncer ({}) ended on its own: {last_line}",
                        b.mode().as_str()
                    ),
                ));
            }
        }
        self.last_tick = now_us();
        if self.last_sample.elapsed() >= Duration::from_millis(100) {
            self.last_sample = Instant::now();
            self.sample();
        }
        let due = self
            .active
            .as_ref()
            .is_some_and(|(_, until, _)| heal_all || Instant::now() >= *until);
        if due {
            let (active, _, event) = self.active.take().expect("checked");
            match active {
                Active::Hog { stop, join } => {
                    let _ = stop.send(());
                    let _ = join.join();
                }
                Active::Setting { name } => {
                    let reset = alter_system(self.ports[self.primary], &format!("RESET {name}"));
                    if let Err(e) = reset {
                        // Try again at the next tick.
                        eprintln!("chaos: resetting {name}: {e}");
                        self.active = Some((
                            Active::Setting { name },
                            Instant::now() + Duration::from_millis(200),
                            event,
                        ));
                        return ended;
                    }
                }
                Active::BouncerDown { bouncer } => self.bouncers[bouncer].1.start_again(),
            }
            ended.push((event, now_us()));
        }
        let finished = self
            .rebuild
            .as_ref()
            .is_some_and(|(_, join)| join.is_finished());
        if finished {
            let (i, join) = self.rebuild.take().expect("checked");
            match join.join() {
                Ok(Ok(node)) => self.nodes[i] = Some(node),
                Ok(Err(e)) => panic!("chaos: rebuilding the old primary as a standby: {e}"),
                Err(_) => panic!("chaos: the rebuild thread panicked"),
            }
        }
        ended
    }

    /// Records the primary's WAL insert position now (kept for 60 s).
    fn sample(&mut self) {
        if self.setup.replication == Replication::None {
            return;
        }
        if self
            .sampler
            .as_ref()
            .is_none_or(|(port, c)| *port != self.ports[self.primary] || c.is_closed())
        {
            self.sampler = admin(self.ports[self.primary])
                .ok()
                .map(|c| (self.ports[self.primary], c));
        }
        let Some((_, c)) = self.sampler.as_mut() else {
            return;
        };
        let lsn: Option<i64> = c
            .query_one(
                "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint",
                &[],
            )
            .ok()
            .and_then(|r| r.get(0));
        match lsn {
            Some(lsn) => {
                let t = now_us();
                self.lsn.push_back((t, lsn));
                while self.lsn.front().is_some_and(|(t0, _)| t - t0 > 60_000_000) {
                    self.lsn.pop_front();
                }
            }
            None => self.sampler = None,
        }
    }
}

/// A plain connection to the `postgres` database of the node on `port` (TCP, short
/// deadlines), free of the administrator's settings under test.
fn admin(port: u16) -> Result<Client, postgres::Error> {
    Client::connect(
        &format!(
            "host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=5 \
             application_name=chaos-admin options='-c default_transaction_read_only=off \
             -c statement_timeout=10s -c lock_timeout=0'"
        ),
        NoTls,
    )
}

/// `synchronous_standby_names` on the primary on `port`: '*' or ''.
fn set_sync(port: u16, on: bool) -> Result<(), String> {
    alter_system(
        port,
        &format!(
            "SET synchronous_standby_names = '{}'",
            if on { "*" } else { "" }
        ),
    )
    .map_err(|e| format!("setting synchronous_standby_names: {e}"))
}

/// `ALTER SYSTEM <what>` on the node on `port`, then a reload (open sessions take it at
/// their next statement).
fn alter_system(port: u16, what: &str) -> Result<(), postgres::Error> {
    let mut c = admin(port)?;
    c.batch_execute(&format!("ALTER SYSTEM {what}"))?;
    c.batch_execute("SELECT pg_reload_conf()")
}

/// Waits until the primary on `port` answers and, if `standby`, sends WAL to a standby (its
/// synchronous standby if `sync`).
fn wait_streaming(port: u16, standby: bool, sync: bool, timeout: Duration) -> bool {
    crate::support::wait_until(timeout, || {
        let Ok(mut c) = admin(port) else {
            return false;
        };
        if !standby {
            return c.simple_query("SELECT 1").is_ok();
        }
        c.query_one(
            "SELECT count(*) FROM pg_stat_replication \
              WHERE state = 'streaming' AND (NOT $1 OR sync_state = 'sync')",
            &[&sync],
        )
        .is_ok_and(|r| r.get::<_, i64>(0) > 0)
    })
}

/// Makes `node` a standby of the primary on `port` (a few tries), waits until it streams,
/// and with synchronous replication makes it the synchronous standby.
fn rebuild(mut node: Cluster, port: u16, sync: bool) -> Result<Cluster, String> {
    let mut last = String::new();
    for _ in 0..5 {
        let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            node.reseed_from(port);
        }));
        match tried {
            Ok(()) => {
                if !wait_streaming(port, true, false, Duration::from_secs(30)) {
                    return Err("the rebuilt standby does not stream after 30 s".into());
                }
                if sync {
                    set_sync(port, true)?;
                    if !wait_streaming(port, true, true, Duration::from_secs(30)) {
                        return Err("the rebuilt standby is not synchronous after 30 s".into());
                    }
                }
                return Ok(node);
            }
            Err(p) => {
                last = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "a panic".to_owned());
                eprintln!("chaos: rebuilding the standby failed, trying again: {last}");
                thread::sleep(Duration::from_secs(1));
            }
        }
    }
    Err(last)
}

/// Opens sessions to the server on `port` until it refuses one, says how many it holds,
/// holds them until told to stop, and returns how many it held.
fn hog(port: u16, held_tx: Sender<usize>, stop: Receiver<()>) -> usize {
    let mut held = Vec::new();
    let url = format!(
        "host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=5 \
         application_name=chaos-hog"
    );
    // Bounded: a server that never refuses is not held forever.
    while held.len() < 2000 {
        match Client::connect(&url, NoTls) {
            Ok(c) => held.push(c),
            Err(_) => break,
        }
    }
    let n = held.len();
    let _ = held_tx.send(n);
    let _ = stop.recv();
    n
}

impl Drop for Own {
    fn drop(&mut self) {
        if let Some((Active::Hog { stop, join }, _, _)) = self.active.take() {
            let _ = stop.send(());
            let _ = join.join();
        }
        if let Some((_, join)) = self.rebuild.take() {
            let _ = join.join();
        }
    }
}
