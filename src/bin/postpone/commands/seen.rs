//! Whether the queue a command names has ever been seen, and the one note that says it has
//! not. `pause`, `resume`, `limit`, `rate-limit` and `key-limit` do what was asked for any
//! valid queue name (a queue may be set up before its first job), then tell the same way
//! when no job or worker has used the name: this note under the answer, and `queue_seen` in
//! their JSON (`false`; `null` when the look itself failed, which fails nothing).

use std::io::{self, Write};

use postpone::App;

use crate::output;

/// What [`Admin::queue_seen`](postpone::Admin::queue_seen) answered.
pub enum Seen {
    Yes,
    No,
    /// The look failed (the command itself succeeded): why.
    Unknown(String),
}

impl Seen {
    /// Looks `queue` up, after the command did its work.
    pub fn look(app: &App, queue: &str) -> Seen {
        match app.admin().queue_seen(queue) {
            Ok(true) => Seen::Yes,
            Ok(false) => Seen::No,
            Err(e) => Seen::Unknown(e.to_string()),
        }
    }

    /// The value of `queue_seen` in JSON answers.
    pub fn json(&self) -> Option<bool> {
        match self {
            Seen::Yes => Some(true),
            Seen::No => Some(false),
            Seen::Unknown(_) => None,
        }
    }

    /// Writes the note, if there is one, after the command's own line.
    pub fn note(&self, out: &mut dyn Write, queue: &str) -> io::Result<()> {
        let queue = output::clean(queue);
        match self {
            Seen::Yes => Ok(()),
            Seen::No => writeln!(
                out,
                "note: queue {queue} has never been seen (no job of it in the table, no worker \
                 serving it by name); done all the same, since queues are not declared: check \
                 the name"
            ),
            Seen::Unknown(e) => writeln!(
                out,
                "note: could not tell whether queue {queue} has been seen: {}",
                output::clean(e)
            ),
        }
    }
}
