//! A dormant fetcher: an idle worker's claims go through the beat thread's connection.
//!
//! A fetcher whose claims have found nothing (and whose worker holds no job) for the App's
//! `pool_idle_timeout` closes its connection and sleeps. The beat thread, whose connection
//! stays open anyway (heartbeats, and LISTEN unless `listen_via` gives the listener its
//! own), then claims in its stead: every `poll_interval`, when the next scheduled job is
//! due, and at once when news of a job arrives (a notification, or the listener's
//! reconnect). A claim of the beat's asks for the free threads only and starts what it
//! brings; when it brings as many jobs as it asked for (more are likely waiting), or no
//! thread is free, it wakes the fetcher, which connects again and claims as usual.
//!
//! An idle worker process thus holds one connection. A fleet of idle workers that hears of
//! one job makes one claim per process on connections already open, and the process that
//! gets the job opens no connection to claim it, nor to record its outcome (the completer
//! records on the same connection, `link.rs`).
//!
//! The fetcher also sleeps while the server refuses it a connection (`53300` and the like):
//! the beat then claims on the connection the worker has (at once, after each batch of
//! outcomes the completer recorded, on news and at the poll), so a worker that can hold only
//! one connection still runs jobs. The fetcher tries to connect again once its backoff has
//! passed and a claim of the beat's brought all it asked for (more work than the beat's
//! claims take); an idle worker whose fetcher was refused tries no connection at all.
//!
//! States: `Awake` (the fetcher claims), `Dormant` (the beat claims; idle, or refused),
//! `BeatClaiming` (a claim of the beat's is under way: a fetcher that wakes waits for it to
//! end, so that two claims of one worker never run at once). Only the fetcher enters and
//! leaves `Dormant`.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};

const AWAKE: u8 = 0;
const DORMANT: u8 = 1;
const BEAT_CLAIMING: u8 = 2;

/// The fetcher's dormancy, shared with the beat thread.
pub(crate) struct Dormancy {
    state: AtomicU8,
    /// News of a job came while the fetcher slept: the beat claims at once.
    asked: AtomicBool,
    /// The fetcher sleeps because the server refused its connection.
    refused: AtomicBool,
    /// Beat -> fetcher: wake up and claim.
    takeover: (Sender<()>, Receiver<()>),
}

impl Default for Dormancy {
    fn default() -> Dormancy {
        Dormancy {
            state: AtomicU8::new(AWAKE),
            asked: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            takeover: crossbeam_channel::bounded(1),
        }
    }
}

impl Dormancy {
    /// True while the beat thread claims for the fetcher.
    pub(crate) fn is_dormant(&self) -> bool {
        self.state.load(Ordering::SeqCst) != AWAKE
    }

    /// News of a job arrived while the fetcher may sleep: the beat claims at once.
    pub(crate) fn ask(&self) {
        self.asked.store(true, Ordering::SeqCst);
    }

    /// Whether news arrived since the beat last claimed (and forgets it).
    pub(crate) fn take_asked(&self) -> bool {
        self.asked.swap(false, Ordering::SeqCst)
    }

    /// Whether news is waiting for the beat's claim.
    pub(crate) fn asked(&self) -> bool {
        self.asked.load(Ordering::SeqCst)
    }

