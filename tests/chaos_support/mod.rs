//! The chaos checker of issue 9: several worker processes run hostile tasks against the real
//! server while faults are injected at random from a seed; every execution is logged by the
//! task itself on a separate plain connection; afterwards a checker asserts the promises of
//! DESIGN.md (4, 7, 8, 9) on the logged executions and the final job rows.
//!
//! - [`child`]: the worker process (a test binary or the example, re-invoked with env
//!   `CHAOS_CHILD_URL`) and its tasks, one per hostile kind.
//! - [`run`]: the orchestrator: database, fault proxies, worker processes, the seeded fault
//!   schedule, the drain.
//! - [`feed`]: the deferrer thread, which reports every acknowledged defer.
//! - [`server`]: the server under test (the shared one, or a cluster of the run's own with a
//!   standby and PgBouncers) and its faults.
//! - [`check`]: the checker and the report.
//!
//! Used by `tests/chaos.rs` (a few seeds in CI) and `examples/chaos.rs` (as long as asked).
//! Both include this directory and `tests/support` as modules, hence the blanket `dead_code`
//! allowance (each uses part of it).
#![allow(dead_code)]

pub mod check;
pub mod child;
pub mod feed;
pub mod run;
pub mod server;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use check::Report;
pub use run::{run, Config};

/// Microseconds since the Unix epoch, from this machine's clock. Worker processes and the
/// orchestrator run on one machine, so their timestamps compare.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// SplitMix64: a small, fast, seedable generator (enough for picking faults).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`lo` if the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo)
    }

    /// A duration uniform in `lo..hi`.
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        Duration::from_millis(self.range(lo.as_millis() as u64, hi.as_millis() as u64))
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// Index picked with the given weights (all zero: 0).
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        if total == 0 {
            return 0;
        }
        let mut x = self.range(0, total);
        for (i, &w) in weights.iter().enumerate() {
            if x < u64::from(w) {
                return i;
            }
            x -= u64::from(w);
        }
        weights.len() - 1
    }
}

/// Faults the orchestrator injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// SIGKILL a worker process (a new one takes its slot shortly after).
    Kill,
    /// SIGSTOP a worker process for longer than `stalled_after`, then SIGCONT.
    Stop,
    /// Strand every link of a worker (half-open) and its new connections for a while.
    Strand,
    /// Reset every link of a worker.
    Reset,
    /// Refuse a worker's new connections for a while (and reset its links).
    Refuse,
    /// `pg_terminate_backend` on some of the workers' backends.
    Terminate,
    /// Abort a job through the admin API.
    Abort,
    /// A bare `NOTIFY postpone, 'abort:<id>'`, as any role may send.
    BareNotify,
    /// Restart the server with a user-given command (never in CI: the server is shared).
    Restart,
    /// `pg_ctl restart -m fast` of a server of the run's own.
    RestartFast,
    /// `pg_ctl restart -m immediate` (a crash and its recovery) of a server of the run's own.
    RestartImmediate,
    /// Stop the primary (immediate) and promote its streaming standby.
    Failover,
    /// Stop a PgBouncer for a while, then start it again.
    BouncerRestart,
    /// Every connection slot of the server held for a while.
    ConnsExhausted,
    /// `default_transaction_read_only = on` for a while (`ALTER SYSTEM`, reload).
    ReadOnly,
    /// A low `statement_timeout` for a while.
    StatementTimeout,
    /// A low `lock_timeout` for a while.
    LockTimeout,
    /// Not injected: a PgBouncer that ended on its own (and was started again).
    BouncerCrash,
}

impl Fault {
    pub const ALL: [Fault; 18] = [
        Fault::Kill,
        Fault::Stop,
        Fault::Strand,
        Fault::Reset,
        Fault::Refuse,
        Fault::Terminate,
        Fault::Abort,
        Fault::BareNotify,
        Fault::Restart,
        Fault::RestartFast,
        Fault::RestartImmediate,
        Fault::Failover,
        Fault::BouncerRestart,
        Fault::ConnsExhausted,
        Fault::ReadOnly,
        Fault::StatementTimeout,
        Fault::LockTimeout,
        Fault::BouncerCrash,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::Strand => "strand",
            Fault::Reset => "reset",
            Fault::Refuse => "refuse",
            Fault::Terminate => "terminate",
            Fault::Abort => "abort",
            Fault::BareNotify => "bare_notify",
            Fault::Restart => "restart",
            Fault::RestartFast => "restart_fast",
            Fault::RestartImmediate => "restart_immediate",
            Fault::Failover => "failover",
            Fault::BouncerRestart => "bouncer_restart",
            Fault::ConnsExhausted => "conns_exhausted",
            Fault::ReadOnly => "read_only",
            Fault::StatementTimeout => "statement_timeout",
            Fault::LockTimeout => "lock_timeout",
            Fault::BouncerCrash => "bouncer_crash",
        }
    }

    /// Default weight in the random pick (Restart only with an explicit command, the
    /// server's faults only on a server of the run's own: see [`Mix::with_own_server`]).
    pub fn default_weight(self) -> u32 {
        match self {
            Fault::Kill => 2,
            Fault::Stop => 2,
            Fault::Strand => 2,
            Fault::Reset => 2,
            Fault::Refuse => 1,
            Fault::Terminate => 2,
            Fault::Abort => 4,
            Fault::BareNotify => 2,
            _ => 0,
        }
    }

    /// A fault of the server itself (a server of the run's own).
    pub fn is_server(self) -> bool {
        matches!(
            self,
            Fault::RestartFast
                | Fault::RestartImmediate
                | Fault::Failover
                | Fault::BouncerRestart
                | Fault::ConnsExhausted
                | Fault::ReadOnly
                | Fault::StatementTimeout
                | Fault::LockTimeout
        )
    }

    /// Whether it can make a worker look dead (stop its heartbeats) while it lasts.
    pub fn disturbs(self) -> bool {
        !matches!(self, Fault::Abort | Fault::BareNotify)
    }
}

