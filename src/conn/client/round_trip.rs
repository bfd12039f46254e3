//! One round-trip under its deadline: run it, classify its failure, and on a deadline send
//! a CancelRequest from a fresh socket before the connection is severed.

use std::future::Future;
use std::time::{Duration, Instant};

use super::*;

impl Inner {
    pub(super) fn usable(&self, what: &str) -> Result<()> {
        match &self.broken {
            None => Ok(()),
            Some(why) => Err(Error::new(
                ErrorKind::Closed,
                format!("{what}: connection to {} is unusable ({why})", self.peer),
            )),
        }
    }

    pub(super) fn run<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        fut: impl Future<Output = std::result::Result<T, tokio_postgres::Error>> + Send,
    ) -> Result<T>
    where
        T: Send,
    {
        self.run_then_cancel(what, timeout, fut, true)
    }

    /// `run`, saying whether a deadline that fires sends a CancelRequest (not for a ping:
    /// it runs nothing worth stopping).
    pub(super) fn run_then_cancel<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        fut: impl Future<Output = std::result::Result<T, tokio_postgres::Error>> + Send,
        cancel: bool,
    ) -> Result<T>
    where
        T: Send,
    {
        self.usable(what)?;
        let (timeout, capped) = match self.deadline {
            Some(d) if d.saturating_duration_since(Instant::now()) < timeout => {
                (d.saturating_duration_since(Instant::now()), true)
            }
            _ => (timeout, false),
        };
        self.reg.arm(deadline_after(timeout));
        self.in_flight = true;
        let res = self
            .rt
            .block_on(async { tokio::time::timeout(timeout, fut).await });
        self.in_flight = false;
        self.reg.disarm();
        // Nothing ran when no thread could drive the call: the link is as it was.
        let res = res.map_err(|e| e.context(what))?;
        match res {
            Ok(Ok(v)) => {
                self.last_ok = Instant::now();
                Ok(v)
            }
            Ok(Err(e)) => Err(self.classify(what, e)),
            Err(_) => {
                crate::metrics::deadline_fired();
                // The statement may be running on (a half-open link, or a slow one): ask the
                // server to cancel it before the socket goes, so that its backend does not
                // keep working and holding locks for a caller that has given up.
                // Not when the caller's own deadline (a shutdown's) cut the wait short: it
                // leaves no time for one, and the caller's promise is that deadline.
                if cancel && !capped {
                    self.cancel.send(&self.rt, what, &self.peer, self.deadline);
                }
                self.reg.sever();
                let why = if capped {
                    format!(
                        "no answer within the {} left before the caller's deadline",
                        fmt_duration(timeout)
                    )
                } else {
                    format!("no answer within {} io_timeout", fmt_duration(timeout))
                };
                self.broken = Some(why.clone());
                log::warn!("{what} on {}: {why}; connection severed", self.peer);
                Err(Error::new(ErrorKind::Timeout, format!("{what}: {why}")))
            }
        }
    }

    /// Like `run`, but a deadline that fires is not a verdict: the request is left to finish
    /// (its answer, when it comes, is read and dropped by the driver) and `Ok(None)` returned.
    pub(super) fn run_soft<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        fut: impl Future<Output = std::result::Result<T, tokio_postgres::Error>> + Send,
    ) -> Result<Option<T>>
    where
        T: Send,
    {
        self.usable(what)?;
        self.reg.arm(deadline_after(timeout));
        self.in_flight = true;
        let res = self
            .rt
            .block_on(async { tokio::time::timeout(timeout, fut).await });
        self.in_flight = false;
        self.reg.disarm();
        // Nothing ran when no thread could drive the call: the link is as it was.
        let res = res.map_err(|e| e.context(what))?;
        match res {
            Ok(Ok(v)) => {
                self.last_ok = Instant::now();
                Ok(Some(v))
            }
            Ok(Err(e)) => Err(self.classify(what, e)),
            Err(_) => Ok(None),
        }
    }

    pub(super) fn closed_error(&mut self, what: &str) -> Error {
        let why = match self.reg.severed() {
            SeverReason::Shutdown => "connection severed by shutdown".to_owned(),
            SeverReason::Backstop => "connection severed by the watchdog".to_owned(),
            _ if self.notifications.flooded() => format!(
                "connection to {} dropped: the server sent more than {} notifications it had \
                 not read yet (a flood: any role that can connect can NOTIFY)",
                self.peer,
                super::NOTIFY_UNREAD_MAX
            ),
            _ => format!("connection to {} closed", self.peer),
        };
        self.broken.get_or_insert_with(|| why.clone());
        self.reg.sever();
        let kind = if self.reg.severed() == SeverReason::Shutdown {
            ErrorKind::Shutdown
        } else {
            ErrorKind::Closed
        };
        Error::new(kind, format!("{what}: {why}"))
    }

    pub(super) fn classify(&mut self, what: &str, e: tokio_postgres::Error) -> Error {
        if let Some(db) = e.as_db_error() {
            let err = Error::from_db(what, db);
            // FATAL and PANIC end the session (terminated backend, server shutdown).
            if matches!(db.severity(), "FATAL" | "PANIC")
                || session_attrs::ends_session(db.code().code())
            {
                self.broken = Some(format!("server ended the session: {}", db.message()));
                self.reg.sever();
                return err.set_kind(ErrorKind::Closed);
            }
            return err;
        }
        let lost = e.is_closed()
            || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
        if lost {
            let mut err = self.closed_error(what);
            if self.reg.severed() == SeverReason::None || self.reg.severed() == SeverReason::Local {
                err = Error::with_source(err.kind(), err.to_string(), e);
            }
            return err;
        }
        // A reply the driver did not expect, or could not parse: client and server are out
        // of step (a broken proxy, a driver bug), and whatever the session did is unknown.
        // The link is not trusted again.
        let text = e.to_string();
        if text.starts_with("unexpected message from server")
            || text.starts_with("error parsing response from server")
        {
            self.broken = Some(format!("protocol out of step: {text}"));
            self.reg.sever();
            return Error::with_source(
                ErrorKind::Closed,
                format!("{what}: the server's replies are out of step with our requests (connection severed)"),
                e,
            );
        }
        // Anything else (a type conversion, a parameter count) leaves the link alone.
        Error::with_source(ErrorKind::Database, what.to_owned(), e)
    }
}