    /// The beat starts a claim for the dormant fetcher: false if the fetcher is awake.
    pub(crate) fn begin_claim(&self) -> bool {
        self.state
            .compare_exchange(DORMANT, BEAT_CLAIMING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The beat's claim ended; `wake` the fetcher when more work is likely waiting.
    pub(crate) fn end_claim(&self, wake: bool) {
        self.state.store(DORMANT, Ordering::SeqCst);
        if wake {
            let _ = self.takeover.0.try_send(());
        }
    }

    /// The fetcher sleeps until the beat wakes it or `stop` fires (then returns true).
    /// `news` is the fetcher's own wake channel: news waiting there when it falls asleep
    /// keeps it awake (it returns false at once, for the fetcher to look); news that comes
    /// later finds it asleep and goes to the beat ([`Shared::news`](super::Shared::news)).
    pub(crate) fn sleep(&self, stop: &Receiver<()>, news: &Receiver<()>) -> bool {
        while self.takeover.1.try_recv().is_ok() {}
        self.state.store(DORMANT, Ordering::SeqCst);
        let stopped = if news.is_empty() {
            select! {
                recv(stop) -> _ => true,
                recv(self.takeover.1) -> _ => false,
            }
        } else {
            false
        };
        self.wake_up();
        stopped
    }

    /// True while the fetcher sleeps because the server refused its connection: the beat
    /// claims again whenever threads come free.
    pub(crate) fn refused(&self) -> bool {
        self.refused.load(Ordering::SeqCst) && self.is_dormant()
    }

    /// The fetcher, refused a connection, sleeps through its backoff (until `until`) and
    /// then until the beat wakes it (a claim of the beat's brought all it asked for: more
    /// work than its claims take), or until `stop` fires (then returns true). A wake that
    /// comes before `until` is kept for then; without one the fetcher sleeps on, and tries
    /// no connection the worker does not need. The beat claims at once: `wake_beat` is
    /// called once the fetcher is dormant.
    pub(crate) fn sleep_refused(
        &self,
        stop: &Receiver<()>,
        until: Instant,
        wake_beat: impl FnOnce(),
    ) -> bool {
        while self.takeover.1.try_recv().is_ok() {}
        self.refused.store(true, Ordering::SeqCst);
        self.state.store(DORMANT, Ordering::SeqCst);
        self.ask();
        wake_beat();
        let mut woken = false;
        let stopped = loop {
            let left = until.saturating_duration_since(Instant::now());
            if woken && left.is_zero() {
                break false;
            }
            let timeout = if left.is_zero() {
                crossbeam_channel::never()
            } else {
                crossbeam_channel::after(left)
            };
            select! {
                recv(stop) -> _ => break true,
                recv(self.takeover.1) -> _ => woken = true,
                recv(timeout) -> _ => {}
            }
        };
        self.refused.store(false, Ordering::SeqCst);
        self.wake_up();
        stopped
    }

    /// Back to `Awake`, once a claim of the beat's under way has ended (it is bounded by
    /// `io_timeout`).
    fn wake_up(&self) {
        loop {
            match self
                .state
                .compare_exchange(DORMANT, AWAKE, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return,
                Err(AWAKE) => return,
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_beat_claims_only_while_the_fetcher_sleeps_and_a_waking_fetcher_waits_for_its_claim() {
        let d = std::sync::Arc::new(Dormancy::default());
        assert!(!d.begin_claim(), "awake: the fetcher claims");
        let (stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
        let (_news_tx, news) = crossbeam_channel::bounded::<()>(1);
        let sleeper = {
            let d = d.clone();
            std::thread::spawn(move || d.sleep(&stop, &news))
        };
        assert!(eventually(|| d.is_dormant()));
        assert!(d.begin_claim());
        assert!(!d.begin_claim(), "one claim at a time");
        d.end_claim(true);
        assert!(!sleeper.join().unwrap(), "woken by the beat, not stopped");
        assert!(!d.is_dormant());
        drop(stop_tx);
    }

    #[test]
    fn news_after_the_fetcher_fell_asleep_is_the_beats_to_act_on() {
        let d = std::sync::Arc::new(Dormancy::default());
        let (_stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
        let (news_tx, news) = crossbeam_channel::bounded::<()>(1);
        let sleeper = {
            let d = d.clone();
            std::thread::spawn(move || d.sleep(&stop, &news))
        };
        assert!(eventually(|| d.is_dormant()));
        news_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(d.is_dormant(), "the fetcher sleeps on: the beat claims");
        assert!(d.begin_claim());
        d.end_claim(true);
        assert!(!sleeper.join().unwrap());
    }

    #[test]
    fn news_waiting_when_the_fetcher_falls_asleep_keeps_it_awake() {
        let d = Dormancy::default();
        let (_stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
        let (news_tx, news) = crossbeam_channel::bounded::<()>(1);
        news_tx.send(()).unwrap();
        assert!(!d.sleep(&stop, &news));
        assert!(!d.is_dormant());
        assert!(!news.is_empty(), "left for the fetcher's next wait");
    }

    #[test]
    fn a_refused_fetcher_waits_out_its_backoff_and_then_for_work_the_beat_could_not_take() {
        let d = std::sync::Arc::new(Dormancy::default());
        let (_stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
        let until = Instant::now() + Duration::from_millis(100);
        let asked = std::sync::Arc::new(AtomicBool::new(false));
        let sleeper = {
            let (d, asked) = (d.clone(), asked.clone());
            std::thread::spawn(move || {
                let r = d.sleep_refused(&stop, until, || asked.store(true, Ordering::SeqCst));
                (r, Instant::now())
            })
        };
        assert!(eventually(|| d.refused()));
        assert!(asked.load(Ordering::SeqCst), "the beat claims at once");
        assert!(d.take_asked());
        // A claim of the beat's that filled the free threads, before the backoff's end.
        assert!(d.begin_claim());
        d.end_claim(true);
        let (stopped, woke) = sleeper.join().unwrap();
        assert!(!stopped);
        assert!(woke >= until, "the wake is kept for the backoff's end");
        assert!(!d.is_dormant());

        // No such claim: asleep past the backoff, until one comes or the stop.
        let (stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
        let until = Instant::now() + Duration::from_millis(20);
        let sleeper = {
            let d = d.clone();
            std::thread::spawn(move || d.sleep_refused(&stop, until, || {}))
        };
        std::thread::sleep(Duration::from_millis(120));
        assert!(d.refused(), "no connection tried for an idle worker");
        drop(stop_tx);
        assert!(sleeper.join().unwrap(), "stopped");
        assert!(!d.is_dormant());
    }

    fn eventually(mut cond: impl FnMut() -> bool) -> bool {
        for _ in 0..500 {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }
}
