//! The one error type of the library.
//!
//! Every fallible call returns [`Error`], an opaque value with a [`kind`](Error::kind) to match
//! on and a message that reads as a sentence: what was being done, then what went wrong, then,
//! where there is one, what to do about it (`claiming jobs: connection closed after 10s
//! io_timeout`, `schema not installed: run \`postpone migrate\``). A timeout always names the
//! deadline that fired.
//!
//! Task code does not return this type: tasks return [`TaskError`](crate::TaskError), which
//! says what should happen to the job.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// A specialised `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is: what a caller branches on. The error's text says
/// what failed and what to do; the kind says which case it is.
///
/// ```no_run
/// # fn main() -> postpone::Result<()> {
/// # let app = postpone::App::connect("postgres://postgres@127.0.0.1/app")?;
/// use postpone::ErrorKind;
///
/// match app.job("welcome").queueing_lock("user:42").defer(&42) {
///     Ok(id) => println!("deferred {id}"),
///     Err(e) if e.kind() == ErrorKind::AlreadyEnqueued => println!("already waiting"),
///     // Whether the job was inserted is unknown: retry only what is harmless twice.
///     Err(e) if e.kind() == ErrorKind::Timeout => return Err(e),
///     Err(e) if e.kind() == ErrorKind::SchemaOutdated => {
///         eprintln!("{e}"); // says to run `postpone migrate`
///         return Err(e);
///     }
///     Err(e) => return Err(e),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A connection string, URL or option is malformed or out of range.
    Config,
    /// The server could not be reached, refused the connection, or rejected the startup.
    Connect,
    /// A deadline fired (`connect_timeout`, `io_timeout` or `pool_timeout`, or the admin
    /// API's wait for a job's row that another session holds locked); the message names it.
    Timeout,
    /// The connection was closed, reset or severed while it was in use.
    Closed,
    /// The server answered with an error.
    Database,
    /// A TLS negotiation or certificate check failed.
    Tls,
    /// The postpone schema is not installed in this database.
    SchemaMissing,
    /// The postpone schema in this database is older than this library.
    SchemaOutdated,
    /// A job with the same queueing lock is already waiting (`todo`); nothing was inserted.
    AlreadyEnqueued,
    /// An argument given to the library is not acceptable (empty task name, arguments that
    /// do not serialize, an invalid option value).
    InvalidInput,
    /// The job (or worker) named does not exist.
    NotFound,
    /// The job is not in a state that allows the operation (retrying a running job, say).
    InvalidState,
    /// The worker or application is shutting down.
    Shutdown,
    /// Anything else: an internal failure that should be reported as a bug.
    Other,
    /// The postpone schema in this database is newer than this library (a newer postpone
    /// migrated it); the admin API refuses to act on it.
    SchemaNewer,
    /// The server answered, but the database the connection string names does not exist
    /// on it (SQLSTATE `3D000`): create it, or fix the name.
    DatabaseMissing,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorKind::Config => "invalid configuration",
            ErrorKind::Connect => "connection failed",
            ErrorKind::Timeout => "timed out",
            ErrorKind::Closed => "connection closed",
            ErrorKind::Database => "database error",
            ErrorKind::Tls => "tls error",
            ErrorKind::SchemaMissing => "schema not installed",
            ErrorKind::SchemaOutdated => "schema outdated",
            ErrorKind::AlreadyEnqueued => "already enqueued",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::NotFound => "not found",
            ErrorKind::InvalidState => "invalid state",
            ErrorKind::Shutdown => "shutting down",
            ErrorKind::Other => "internal error",
            ErrorKind::SchemaNewer => "schema newer than this library",
            ErrorKind::DatabaseMissing => "database does not exist",
        };
        f.write_str(s)
    }
}

/// The error type of every fallible call in postpone.
///
/// Its `Display` is a complete sentence, context first and cause last; [`kind`](Error::kind)
/// and the `is_*` predicates tell the cases apart without parsing text.
///
/// ```
/// # fn main() {
/// let err = postpone::App::connect("postgres://host:notaport/db").unwrap_err();
/// assert_eq!(err.kind(), postpone::ErrorKind::Config);
/// assert!(err.to_string().starts_with("invalid database url"));
/// # }
/// ```
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync>>,
    sqlstate: Option<String>,
    constraint: Option<String>,
}

