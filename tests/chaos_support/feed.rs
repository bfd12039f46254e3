//! The deferrer of a chaos run: a thread of its own (a defer may wait for its deadline while
//! the server is down, and the faults must go on meanwhile) that defers jobs at the run's rate
//! and reports each one, acknowledged or not.
//!
//! Every job carries a sequence number in its arguments (`seq`), so that a job row, an
//! execution and an acknowledgement name one deferral even if a failover hands the same id
//! to another job. Its choices (task kind, duration, lock) come from its own generator,
//! seeded from the run's seed.

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use postpone::App;

use super::child::Args;
use super::{now_us, Kind, Mix, Rng};

/// One deferral and what `defer` answered.
#[derive(Clone, Debug)]
pub struct Deferral {
    pub seq: u64,
    pub kind: Kind,
    /// The job's id (the commit was acknowledged), or the error.
    pub result: Result<i64, String>,
    /// When `defer` was called and when it returned (µs since the epoch).
    pub called: i64,
    pub returned: i64,
}

/// Defers `per_sec` jobs a second from now until `until` (late ones at once, so the count
/// stays what the rate says), sending each outcome to `tx`.
pub fn spawn(
    app: App,
    mix: Mix,
    seed: u64,
    per_sec: u32,
    until: Instant,
    tx: Sender<Deferral>,
) -> JoinHandle<()> {
    thread::Builder::new()
        .name("chaos-feed".into())
        .spawn(move || {
            let mut rng = Rng::new(seed ^ 0xFEED_FEED);
            let start = Instant::now();
            let mut seq = 0u64;
            loop {
                let now = Instant::now();
                if now >= until {
                    return;
                }
                let due = (now.duration_since(start).as_secs_f64() * f64::from(per_sec)) as u64;
                if seq >= due {
                    let next =
                        start + Duration::from_secs_f64((seq + 1) as f64 / f64::from(per_sec));
                    thread::sleep(
                        next.saturating_duration_since(now)
                            .min(Duration::from_millis(50)),
                    );
                    continue;
                }
                seq += 1;
                let d = defer_one(&app, &mix, &mut rng, seq);
                if tx.send(d).is_err() {
                    return;
                }
            }
        })
        .expect("chaos: the deferrer thread")
}

fn defer_one(app: &App, mix: &Mix, rng: &mut Rng, seq: u64) -> Deferral {
    let weights: Vec<u32> = mix.kinds.iter().map(|(_, w)| *w).collect();
    let kind = mix.kinds[rng.weighted(&weights)].0;
    let ms = match kind {
        Kind::Slow => rng.range(1000, 3500),
        Kind::Ok => rng.range(20, 400),
        Kind::Timeout => 5000,
        Kind::QlockCollide => rng.range(300, 2000),
        _ => rng.range(10, 200),
    };
    let mut args = Args {
        ms,
        ql: None,
        seq: Some(seq),
    };
    let task = kind.task();
    let mut b = app.job(&task);
    if matches!(kind, Kind::Ok | Kind::Slow) && rng.chance(0.3) {
        b = b.lock(format!("lk{}", rng.range(0, 4)));
    }
    if kind == Kind::QlockCollide {
        let ql = format!("ql{seq}");
        b = b.queueing_lock(ql.as_str());
        if rng.chance(0.5) {
            // lock == queueing lock: a requeue that collides must not stall the lock.
            b = b.lock(ql.as_str());
        }
        args.ql = Some(ql);
    }
    let called = now_us();
    let result = b.defer(&args).map(|id| id.get()).map_err(|e| e.to_string());
    Deferral {
        seq,
        kind,
        result,
        called,
        returned: now_us(),
    }
}
