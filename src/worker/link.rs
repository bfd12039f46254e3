//! A worker thread's link to the database: a connection that may break, and what to do then.
//!
//! Every worker thread that talks to the database owns one `Link`. It connects when asked
//! (in the worker's watchdog group, under `connect_timeout`), runs the thread's own setup on
//! every new connection (preparing a statement, `LISTEN`), and judges each result: a success
//! resets the backoff; a failure is logged (at warn level once per streak, then only at each
//! power of two, with the streak's length), a broken connection is dropped, and the caller
//! gets the wait before its next try. Waiting is left to the caller, because each thread
//! waits on its own signals (the stop, the shutdown's hard deadline, its own timers).
//!
//! Two threads, the beat and the completer, take turns on one connection, the worker's
//! lasting one: a [`Shelf`]. Their links ([`Link::on_shelf`]) take the connection off the
//! shelf when they need it and put it back when they wait ([`Link::release`]), so a worker
//! process holds that one connection for heartbeats, LISTEN, its sweeps and the recording
//! of outcomes, and a second only while its fetcher claims. States of the shelf: *free*
//! (the connection parked on it, or none: the next taker opens one and runs its setup),
//! *held* by one thread (the other waits its turn: when both want it, they alternate; a
//! completer waiting cuts the beat's wait for notifications short), *closed* (the shutdown's
//! hard deadline: takers get no connection, the one put back is dropped). A connection that
//! breaks in one thread's hands is dropped there, and whichever thread takes the shelf next
//! opens another (with the LISTEN, which the beat then reports as news). Every use of the
//! connection is a round-trip under its deadline, so a thread waits for its turn at most
//! that long; the shutdown closes the shelf.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use super::backoff::Backoff;
use super::Shared;
use crate::conn::Connection;
use crate::error::Result;

/// Which of the two threads that share the worker's lasting connection (see [`Shelf`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Party {
    Beat = 0,
    Completer = 1,
}

impl Party {
    fn other(self) -> Party {
        match self {
            Party::Beat => Party::Completer,
            Party::Completer => Party::Beat,
        }
    }
}

/// The worker's lasting connection, shared by the beat and the completer (see the module's
/// header). `S` is what lives with the connection: for the worker's, whether it LISTENs and
/// nobody has said so yet.
pub(crate) struct Shelf<S = bool> {
    state: Mutex<ShelfState<S>>,
    turn: Condvar,
    /// Rung when the completer waits while the beat holds the connection: cuts the beat's
    /// wait for notifications short.
    pub(crate) wanted: std::sync::Arc<tokio::sync::Notify>,
    /// Signalled each time the connection goes back on the shelf: the beat, which hears
    /// notifications only while the connection is free, may listen again.
    pub(crate) freed: (Sender<()>, Receiver<()>),
    /// Signalled when the beat waits while the completer holds the connection: a completer
    /// keeping it for the next batch (`complete.rs`) gives it up at once.
    pub(crate) want: (Sender<()>, Receiver<()>),
    /// Runs on every connection opened for the shelf (LISTEN, for the worker's).
    setup: ShelfSetup<S>,
    listens: bool,
    /// True while the beat does not listen (a flood of notifications, see `beat.rs`): the
    /// connections opened meanwhile do not LISTEN.
    muted: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Until when the connections opened do not LISTEN, after one was dropped for a flood of
    /// notifications that came during a round-trip (see `conn`'s `NOTIFY_UNREAD_MAX`).
    flood_until: std::sync::Arc<Mutex<Option<std::time::Instant>>>,
}

struct ShelfState<S> {
    conn: Option<(Connection, S)>,
    holder: Option<Party>,
    waiting: [bool; 2],
    /// Who held it last: when both wait, the other goes first.
    last: Option<Party>,
    closed: bool,
    /// Links on this shelf alive: the last one to go closes the connection.
    users: usize,
}

/// A connection taken off the shelf: the one parked there, or none (open one).
type Taken<S> = std::result::Result<Option<(Connection, S)>, Closed>;

/// The shelf is closed (the shutdown's hard deadline came).
#[derive(Debug)]
pub(crate) struct Closed;

