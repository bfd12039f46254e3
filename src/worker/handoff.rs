//! The hand-off between the fetcher and the executors: one type for the whole protocol.
//!
//! The fetcher puts claimed jobs on the [`Board`], which wakes one sleeping executor per
//! job; an executor takes one, runs it, and sends its outcome to the completer. When the
//! worker holds as many attempts as it may, the fetcher waits for *room*:
//!
//! 1. it says so ([`Handoff::want_room`]) *before* it counts the free slots once more, so
//!    that an executor that takes the last waiting job after that count sees the wish;
//! 2. an executor that finished a job and finds the board empty while the wish stands sends
//!    one signal ([`Handoff::job_done`]): the fetcher may claim now, without waiting for the
//!    completer to record the outcomes first;
//! 3. the fetcher waits on [`Handoff::room`] (or on the completer's wake, or a recheck
//!    timer), then withdraws the wish ([`Handoff::stop_wanting_room`]).
//!
//! Executors never wake an idle fetcher for news of jobs: it would claim again for every
//! job that trickles in. The hand-off also counts the executor threads alive, which the
//! beat thread waits on during a shutdown, and is closed by the shutdown (executors then
//! find no job and end).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crossbeam_channel::{Receiver, Sender};

use super::board::Board;
use super::Claimed;

pub(crate) struct Handoff {
    /// Claimed jobs on their way from the fetcher to the executors.
    board: Board<Claimed>,
    /// Executor -> fetcher: a job finished and no claimed job waits. Sent only while
    /// `wants_room` is set.
    room: (Sender<()>, Receiver<()>),
    /// The fetcher waits for room to claim.
    wants_room: AtomicBool,
    /// Executor threads running.
    executors: AtomicUsize,
}

impl Handoff {
    /// A hand-off for executors numbered `0..executors`, with room for `capacity` jobs; the
    /// board weighs each by the size of its arguments.
    pub(crate) fn new(executors: usize, capacity: usize) -> Handoff {
        Handoff {
            board: Board::weighed(executors, capacity, |c: &Claimed| c.args.0.len()),
            room: crossbeam_channel::bounded(1),
            wants_room: AtomicBool::new(false),
            executors: AtomicUsize::new(0),
        }
    }

    /// The jobs on their way, for what must reach them there (the shutdown's close, the
    /// beat's removal of held jobs that end unstarted).
    pub(crate) fn board(&self) -> &Board<Claimed> {
        &self.board
    }

    /// Fetcher: hands out claimed jobs.
    pub(crate) fn push(&self, jobs: impl IntoIterator<Item = Claimed>) {
        self.board.push(jobs);
    }

    /// Claimed jobs no executor has taken yet.
    pub(crate) fn waiting(&self) -> usize {
        self.board.len()
    }

    /// The bytes of arguments of the claimed jobs no executor has taken yet.
    pub(crate) fn waiting_bytes(&self) -> usize {
        self.board.bytes()
    }

    /// Whether no claimed job waits for an executor.
    pub(crate) fn is_empty(&self) -> bool {
        self.board.is_empty()
    }

    /// Fetcher, step 1: it waits for room from now on.
    pub(crate) fn want_room(&self) {
        self.wants_room.store(true, Ordering::SeqCst);
    }

    /// Fetcher, step 3: the signal an executor sends when it made room.
    pub(crate) fn room(&self) -> &Receiver<()> {
        &self.room.1
    }

    /// Fetcher, step 3: it no longer waits for room.
    pub(crate) fn stop_wanting_room(&self) {
        self.wants_room.store(false, Ordering::SeqCst);
    }

    /// Executor: the next job for executor `me`, sleeping until there is one; `None` once
    /// the hand-off is closed.
    pub(crate) fn take(&self, me: usize) -> Option<Claimed> {
        self.board.take(me)
    }

    /// Executor, step 2: it finished a job (its outcome is on its way to the completer).
    pub(crate) fn job_done(&self) {
        if self.board.is_empty() && self.wants_room.load(Ordering::SeqCst) {
            let _ = self.room.0.try_send(());
        }
    }

    /// Counts an executor thread as alive while the returned guard lives (even if the
    /// thread unwinds).
    pub(crate) fn executor_alive(&self) -> ExecutorAlive<'_> {
        self.executors.fetch_add(1, Ordering::AcqRel);
        ExecutorAlive(self)
    }

    /// Executor threads alive.
    pub(crate) fn executors(&self) -> usize {
        self.executors.load(Ordering::Acquire)
    }
}

/// Counts its executor in [`Handoff::executors`] while it lives.
pub(crate) struct ExecutorAlive<'a>(&'a Handoff);

impl Drop for ExecutorAlive<'_> {
    fn drop(&mut self) {
        self.0.executors.fetch_sub(1, Ordering::AcqRel);
    }
}
