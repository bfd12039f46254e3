//! The connection layer: sockets we own, a deadline on every round-trip, a watchdog that can
//! sever any of them, and a pool that stays bounded when sockets go half-open.

pub(crate) mod client;
pub(crate) mod options;
pub(crate) mod pool;
pub(crate) mod runtime;
pub(crate) mod session_attrs;
pub(crate) mod socket;
pub(crate) mod target;
pub(crate) mod time;
pub(crate) mod tls;
pub(crate) mod transaction;
pub(crate) mod watchdog;

pub(crate) use client::Cycle;
pub use client::{Connection, Notification};
pub use transaction::Transaction;