impl<S> Shelf<S> {
    fn lock(&self) -> MutexGuard<'_, ShelfState<S>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for `me`'s turn, then takes the connection (none if none is open).
    fn take(&self, me: Party) -> Taken<S> {
        let mut s = self.lock();
        s.waiting[me as usize] = true;
        loop {
            if s.closed {
                s.waiting[me as usize] = false;
                return Err(Closed);
            }
            let other = me.other();
            let after_other = s.waiting[other as usize] && s.last == Some(me);
            if s.holder.is_none() && !after_other {
                break;
            }
            match s.holder {
                Some(Party::Beat) => self.wanted.notify_one(),
                Some(Party::Completer) => {
                    let _ = self.want.0.try_send(());
                }
                None => {}
            }
            s = self.turn.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.waiting[me as usize] = false;
        s.holder = Some(me);
        s.last = Some(me);
        Ok(s.conn.take())
    }

    /// Takes the connection if it is free now and the other thread does not wait for it.
    fn try_take(&self, me: Party) -> Option<Taken<S>> {
        let mut s = self.lock();
        if s.closed {
            return Some(Err(Closed));
        }
        if s.holder.is_some() || s.waiting[me.other() as usize] {
            return None;
        }
        s.holder = Some(me);
        s.last = Some(me);
        Some(Ok(s.conn.take()))
    }

    /// Puts the connection back (or none: it broke or was closed), ending `me`'s turn.
    fn put(&self, me: Party, conn: Option<(Connection, S)>) {
        let mut s = self.lock();
        if s.holder != Some(me) {
            return;
        }
        s.holder = None;
        let drop_it = if s.closed || s.users == 0 {
            conn
        } else {
            s.conn = conn;
            None
        };
        drop(s);
        drop(drop_it);
        self.turn.notify_all();
        let _ = self.freed.0.try_send(());
    }

    /// True when the other thread waits for the connection `me` holds.
    fn wanted_by_other(&self, me: Party) -> bool {
        self.lock().waiting[me.other() as usize]
    }

    /// No connection is open on the shelf and nobody holds it (both threads wait to
    /// reconnect).
    pub(crate) fn is_empty(&self) -> bool {
        let s = self.lock();
        !s.closed && s.holder.is_none() && s.conn.is_none()
    }

    /// How long ago the connection last answered, if one is parked (zero while a thread
    /// uses it).
    fn idle_for(&self) -> Option<Duration> {
        let s = self.lock();
        if s.holder.is_some() {
            return Some(Duration::ZERO);
        }
        s.conn.as_ref().map(|(c, _)| c.idle_for())
    }

    /// The shelf's connection was dropped for a flood of notifications: the connections
    /// opened for the next [`FLOOD_MUTE`](super::FLOOD_MUTE) do not LISTEN (the
    /// fetcher polls meanwhile).
    pub(crate) fn flood_mute(&self) {
        *self.flood_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::time::Instant::now() + super::FLOOD_MUTE);
    }

    /// Whether a flood of notifications keeps the shelf's connections from listening now.
    pub(crate) fn flood_muted(&self) -> bool {
        not_yet(&self.flood_until)
    }

    /// Closes the shelf (the shutdown's hard deadline): takers get no connection, the one
    /// parked (or put back later) is dropped.
    pub(crate) fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        let parked = s.conn.take();
        drop(s);
        drop(parked);
        self.turn.notify_all();
        self.wanted.notify_one();
    }

    fn join(&self) {
        self.lock().users += 1;
    }

    fn leave(&self) {
        let mut s = self.lock();
        s.users = s.users.saturating_sub(1);
        let parked = if s.users == 0 { s.conn.take() } else { None };
        drop(s);
        drop(parked);
    }
}

