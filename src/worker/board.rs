//! The hand-off of claimed jobs from the fetcher to the executors.
//!
//! A plain channel wakes a sleeping executor for every job sent while one sleeps. The fetcher
//! hands out a claim's jobs in a burst, so a worker of sixteen threads woke about one thread
//! per job when its jobs were short: a 30,000-job drain of no-op jobs at concurrency 16 made
//! about one voluntary context switch per job, against one per twenty to thirty jobs at
//! concurrency 1, and ran 8-19% slower (measured 2026-12-04, two cores shared with the
//! database).
//!
//! The board wakes executors one after the other instead. Whenever jobs wait and executors
//! sleep, exactly one woken executor is on its way to take a job (it is *searching*); when it
//! takes one and more are waiting, it wakes the next. Short jobs are run by the executors
//! already awake before the next one is up; long jobs still spread to every executor, each
//! starting one wake-up after the one before. Nothing waits while an executor sleeps with no
//! one on the way: the searching executor is woken before the lock is released by whoever
//! left jobs waiting, and it cannot go back to sleep while a job waits.
//!
//! Sleeping executors are woken last-in first-out: the one that slept least recently has the
//! warmest cache, and the others sleep on undisturbed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Jobs waiting for an executor, and the executors waiting for a job.
pub(crate) struct Board<T> {
    state: Mutex<State<T>>,
    /// One per executor: the only condition variable its executor sleeps on.
    bells: Vec<Condvar>,
    /// Jobs waiting, readable without the lock.
    len: AtomicUsize,
    /// The weight of the jobs waiting (for the worker: their arguments' bytes), readable
    /// without the lock.
    bytes: AtomicUsize,
    weigh: fn(&T) -> usize,
}

struct State<T> {
    queue: VecDeque<T>,
    /// Sleeping executors, the most recent last.
    idle: Vec<usize>,
    /// Per executor: woken to take a job (and counted in `searching`).
    rung: Vec<bool>,
    /// Executors woken and not yet back with a job or asleep again.
    searching: usize,
    closed: bool,
}

impl<T> State<T> {
    /// The executor to wake, if jobs wait and sleepers sleep with no one on the way.
    fn next_to_wake(&mut self) -> Option<usize> {
        if self.queue.is_empty() || self.searching > 0 || self.closed {
            return None;
        }
        let i = self.idle.pop()?;
        self.rung[i] = true;
        self.searching += 1;
        Some(i)
    }
}

impl<T> Board<T> {
    /// A board for executors numbered `0..executors`, with room for `capacity` jobs before
    /// its queue grows; its jobs weigh nothing.
    #[cfg(test)]
    pub(crate) fn new(executors: usize, capacity: usize) -> Board<T> {
        Board::weighed(executors, capacity, |_| 0)
    }

    /// A board whose waiting jobs' total weight, by `weigh`, is kept ([`bytes`](Self::bytes)).
    pub(crate) fn weighed(executors: usize, capacity: usize, weigh: fn(&T) -> usize) -> Board<T> {
        Board {
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(capacity),
                idle: Vec::with_capacity(executors),
                rung: vec![false; executors],
                searching: 0,
                closed: false,
            }),
            bells: (0..executors).map(|_| Condvar::new()).collect(),
            len: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            weigh,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Nothing panics while holding the lock; a poisoned one still holds a sound state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ring(&self, who: Option<usize>) {
        if let Some(i) = who {
            self.bells[i].notify_one();
        }
    }

    /// Hands jobs to the executors, in order. Jobs pushed after [`close`](Self::close) are
    /// kept and never taken.
    pub(crate) fn push(&self, jobs: impl IntoIterator<Item = T>) {
        let who = {
            let mut s = self.lock();
            let mut added = 0;
            s.queue
                .extend(jobs.into_iter().inspect(|j| added += (self.weigh)(j)));
            self.bytes.fetch_add(added, Ordering::SeqCst);
            self.len.store(s.queue.len(), Ordering::SeqCst);
            s.next_to_wake()
        };
        // Rung after the lock is released, so that the executor does not wake into it.
        self.ring(who);
    }

    /// The next job for executor `me`, sleeping until there is one; `None` once the board
    /// is closed.
    pub(crate) fn take(&self, me: usize) -> Option<T> {
        let mut s = self.lock();
        let mut searching = false;
        loop {
            if s.closed {
                if searching {
                    s.searching -= 1;
                }
                return None;
            }
            if let Some(job) = s.queue.pop_front() {
                self.len.store(s.queue.len(), Ordering::SeqCst);
                self.bytes.fetch_sub((self.weigh)(&job), Ordering::SeqCst);
                if searching {
                    s.searching -= 1;
                }
                let who = s.next_to_wake();
                drop(s);
                self.ring(who);
                return Some(job);
            }
            if searching {
                // Another executor took the job this one was woken for.
                s.searching -= 1;
                searching = false;
            }
            s.idle.push(me);
            while !s.rung[me] && !s.closed {
                s = self.bells[me].wait(s).unwrap_or_else(|e| e.into_inner());
            }
            if s.rung[me] {
                // Whoever rang took this executor off `idle` and counted it as searching.
                s.rung[me] = false;
                searching = true;
            } else if let Some(at) = s.idle.iter().position(|&i| i == me) {
                s.idle.remove(at);
            }
        }
    }