impl Error {
    /// Creates an error of the given kind with a message.
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            inner: Box::new(Inner {
                kind,
                message: message.into(),
                source: None,
                sqlstate: None,
                constraint: None,
            }),
        }
    }

    /// Creates an error that keeps `source` as its cause; the text of the cause and of its own
    /// causes is appended to `message` (a driver error often says only "invalid connection
    /// string" and keeps the useful part, "invalid value for parameter `port`", in its source).
    pub(crate) fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> Error {
        let source = source.into();
        let mut message = message.into();
        let mut cause: Option<&(dyn StdError + 'static)> = Some(&*source);
        while let Some(c) = cause {
            let text = c.to_string();
            if !text.is_empty() && !message.contains(&text) {
                if !message.is_empty() {
                    message.push_str(": ");
                }
                message.push_str(&text);
            }
            cause = c.source();
        }
        Error {
            inner: Box::new(Inner {
                kind,
                message,
                source: Some(source),
                sqlstate: None,
                constraint: None,
            }),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidInput, message)
    }

    /// Prepends what was being done: `ctx: message`.
    pub(crate) fn context(mut self, ctx: impl fmt::Display) -> Error {
        self.inner.message = format!("{ctx}: {}", self.inner.message);
        self
    }

    /// Appends what to do: `message (remedy)`.
    pub(crate) fn remedy(mut self, remedy: &str) -> Error {
        self.inner.message = format!("{} ({remedy})", self.inner.message);
        self
    }

    pub(crate) fn set_sqlstate(mut self, code: &str) -> Error {
        self.inner.sqlstate = Some(code.to_owned());
        self
    }

    /// An error answered by the server, with its SQLSTATE, detail and hint.
    pub(crate) fn from_db(what: &str, db: &tokio_postgres::error::DbError) -> Error {
        let mut msg = format!("{what}: {}: {}", db.severity(), db.message());
        if let Some(d) = db.detail() {
            msg.push_str(&format!(" ({d})"));
        }
        if let Some(h) = db.hint() {
            msg.push_str(&format!(" (hint: {h})"));
        }
        let code = db.code().code();
        // A table of ours is missing: say what to do, as the App's own schema check does
        // (calls on the caller's client, like `defer_in`, do not go through that check).
        let kind = if code == "42P01" && db.message().contains("postpone_") {
            msg.push_str(" (schema not installed: run `postpone migrate`)");
            ErrorKind::SchemaMissing
        } else if code == "54000" && db.constraint() == Some(crate::store::MAX_ARGS_CONSTRAINT) {
            // Arguments over the installation's limit (the insert trigger of schema 27).
            ErrorKind::InvalidInput
        } else {
            ErrorKind::Database
        };
        msg.push_str(&format!(" [SQLSTATE {code}]"));
        let mut e = Error::new(kind, msg).set_sqlstate(code);
        e.inner.constraint = db.constraint().map(str::to_owned);
        e
    }

    /// Converts an error of a `postgres` client we do not own (a caller's transaction).
    pub(crate) fn from_client(what: &str, e: tokio_postgres::Error) -> Error {
        if let Some(db) = e.as_db_error() {
            return Error::from_db(what, db);
        }
        let kind = if e.is_closed() {
            ErrorKind::Closed
        } else {
            ErrorKind::Database
        };
        Error::with_source(kind, what.to_owned(), e)
    }

    pub(crate) fn set_kind(mut self, kind: ErrorKind) -> Error {
        self.inner.kind = kind;
        self
    }

    /// The constraint a server error names, if any.
    pub(crate) fn constraint(&self) -> Option<&str> {
        self.inner.constraint.as_deref()
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The SQLSTATE code when the server answered with an error (`"23505"`, ...).
    pub fn sqlstate(&self) -> Option<&str> {
        self.inner.sqlstate.as_deref()
    }

    /// True when the server refused a new connection for want of a free slot (SQLSTATE
    /// `53300`, `53400`) or because it accepts none for now (`57P03`).
    pub(crate) fn is_refusal(&self) -> bool {
        self.sqlstate().is_some_and(|c| refusal_remedy(c).is_some())
    }

    /// True when a deadline fired.
    pub fn is_timeout(&self) -> bool {
        self.inner.kind == ErrorKind::Timeout
    }

    /// True when the connection was lost (closed, reset, severed) or a deadline fired on it:
    /// the operation may succeed again on a fresh connection. A missing database is not
    /// such a loss ([`is_database_missing`](Self::is_database_missing)).
    pub fn is_connection_lost(&self) -> bool {
        matches!(
            self.inner.kind,
            ErrorKind::Timeout | ErrorKind::Closed | ErrorKind::Connect
        )
    }

    /// True for the typed queueing-lock conflict of a defer.
    pub fn is_already_enqueued(&self) -> bool {
        self.inner.kind == ErrorKind::AlreadyEnqueued
    }

    /// True when the server answered that the database named by the connection string does
    /// not exist ([`ErrorKind::DatabaseMissing`]).
    ///
    /// ```no_run
    /// match postpone::App::connect("postgres://postgres@127.0.0.1/no_such_db") {
    ///     Err(e) if e.is_database_missing() => {
    ///         // "connecting to 127.0.0.1:5432: database \"no_such_db\" does not exist;
    ///         // create it or check the URL [SQLSTATE 3D000]"
    ///         eprintln!("{e}");
    ///     }
    ///     other => drop(other),
    /// }
    /// ```
    pub fn is_database_missing(&self) -> bool {
        self.inner.kind == ErrorKind::DatabaseMissing
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.inner.kind)
            .field("message", &self.inner.message);
        if let Some(code) = &self.inner.sqlstate {
            d.field("sqlstate", code);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.message)
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_ref()
            .map(|s| &**s as &(dyn StdError + 'static))
    }
}

/// Formats a duration the way error messages and logs show it: `10s`, `250ms`, `1.5s`.
pub(crate) fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.is_zero() {
        "0s".to_owned()
    } else if ms == 0 {
        format!("{}µs", d.as_micros())
    } else if ms < 1000 {
        format!("{ms}ms")
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// What to do about a server that refuses new connections for now: out of connection slots
/// (`53300`: `max_connections`, or a role's or database's `CONNECTION LIMIT`; `53400`), or
/// not accepting any (`57P03`: starting up, shutting down, in recovery). `None` for any other
/// SQLSTATE.
pub(crate) fn refusal_remedy(code: &str) -> Option<&'static str> {
    match code {
        "53300" | "53400" => Some(
            "every connection slot is taken: raise max_connections (or the role's CONNECTION \
             LIMIT), open fewer connections per process (a smaller pool_size; a worker holds \
             2 while busy, 1 idle), or put PgBouncer in front",
        ),
        "57P03" => Some(
            "the server is starting up, shutting down or in recovery and accepts no \
             connections yet",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_comes_first_then_cause() {
        let e = Error::with_source(
            ErrorKind::Connect,
            "connecting to 127.0.0.1:1",
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        )
        .context("claiming jobs");
        assert_eq!(e.kind(), ErrorKind::Connect);
        assert!(e
            .to_string()
            .starts_with("claiming jobs: connecting to 127.0.0.1:1: "));
        assert!(e.source().is_some());
        assert!(e.is_connection_lost());
    }

    #[test]
    fn the_whole_cause_chain_is_in_the_message_once() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("invalid connection string")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let inner = std::io::Error::other("invalid value for parameter `port`");
        let e = Error::with_source(ErrorKind::Config, "invalid database url", Outer(inner));
        assert_eq!(
            e.to_string(),
            "invalid database url: invalid connection string: invalid value for parameter `port`"
        );
        // A cause whose text already includes its own cause is not repeated.
        let wrapped = Error::with_source(ErrorKind::Closed, "outer", e);
        assert_eq!(
            wrapped.to_string(),
            "outer: invalid database url: invalid connection string: invalid value for parameter `port`"
        );
    }

    #[test]
    fn timeout_names_the_deadline() {
        let e = Error::new(
            ErrorKind::Timeout,
            format!(
                "claiming jobs: no answer within {} io_timeout",
                fmt_duration(Duration::from_secs(10))
            ),
        );
        assert!(e.is_timeout());
        assert_eq!(
            e.to_string(),
            "claiming jobs: no answer within 10s io_timeout"
        );
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(fmt_duration(Duration::from_secs(3)), "3s");
        assert_eq!(fmt_duration(Duration::from_micros(20)), "20µs");
    }
}