impl Shelf<bool> {
    /// A shelf whose connections LISTEN on `listen` (when given), holding `conn` (opened,
    /// and LISTENing when it should, by the caller) to begin with.
    pub(crate) fn new(listen: Option<String>, conn: Option<Connection>) -> Shelf<bool> {
        let fresh = listen.is_some();
        let muted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let quiet = muted.clone();
        let flood_until = std::sync::Arc::<Mutex<Option<std::time::Instant>>>::default();
        let flooding = flood_until.clone();
        let setup = move |c: &mut Connection| {
            let flood = not_yet(&flooding);
            match &listen {
                Some(_) if flood || quiet.load(std::sync::atomic::Ordering::SeqCst) => Ok(false),
                Some(channel) => c.listen(channel).map(|()| true),
                None => Ok(false),
            }
        };
        Shelf {
            state: Mutex::new(ShelfState {
                conn: conn.map(|c| (c, fresh)),
                holder: None,
                waiting: [false; 2],
                last: None,
                closed: false,
                users: 0,
            }),
            turn: Condvar::new(),
            wanted: Default::default(),
            freed: crossbeam_channel::bounded(1),
            want: crossbeam_channel::bounded(1),
            setup: Box::new(setup),
            listens: fresh,
            muted,
            flood_until,
        }
    }

    /// While `on`, the connections opened for the shelf do not LISTEN (the beat stops
    /// listening for a while: a flood of notifications).
    pub(crate) fn mute(&self, on: bool) {
        self.muted.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the shelf's connections LISTEN.
    pub(crate) fn listens(&self) -> bool {
        self.listens
    }

    /// Parks `conn`, a connection another thread of the worker no longer needs, when the
    /// shelf has none and nobody holds it (both its threads are failing to reconnect, the
    /// server refusing connections): set up here first. Returns it if it was not taken.
    pub(crate) fn offer(&self, mut conn: Connection) -> Option<Connection> {
        if !self.is_empty() {
            return Some(conn);
        }
        let fresh = match (self.setup)(&mut conn) {
            Ok(f) => f,
            Err(_) => return None,
        };
        let mut s = self.lock();
        if s.closed || s.holder.is_some() || s.conn.is_some() || s.users == 0 {
            drop(s);
            return Some(conn);
        }
        s.conn = Some((conn, fresh));
        drop(s);
        self.turn.notify_all();
        let _ = self.freed.0.try_send(());
        None
    }
}

type Setup<S> = Box<dyn FnMut(&mut Connection) -> Result<S> + Send>;
type ShelfSetup<S> = Box<dyn Fn(&mut Connection) -> Result<S> + Send + Sync>;

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
    /// The last failure was a refused connection.
    last_refused: bool,
    /// The worker's shelf, for a link that takes turns on its connection, and whether this
    /// link holds the turn now (the connection, or the right to open one, is its own).
    shelf: Option<(&'a Shelf<S>, Party)>,
    holding: bool,
}

impl<'a> Link<'a, bool> {
    /// A link that takes turns with the other `Party` on the worker's lasting connection
    /// (`shared.shelf`); its state says whether the connection LISTENs and nobody has said
    /// so yet.
    pub(crate) fn on_shelf(shared: &'a Shared, what: &'static str, party: Party) -> Self {
        let shelf = &shared.shelf;
        shelf.join();
        let mut link = Link::with_setup(shared, what, |_| Ok(false));
        link.shelf = Some((shelf, party));
        link
    }

    /// Takes the connection only if it is free now (the other thread neither holds nor
    /// waits for it): `None` otherwise. A link that holds it already gets it back.
    pub(crate) fn try_get(
        &mut self,
    ) -> Option<std::result::Result<(&mut Connection, &mut bool), Duration>> {
        if let Some((shelf, party)) = self.shelf {
            if !self.holding {
                match shelf.try_take(party)? {
                    Ok(conn) => {
                        self.holding = true;
                        self.conn = conn;
                    }
                    Err(Closed) => return Some(Err(Duration::from_millis(10))),
                }
            }
        }
        Some(self.get())
    }

    /// Whether this link holds the turn on the shelf (the connection is its own for now).
    pub(crate) fn holding(&self) -> bool {
        self.holding
    }

    /// Whether the other thread waits for the connection this link holds.
    pub(crate) fn wanted(&self) -> bool {
        match self.shelf {
            Some((shelf, party)) => self.holding && shelf.wanted_by_other(party),
            None => false,
        }
    }

