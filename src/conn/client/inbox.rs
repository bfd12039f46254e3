//! A connection's unread notifications, bounded: see [`NOTIFY_UNREAD_MAX`].

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::mpsc;

use super::Notification;

/// Most notifications a connection holds unread (received during round-trips or before a
/// wait reads them), and most bytes of them: any role that can connect can NOTIFY, and the
/// server sends a listening session every pending notification before the answer to its
/// next statement, so a flood held that statement until millions had been received and
/// kept them all in memory. Past either bound the connection is dropped (its
/// round-trip fails as closed, naming the flood; [`Connection::flooded`] says so).
pub(crate) const NOTIFY_UNREAD_MAX: usize = 100_000;
/// See [`NOTIFY_UNREAD_MAX`].
pub(crate) const NOTIFY_UNREAD_BYTES: usize = 16 << 20;

/// What the driver's task and the connection share about unread notifications.
#[derive(Default)]
pub(crate) struct NotifyGauge {
    unread: AtomicUsize,
    bytes: AtomicUsize,
    flooded: AtomicBool,
}

impl NotifyGauge {
    fn size(n: &Notification) -> usize {
        n.channel.len() + n.payload.len() + 32
    }

    /// Counts one more unread notification; false once past the bounds (a flood: the
    /// connection is to be dropped).
    pub(crate) fn arrived(&self, n: &Notification) -> bool {
        let count = self.unread.fetch_add(1, SeqCst) + 1;
        let bytes = self.bytes.fetch_add(Self::size(n), SeqCst) + Self::size(n);
        if count > NOTIFY_UNREAD_MAX || bytes > NOTIFY_UNREAD_BYTES {
            self.flooded.store(true, SeqCst);
            return false;
        }
        true
    }

    fn read(&self, n: &Notification) {
        self.unread.fetch_sub(1, SeqCst);
        self.bytes.fetch_sub(Self::size(n), SeqCst);
    }
}

/// The notifications the driver received for this connection, not read yet.
pub(crate) struct Inbox {
    pub(crate) rx: mpsc::UnboundedReceiver<Notification>,
    pub(crate) gauge: Arc<NotifyGauge>,
}

impl Inbox {
    pub(super) fn try_recv(
        &mut self,
    ) -> std::result::Result<Notification, mpsc::error::TryRecvError> {
        let n = self.rx.try_recv()?;
        self.gauge.read(&n);
        Ok(n)
    }

    pub(super) fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Notification>> {
        let got = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(n)) = &got {
            self.gauge.read(n);
        }
        got
    }

    pub(super) fn flooded(&self) -> bool {
        self.gauge.flooded.load(SeqCst)
    }
}