impl CancelRoute {
    /// Sends a CancelRequest for whatever the session is running, from a fresh socket
    /// registered in the connection's watchdog group (so a shutdown severs it too), under
    /// [`CANCEL_DEADLINE`]. Best effort: a failure is logged, never returned.
    pub(super) fn send(&self, rt: &ConnRuntime, what: &str, peer: &str, cap: Option<Instant>) {
        let mut wait = CANCEL_DEADLINE.min(self.opts.connect_timeout);
        if let Some(cap) = cap {
            wait = wait.min(cap.saturating_duration_since(Instant::now()));
        }
        if wait.is_zero() {
            log::warn!("{what} on {peer}: timed out, and no time is left to send a cancel request");
            return;
        }
        let deadline = socket::Deadline {
            at: Instant::now() + wait,
            name: format!("{} cancel deadline", fmt_duration(wait)),
        };
        let started = Instant::now();
        let sent = (|| -> Result<()> {
            let (stream, reg) = socket::connect(
                rt,
                &self.opts,
                &self.target,
                &self.watchdog,
                self.group,
                &deadline,
            )?;
            reg.arm(deadline.at);
            let left = deadline.at.saturating_duration_since(Instant::now());
            let connector = if self.plain {
                None
            } else {
                self.opts.tls.connector(&self.target)?
            };
            let res = match connector {
                None => rt.block_on(async {
                    tokio::time::timeout(
                        left,
                        self.token.cancel_query_raw(stream, tokio_postgres::NoTls),
                    )
                    .await
                }),
                Some(tls) => rt.block_on(async {
                    tokio::time::timeout(left, self.token.cancel_query_raw(stream, tls)).await
                }),
            };
            reg.disarm();
            reg.sever();
            let res = res?;
            match res {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Error::with_source(ErrorKind::Connect, "sending", e)),
                Err(_) => Err(Error::new(
                    ErrorKind::Timeout,
                    format!("no answer within {}", deadline.name),
                )),
            }
        })();
        match sent {
            Ok(()) => log::info!(
                "{what} on {peer}: timed out; cancel request sent in {}",
                fmt_duration(started.elapsed())
            ),
            Err(e) => log::warn!(
                "{what} on {peer}: timed out, and the cancel request failed ({e}); the \
                 statement may run on in its backend until the server notices the client is gone"
            ),
        }
    }
}