/// The kinds of task the orchestrator defers; each is a task named `chaos_<name>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Works a little (checking `should_abort`), succeeds.
    Ok,
    /// Works 1-3.5 s (a target for kills and pauses), succeeds.
    Slow,
    /// Fails with a NUL byte in its message.
    NulFail,
    /// Panics with a NUL byte in its message.
    NulPanic,
    /// Panics.
    Panic,
    /// `TaskError::retry_in(.., Duration::MAX)` (strategy: 3 attempts).
    HugeDelay,
    /// Retries on its first attempt, then succeeds (strategy: 3 attempts).
    RetryOnce,
    /// Defers a successor under its own queueing lock (half of the jobs also have it as
    /// their lock), works 0.3-2 s, then asks for a retry: the requeue collides with the
    /// successor, and so does a rescue when its worker is killed or paused meanwhile.
    QlockCollide,
    /// Runs past its task timeout (300 ms) until `should_abort`, then fails.
    Timeout,
    /// Cancels itself.
    Cancel,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Ok,
        Kind::Slow,
        Kind::NulFail,
        Kind::NulPanic,
        Kind::Panic,
        Kind::HugeDelay,
        Kind::RetryOnce,
        Kind::QlockCollide,
        Kind::Timeout,
        Kind::Cancel,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Ok => "ok",
            Kind::Slow => "slow",
            Kind::NulFail => "nul_fail",
            Kind::NulPanic => "nul_panic",
            Kind::Panic => "panic",
            Kind::HugeDelay => "huge_delay",
            Kind::RetryOnce => "retry_once",
            Kind::QlockCollide => "qlock_collide",
            Kind::Timeout => "timeout",
            Kind::Cancel => "cancel",
        }
    }

    pub fn task(self) -> String {
        format!("chaos_{}", self.name())
    }

    pub fn from_task(task: &str) -> Option<Kind> {
        let name = task.strip_prefix("chaos_")?;
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn default_weight(self) -> u32 {
        match self {
            Kind::Ok => 10,
            Kind::Slow => 4,
            Kind::NulFail => 1,
            Kind::NulPanic => 1,
            Kind::Panic => 1,
            Kind::HugeDelay => 1,
            Kind::RetryOnce => 2,
            Kind::QlockCollide => 2,
            Kind::Timeout => 1,
            Kind::Cancel => 1,
        }
    }
}

/// Which faults and task kinds a run uses, with their weights.
#[derive(Clone, Debug)]
pub struct Mix {
    pub faults: Vec<(Fault, u32)>,
    pub kinds: Vec<(Kind, u32)>,
    /// Faults named in [`excluding`](Mix::excluding), kept out by later calls too.
    pub excluded: Vec<Fault>,
}

impl Default for Mix {
    fn default() -> Mix {
        Mix {
            faults: Fault::ALL
                .iter()
                .map(|&f| (f, f.default_weight()))
                .collect(),
            kinds: Kind::ALL.iter().map(|&k| (k, k.default_weight())).collect(),
            excluded: Vec::new(),
        }
    }
}

impl Mix {
    /// Leaves out the faults and kinds named in `names` (comma-separated, as printed by
    /// [`Fault::name`] and [`Kind::name`]). An unknown name is an error.
    pub fn excluding(mut self, names: &str) -> Result<Mix, String> {
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let mut known = false;
            for (f, w) in &mut self.faults {
                if f.name() == name {
                    *w = 0;
                    known = true;
                    self.excluded.push(*f);
                }
            }
            for (k, w) in &mut self.kinds {
                if k.name() == name {
                    *w = 0;
                    known = true;
                }
            }
            if !known {
                return Err(format!(
                    "unknown fault or task kind {name:?} (faults: {}; kinds: {})",
                    Fault::ALL.map(Fault::name).join(", "),
                    Kind::ALL.map(Kind::name).join(", ")
                ));
            }
        }
        Ok(self)
    }

    /// Turns on the faults a server of the run's own allows: restarts, the read-only and
    /// timeout settings, exhausted connections, a failover with a standby, a PgBouncer
    /// restart with bouncers. Faults excluded before stay out.
    pub fn with_own_server(mut self, own: &server::OwnServer) -> Mix {
        for (f, w) in &mut self.faults {
            let on = match f {
                Fault::RestartFast
                | Fault::RestartImmediate
                | Fault::ConnsExhausted
                | Fault::ReadOnly
                | Fault::StatementTimeout
                | Fault::LockTimeout => true,
                Fault::Failover => own.replication != server::Replication::None,
                Fault::BouncerRestart => own.bouncers,
                _ => false,
            };
            if on && !self.excluded.contains(f) {
                *w = 1;
            }
        }
        self
    }

    /// Gives `fault` weight `w` (e.g. Restart, off by default).
    pub fn with_fault(mut self, fault: Fault, w: u32) -> Mix {
        for (f, weight) in &mut self.faults {
            if *f == fault {
                *weight = w;
            }
        }
        self
    }

    pub fn enabled(&self) -> String {
        let f: Vec<&str> = self
            .faults
            .iter()
            .filter(|(_, w)| *w > 0)
            .map(|(f, _)| f.name())
            .collect();
        let k: Vec<&str> = self
            .kinds
            .iter()
            .filter(|(_, w)| *w > 0)
            .map(|(k, _)| k.name())
            .collect();
        format!("faults [{}], tasks [{}]", f.join(" "), k.join(" "))
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
