//! A worker thread's link to the database: a connection that may break, and what to do then.
//!
//! Every worker thread that talks to the database owns one `Link`. It connects when asked
//! (in the worker's watchdog group, under `connect_timeout`), runs the thread's own setup on
//! every new connection (preparing a statement, `LISTEN`), and judges each result: a success
//! resets the backoff; a failure is logged (at warn level once per streak, then only at each
//! power of two, with the streak's length), a broken connection is dropped, and the caller
//! gets the wait before its next try. Waiting is left to the caller, because each thread
//! waits on its own signals (the stop, the shutdown's hard deadline, its own timers).

use std::time::Duration;

use super::backoff::Backoff;
use super::Shared;
use crate::conn::Connection;
use crate::error::Result;

type Setup<S> = Box<dyn FnMut(&mut Connection) -> Result<S> + Send>;

pub(crate) struct Link<'a, S = ()> {
    shared: &'a Shared,
    /// What the thread does with the link, for logs ("claiming jobs").
    what: &'static str,
    conn: Option<(Connection, S)>,
    setup: Setup<S>,
    backoff: Backoff,
    /// Connects where `listen_via` says (the listener's link).
    listener: bool,
    /// How many of the failures of the current streak were refused connections.
    refusals: u32,
}

impl<'a> Link<'a, ()> {
    /// A link with no setup.
    pub(crate) fn new(shared: &'a Shared, what: &'static str) -> Link<'a, ()> {
        Link::with_setup(shared, what, |_| Ok(()))
    }
}

impl<'a, S> Link<'a, S> {
    /// A link that runs `setup` on every new connection; its result lives with the
    /// connection (a prepared statement, say).
    pub(crate) fn with_setup(
        shared: &'a Shared,
        what: &'static str,
        setup: impl FnMut(&mut Connection) -> Result<S> + Send + 'static,
    ) -> Link<'a, S> {
        Link {
            shared,
            what,
            conn: None,
            setup: Box::new(setup),
            backoff: Backoff::new(shared.opts.backoff_cap),
            listener: false,
            refusals: 0,
        }
    }

    /// This link connects where `WorkerBuilder::listen_via` says, when it was given.
    pub(crate) fn for_listener(mut self) -> Self {
        self.listener = true;
        self
    }

    /// A link over a connection opened already (and set up by the caller).
    pub(crate) fn adopt(&mut self, conn: Connection, state: S) {
        self.conn = Some((conn, state));
    }

    /// The connection, opened and set up if there is none. On failure (logged) returns the
    /// wait before the next try.
    pub(crate) fn get(&mut self) -> std::result::Result<(&mut Connection, &mut S), Duration> {
        if self.conn.is_none() {
            let opened = if self.listener {
                self.shared.connect_listener()
            } else {
                self.shared.connect()
            };
            let opened = opened.and_then(|mut c| (self.setup)(&mut c).map(|s| (c, s)));
            match opened {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    if e.is_refusal() {
                        self.refusals += 1;
                    }
                    self.shared.log_db_error(
                        &format!("connecting for {}", self.what),
                        &e,
                        self.backoff.failures() + 1,
                    );
                    return Err(self.backoff.next_wait());
                }
            }
        }
        let (c, s) = self.conn.as_mut().expect("connected above");
        Ok((c, s))
    }

    /// The connection, opened and set up if there is none; a failure is returned as it is,
    /// for the caller to hand to [`judge`](Self::judge) with the rest of its work (for a
    /// thread that connects only when it has something to do).
    pub(crate) fn connection(&mut self) -> Result<&mut Connection> {
        if self.conn.is_none() {
            let mut c = self.shared.connect()?;
            let s = (self.setup)(&mut c)?;
            self.conn = Some((c, s));
        }
        Ok(&mut self.conn.as_mut().expect("connected above").0)
    }

    /// Closes the connection, if there is one (the next use opens another).
    pub(crate) fn close(&mut self) {
        self.conn = None;
    }

    /// Judges the result of a round-trip: a success resets the backoff; a failure is logged,
    /// drops the connection if it broke, and gives the wait before the next try.
    pub(crate) fn judge<T>(&mut self, res: Result<T>) -> std::result::Result<T, Duration> {
        match res {
            Ok(v) => {
                // Refused connections are reported once per episode for the whole worker.
                if self.backoff.failures() > self.refusals {
                    log::info!(
                        "worker {}: {} works again after {} failure(s)",
                        self.shared.name,
                        self.what,
                        self.backoff.failures()
                    );
                }
                self.backoff.reset();
                self.refusals = 0;
                Ok(v)
            }
            Err(e) => {
                if e.is_refusal() {
                    self.refusals += 1;
                }
                self.shared
                    .log_db_error(self.what, &e, self.backoff.failures() + 1);
                if self.conn.as_ref().is_some_and(|(c, _)| c.is_broken()) {
                    self.conn = None;
                }
                Err(self.backoff.next_wait())
            }
        }
    }

    /// How long ago the connection last answered; `None` without a connection.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        self.conn.as_ref().map(|(c, _)| c.idle_for())
    }

    /// Drops the connection (the caller knows it cannot be trusted any more).
    pub(crate) fn drop_connection(&mut self) {
        self.conn = None;
    }
}
