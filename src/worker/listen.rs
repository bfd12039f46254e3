//! The listener: a dedicated connection that LISTENs for new jobs and abort requests, for a
//! worker given [`listen_via`](super::WorkerBuilder::listen_via) (the App's connections go
//! through a pooler that keeps no session). Otherwise the beat thread LISTENs on its own
//! connection (`beat.rs`) and hands what it hears to [`handle`] here.
//!
//! It wakes the fetcher on `job:<queue>` (for a queue this worker serves), moves the
//! fetcher's idle wait earlier on `at:<time>:<queue>` (a job due later, see `due.rs`), and
//! raises the abort flag of a running job on `abort:<id>`. Silence proves nothing on a
//! half-open link, so after every `listen_ping_interval` without a notification it pings
//! under `io_timeout`; a failed ping or wait drops the connection, and the listener
//! reconnects with backoff. After every (re)connect it wakes the fetcher once, since
//! notifications may have been missed; the fetcher's polling covers the gap anyway. More
//! than [`HEAR_AT_MOST`] notifications at once are a flood (any role can NOTIFY): the
//! listener drops its connection, with what the server still had to send it, and listens
//! again after [`FLOOD_MUTE`].

use crossbeam_channel::{Receiver, Sender};

use super::link::Link;
use super::{sleep_or_stop, Shared, FLOOD_MUTE, HEAR_AT_MOST};
use crate::conn::{Connection, Notification};
use crate::job::JobId;

/// `listening` gets one message after each successful LISTEN (the first tells `spawn` the
/// worker hears notifications).
pub(crate) fn run(shared: &Shared, stop: &Receiver<()>, wake: &Sender<()>, listening: &Sender<()>) {
    let channel = shared.app.namespace().channel().to_owned();
    let mut link = Link::with_setup(shared, "listening for jobs", move |c: &mut Connection| {
        c.listen(&channel)
    })
    .for_listener();
    let mut fresh = true;
    loop {
        if shared.stopping() {
            return;
        }
        let c = match link.get() {
            Ok((c, ())) => c,
            Err(wait) => {
                fresh = true;
                if sleep_or_stop(stop, wait) {
                    return;
                }
                continue;
            }
        };
        if fresh {
            // Listening (again): notifications may have been missed meanwhile.
            fresh = false;
            let _ = listening.try_send(());
            shared.news(wake);
        }
        let interrupt = shared.listen_wake.clone();
        let got = c.wait_notification_or(shared.opts.listen_ping_interval, async move {
            interrupt.notified().await
        });
        let result = match got {
            Ok(Some(n)) => {
                handle(shared, &n, wake);
                // What else arrived, without waiting: at most HEAR_AT_MOST, as the beat.
                let mut heard = 1;
                loop {
                    if heard >= HEAR_AT_MOST {
                        break Err(None);
                    }
                    heard += 1;
                    match c.wait_notification(std::time::Duration::ZERO) {
                        Ok(Some(n)) => handle(shared, &n, wake),
                        Ok(None) => break Ok(()),
                        Err(e) => break Err(Some(e)),
                    }
                }
            }
            Ok(None) if shared.stopping() => return,
            // Silence proves nothing on a half-open link: ping it.
            Ok(None) => c.ping(c.io_timeout()).map_err(Some),
            Err(e) => Err(Some(e)),
        };
        if result.is_err() && shared.stopping() {
            return;
        }
        // Dropped for a flood that came while it waited or pinged: the same as one counted.
        let result = match result {
            Err(Some(_)) if link.flooded() => Err(None),
            r => r,
        };
        let result = match result {
            Err(None) => {
                // A flood: what the server still has to send this session dies with it.
                log::warn!(
                    "worker {}: more than {HEAR_AT_MOST} notifications at once (a bulk abort, or a flood: any role that can connect can NOTIFY); not listening for {FLOOD_MUTE:?}, the fetcher polls meanwhile",
                    shared.name
                );
                link.drop_connection();
                fresh = true;
                shared.news(wake);
                if sleep_or_stop(stop, FLOOD_MUTE) {
                    return;
                }
                continue;
            }
            Err(Some(e)) => Err(e),
            Ok(()) => Ok(()),
        };
        if let Err(wait) = link.judge(result) {
            // A LISTEN link that failed once is not trusted again, broken or not.
            link.drop_connection();
            fresh = true;
            if sleep_or_stop(stop, wait) {
                return;
            }
        }
    }
}

/// A notification is only a hint (any role that can connect can send one): `job:<queue>`
/// makes the fetcher look now (or the beat, for a sleeping fetcher), `pause:<queue>` makes the beat thread read the controls now,
/// `abort:<id>` makes the beat thread read the job's abort flag
/// in the table now, and holds the job's start until it has.
pub(crate) fn handle(shared: &Shared, n: &Notification, wake: &Sender<()>) {
    if let Some(queue) = n.payload.strip_prefix("job:") {
        if ours(shared, queue) {
            shared.news(wake);
        }
    } else if let Some((at, queue)) = n.payload.strip_prefix("at:").and_then(super::due::parse) {
        if ours(shared, queue) {
            shared.due.heard(at);
        }
    } else if let Some(queue) = n.payload.strip_prefix("pause:") {
        // The beat reads the table, and gives back the held jobs of a paused queue.
        if ours(shared, queue) && shared.ledger.any_held() {
            let _ = shared.beat_wake.0.try_send(());
        }
    } else if let Some(id) = n.payload.strip_prefix("abort:") {
        if let Ok(id) = id.parse::<i64>() {
            if shared.ledger.suspect(JobId(id)) {
                log::debug!(
                    "worker {}: abort notification for job {id}: reading the table",
                    shared.name
                );
                let _ = shared.beat_wake.0.try_send(());
            }
        }
    }
}

/// True when `queue` (of a notification; `*`: any) is one this worker serves.
fn ours(shared: &Shared, queue: &str) -> bool {
    queue == "*"
        || shared
            .opts
            .queues
            .as_ref()
            .is_none_or(|qs| qs.iter().any(|q| q == queue))
}