    /// Gives the connection back if the other thread waits for it.
    pub(crate) fn yield_if_wanted(&mut self) {
        if self.wanted() {
            self.release();
        }
    }
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
            last_refused: false,
            shelf: None,
            holding: false,
        }
    }

    /// This link connects where `WorkerBuilder::listen_via` says, when it was given.
    pub(crate) fn for_listener(mut self) -> Self {
        self.listener = true;
        self
    }

    /// The connection, opened and set up if there is none. On failure (logged) returns the
    /// wait before the next try.
    ///
    /// A link on the worker's shelf first waits for its turn (see [`Shelf`]), and holds it
    /// until [`release`](Self::release).
    pub(crate) fn get(&mut self) -> std::result::Result<(&mut Connection, &mut S), Duration> {
        if let Some((shelf, party)) = self.shelf {
            if !self.holding {
                match shelf.take(party) {
                    Ok(conn) => {
                        self.holding = true;
                        self.conn = conn;
                    }
                    Err(Closed) => return Err(Duration::from_millis(10)),
                }
            }
        }
        if self.conn.is_none() {
            let opened = if self.listener {
                self.shared.connect_listener()
            } else {
                self.shared.connect()
            };
            let opened = match self.shelf {
                // The shelf's own setup, whichever thread opens it.
                Some((shelf, _)) => opened.and_then(|mut c| (shelf.setup)(&mut c).map(|s| (c, s))),
                None => opened.and_then(|mut c| (self.setup)(&mut c).map(|s| (c, s))),
            };
            match opened {
                Ok(c) => {
                    self.last_refused = false;
                    self.conn = Some(c);
                }
                Err(e) => {
                    self.last_refused = e.is_refusal();
                    if e.is_refusal() {
                        self.refusals += 1;
                    }
                    self.shared.log_db_error(
                        &format!("connecting for {}", self.what),
                        &e,
                        self.backoff.failures() + 1,
                    );
                    let wait = self.backoff.next_wait();
                    // The other thread may connect meanwhile.
                    self.release();
                    return Err(wait);
                }
            }
        }
        let (c, s) = self.conn.as_mut().expect("connected above");
        Ok((c, s))
    }

    /// Puts the connection back on the worker's shelf, for the other thread (a link of
    /// its own keeps it): called before the thread waits.
    pub(crate) fn release(&mut self) {
        if let Some((shelf, party)) = self.shelf {
            if self.holding {
                self.holding = false;
                shelf.put(party, self.conn.take());
            }
        }
    }

    /// Whether the last failure was a refused connection (the server is out of slots).
    pub(crate) fn refused(&self) -> bool {
        self.last_refused
    }

    /// Takes the connection out of this link (a link of its own), if it has one.
    pub(crate) fn take_connection(&mut self) -> Option<Connection> {
        if self.shelf.is_some() {
            return None;
        }
        self.conn.take().map(|(c, _)| c)
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
                self.last_refused = false;
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
                self.last_refused = e.is_refusal();
                if e.is_refusal() {
                    self.refusals += 1;
                }
                self.shared
                    .log_db_error(self.what, &e, self.backoff.failures() + 1);
                if self.flooded() {
                    if let Some((shelf, _)) = self.shelf {
                        shelf.flood_mute();
                    }
                }
                if self.conn.as_ref().is_some_and(|(c, _)| c.is_broken()) {
                    self.conn = None;
                }
                Err(self.backoff.next_wait())
            }
        }
    }

    /// How long ago the connection last answered; `None` without a connection. For a link
    /// on the shelf, the shelf's connection, whoever holds it (zero while the other thread
    /// uses it: its round-trips prove the link too).
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        match (self.shelf, &self.conn) {
            (_, Some((c, _))) => Some(c.idle_for()),
            (Some((shelf, _)), None) if !self.holding => shelf.idle_for(),
            _ => None,
        }
    }

    /// Whether the connection was dropped for a flood of notifications that came during a
    /// round-trip (more than it holds unread).
    pub(crate) fn flooded(&self) -> bool {
        self.conn.as_ref().is_some_and(|(c, _)| c.flooded())
    }

    /// Drops the connection (the caller knows it cannot be trusted any more).
    pub(crate) fn drop_connection(&mut self) {
        self.conn = None;
    }
}

impl<S> Drop for Link<'_, S> {
    fn drop(&mut self) {
        self.release();
        if let Some((shelf, _)) = self.shelf {
            shelf.leave();
        }
    }
}

/// Whether the instant in `until`, if any, is still to come.
fn not_yet(until: &Mutex<Option<std::time::Instant>>) -> bool {
    until
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some_and(|t| std::time::Instant::now() < t)
}
