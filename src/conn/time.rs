//! Durations and deadlines that never overflow: a leaf every part of the connection layer
//! uses.

use std::time::{Duration, Instant};

/// `now + d`, saturating: a huge duration (`Duration::MAX`) means "very long", not a panic.
pub(crate) fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(LONGEST))
        .unwrap_or(now)
}

/// What "very long" becomes: a huge timeout (`Duration::MAX`) is taken as this, about 30
/// years, so that deadlines and sums of timeouts stay representable.
pub(crate) const LONGEST: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);
