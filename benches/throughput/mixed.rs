//! Mixed durations (`--only mixed`): how long short jobs wait when long ones share their queue.
//!
//! ```sh
//! cargo bench --bench throughput -- --only mixed --concurrency 8 --rate 4 --seconds 60
//! ```
//!
//! Two workers of `--concurrency` threads (the first value; 8) serve one queue. A generator
//! defers `--rate` jobs/s (4) for `--seconds` (60), by a clock, in bursts of `--burst` (1)
//! jobs: half of them `short` (1 ms), half `long` (`--long-ms`, 2,000 ms), in an order drawn
//! from `--seed` (1). At 4 jobs/s, 2 s long jobs keep about 4 of the 16 threads busy on
//! average: there is always a free thread somewhere, so a short job has no reason to wait
//! for a long one. Its wait is from its defer to its task's start, both on this process's
//! clock. Prints the short jobs' p50, p90, p99 and max wait and how many waited over 50 ms;
//! `MIXED_SLOW=1` lists those.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postpone::{App, Job, Tasks, Worker};

use super::openloop::{now_us, sleep_until_us, stop, truncate};

struct MixedOpts {
    concurrency: usize,
    rate: f64,
    seconds: f64,
    burst: usize,
    long_ms: u64,
    seed: u64,
}

fn opts() -> MixedOpts {
    let mut o = MixedOpts {
        concurrency: 8,
        rate: 4.0,
        seconds: 60.0,
        burst: 1,
        long_ms: 2000,
        seed: 1,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for w in argv.windows(2) {
        let v = w[1].as_str();
        match w[0].as_str() {
            "--concurrency" => {
                o.concurrency = v
                    .split(',')
                    .next()
                    .and_then(|x| x.trim().parse().ok())
                    .expect("--concurrency N")
            }
            "--rate" => o.rate = v.parse().expect("--rate R"),
            "--seconds" => o.seconds = v.parse().expect("--seconds S"),
            "--burst" => o.burst = v.parse::<usize>().expect("--burst N").max(1),
            "--long-ms" => o.long_ms = v.parse().expect("--long-ms MS"),
            "--seed" => o.seed = v.parse().expect("--seed N"),
            _ => {}
        }
    }
    o
}

/// xorshift64*: the job order, the same for a seed on every build.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

pub fn run(url: &str) {
    let o = opts();
    let app = App::builder(url).pool_size(4).build().unwrap();
    truncate(&app);
    // (deferred at µs, started at µs) of each short job.
    let waits: Arc<Mutex<Vec<(i64, i64)>>> = Arc::new(Mutex::new(Vec::new()));
    let worker = |name: &str| {
        let mut tasks = Tasks::new();
        let w = waits.clone();
        tasks.register("short", move |job: &Job| {
            let sent: i64 = job.args()?;
            w.lock().unwrap().push((sent, now_us()));
            thread::sleep(Duration::from_millis(1));
            Ok(())
        });
        let long = Duration::from_millis(o.long_ms);
        tasks.register("long", move |job: &Job| {
            let until = Instant::now() + long;
            while Instant::now() < until && !job.should_abort() {
                thread::sleep(Duration::from_millis(10));
            }
            Ok(())
        });
        Worker::builder(&app, tasks)
            .name(name)
            .concurrency(o.concurrency)
            .spawn()
            .unwrap()
    };
    let a = worker("mixed-a");
    let b = worker("mixed-b");
    thread::sleep(Duration::from_millis(300));
    let total = (o.rate * o.seconds).round() as usize;
    let bursts = total.div_ceil(o.burst);
    let t0 = now_us() + 100_000;
    let mut rng = o.seed.max(1);
    let mut shorts = 0;
    for i in 0..bursts {
        sleep_until_us(t0 + (i as f64 * o.burst as f64 / o.rate * 1e6) as i64);
        for _ in 0..o.burst {
            let sent = now_us();
            if next(&mut rng) % 2 == 0 {
                app.defer("short", &sent).unwrap();
                shorts += 1;
            } else {
                app.defer("long", &0).unwrap();
            }
        }
    }
    let all = Instant::now() + Duration::from_secs(30);
    while waits.lock().unwrap().len() < shorts && Instant::now() < all {
        thread::sleep(Duration::from_millis(20));
    }
    stop(a);
    stop(b);
    let waits = waits.lock().unwrap().clone();
    let mut ms: Vec<f64> = waits.iter().map(|(s, t)| (t - s) as f64 / 1000.0).collect();
    ms.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let pct = |p: f64| -> f64 {
        if ms.is_empty() {
            return f64::NAN;
        }
        ms[((ms.len() as f64 * p).ceil() as usize).clamp(1, ms.len()) - 1]
    };
    let slow = ms.iter().filter(|w| **w > 50.0).count();
    println!(
        "mixed: 2 workers x {} threads, {} jobs/s in bursts of {} for {} s, long jobs {} ms, seed {}",
        o.concurrency, o.rate, o.burst, o.seconds, o.long_ms, o.seed
    );
    println!(
        "mixed short-job wait (ms): n {} of {}  p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}  over 50 ms: {}",
        ms.len(),
        shorts,
        pct(0.5),
        pct(0.9),
        pct(0.99),
        ms.last().copied().unwrap_or(f64::NAN),
        slow
    );
    if std::env::var_os("MIXED_SLOW").is_some() {
        for (s, t) in &waits {
            if t - s > 50_000 {
                println!(
                    "  slow short job: deferred at {s} µs, waited {:.1} ms",
                    (t - s) as f64 / 1000.0
                );
            }
        }
    }
}