    /// Whether no job waits (a look without the lock: it may be stale by the time it is used).
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::SeqCst) == 0
    }

    /// How many jobs wait (a look without the lock).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::SeqCst)
    }

    /// The total weight of the jobs waiting (a look without the lock).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::SeqCst)
    }

    /// Takes out, in order, the waiting jobs `f` picks: no executor will take them.
    pub(crate) fn remove_if(&self, mut f: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut s = self.lock();
        if s.queue.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut kept = VecDeque::with_capacity(s.queue.len());
        for job in s.queue.drain(..) {
            if f(&job) {
                self.bytes.fetch_sub((self.weigh)(&job), Ordering::SeqCst);
                out.push(job);
            } else {
                kept.push_back(job);
            }
        }
        s.queue = kept;
        self.len.store(s.queue.len(), Ordering::SeqCst);
        out
    }

    /// Wakes every sleeping executor for good: [`take`](Self::take) returns `None` from now
    /// on. The jobs left waiting stay in the worker's ledger as never started.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        for bell in &self.bells {
            bell.notify_all();
        }
    }
}

/// Closes the board when dropped: the fetcher's thread holds one, so that executors stop
/// waiting for jobs once no one can hand them any (as a channel's receivers do when its
/// sender is gone).
pub(crate) struct CloseOnDrop<'a, T>(pub(crate) &'a Board<T>);

impl<T> Drop for CloseOnDrop<'_, T> {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    #[test]
    fn every_job_is_taken_once_in_order_per_taker() {
        let board = Arc::new(Board::new(4, 16));
        let taken = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..4)
            .map(|me| {
                let (b, t) = (board.clone(), taken.clone());
                thread::spawn(move || {
                    let mut mine = Vec::new();
                    while let Some(j) = b.take(me) {
                        mine.push(j);
                    }
                    assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
                    t.lock().unwrap().extend(mine);
                })
            })
            .collect();
        for chunk in (0..10_000u32).collect::<Vec<_>>().chunks(64) {
            board.push(chunk.iter().copied());
            if chunk[0] % 640 == 0 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        while !board.is_empty() {
            thread::sleep(Duration::from_millis(1));
        }
        board.close();
        for t in threads {
            t.join().unwrap();
        }
        let mut all = taken.lock().unwrap().clone();
        all.sort_unstable();
        assert_eq!(all, (0..10_000).collect::<Vec<_>>());
    }

    #[test]
    fn long_jobs_spread_to_every_executor() {
        // Eight jobs that each hold their executor until all eight have started: they can
        // only all start if each executor is woken while the others are busy.
        let n = 8;
        let board = Arc::new(Board::new(n, n));
        let started = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..n)
            .map(|me| {
                let (b, s) = (board.clone(), started.clone());
                thread::spawn(move || {
                    while let Some(()) = b.take(me) {
                        s.fetch_add(1, Ordering::SeqCst);
                        let t = Instant::now();
                        while s.load(Ordering::SeqCst) < n && t.elapsed() < Duration::from_secs(5) {
                            thread::sleep(Duration::from_millis(1));
                        }
                    }
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(20)); // every executor asleep
        let t = Instant::now();
        board.push(std::iter::repeat_n((), n));
        while started.load(Ordering::SeqCst) < n && t.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(started.load(Ordering::SeqCst), n, "not every job started");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        board.close();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_job_pushed_while_one_executor_is_busy_wakes_another() {
        let board = Arc::new(Board::new(2, 2));
        let release = Arc::new(AtomicBool::new(false));
        let second = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..2)
            .map(|me| {
                let (b, r, s) = (board.clone(), release.clone(), second.clone());
                thread::spawn(move || {
                    while let Some(j) = b.take(me) {
                        if j == 1 {
                            while !r.load(Ordering::SeqCst) {
                                thread::sleep(Duration::from_millis(1));
                            }
                        } else {
                            s.store(true, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        board.push([1]);
        thread::sleep(Duration::from_millis(20)); // job 1 holds one executor
        board.push([2]);
        let t = Instant::now();
        while !second.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(1));
        }
        let ran = second.load(Ordering::SeqCst);
        release.store(true, Ordering::SeqCst);
        board.close();
        for t in threads {
            t.join().unwrap();
        }
        assert!(
            ran,
            "job 2 waited for job 1's executor while the other slept"
        );
    }

    #[test]
    fn close_wakes_sleepers_and_take_returns_none() {
        let board = Arc::new(Board::<u8>::new(3, 1));
        let threads: Vec<_> = (0..3)
            .map(|me| {
                let b = board.clone();
                thread::spawn(move || b.take(me))
            })
            .collect();
        thread::sleep(Duration::from_millis(20));
        board.close();
        for t in threads {
            assert_eq!(t.join().unwrap(), None);
        }
        board.push([1]);
        assert_eq!(board.take(0), None, "a closed board hands out nothing");
    }
}
