//! What every command shares: the global options, the connection with the schema check,
//! the JSON writer, and the error type with its documented exit code and how it is printed.

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use postpone::{App, ErrorKind};
use serde::Serialize;

/// The exit codes, documented in docs/cli.md (a test keeps the two in step).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// 1: `healthcheck` found the database or its workers unhealthy.
    Unhealthy = 1,
    /// 2: bad arguments, or a failure without a code of its own.
    Usage = 2,
    /// 3: the job (or other named thing) does not exist.
    NotFound = 3,
    /// 4: the job's status does not allow the operation (or its queueing lock is taken, or
    /// another session holds its row locked).
    WrongState = 4,
    /// 5: the database could not be reached, or did not answer within `--timeout`.
    Unreachable = 5,
    /// 6: the server refused: authentication failed or the role lacks a privilege.
    PermissionDenied = 6,
    /// 7: the schema is not installed, is older than this postpone, or is not recorded.
    SchemaMissing = 7,
    /// 8: the schema is newer than this postpone.
    SchemaNewer = 8,
    /// 9: the server answered, but the database named does not exist.
    DatabaseMissing = 9,
}

impl Exit {
    /// Every code, in order, with its name in JSON errors and its meaning.
    pub const ALL: [(Exit, &'static str, &'static str); 9] = [
        (Exit::Unhealthy, "unhealthy", "healthcheck: a check failed"),
        (Exit::Usage, "usage", "bad arguments, or another failure"),
        (Exit::NotFound, "not_found", "no such job"),
        (
            Exit::WrongState,
            "wrong_state",
            "the job's status does not allow it (or its queueing lock is taken, or another session holds its row locked)",
        ),
        (
            Exit::Unreachable,
            "unreachable",
            "database unreachable, or no answer within --timeout",
        ),
        (
            Exit::PermissionDenied,
            "permission_denied",
            "authentication failed or privilege missing",
        ),
        (
            Exit::SchemaMissing,
            "schema_missing",
            "schema not installed, older than this postpone, or unrecorded",
        ),
        (
            Exit::SchemaNewer,
            "schema_newer",
            "schema newer than this postpone",
        ),
        (
            Exit::DatabaseMissing,
            "database_missing",
            "the database does not exist on the server (create it or check the URL)",
        ),
    ];

    /// Its name in JSON errors.
    pub fn name(self) -> &'static str {
        Exit::ALL
            .iter()
            .find(|(e, _, _)| *e == self)
            .map_or("usage", |(_, n, _)| n)
    }

    /// The code for a library error.
    pub fn of(e: &postpone::Error) -> Exit {
        if let Some(code) = e.sqlstate() {
            // insufficient_privilege, invalid_authorization_specification, invalid_password
            if code == "42501" || code.starts_with("28") {
                return Exit::PermissionDenied;
            }
            // lock_not_available: another session holds the job's row (the admin API gave
            // up waiting for it), not an unreachable server.
            if code == "55P03" {
                return Exit::WrongState;
            }
        }
        match e.kind() {
            ErrorKind::NotFound => Exit::NotFound,
            ErrorKind::InvalidState | ErrorKind::AlreadyEnqueued => Exit::WrongState,
            ErrorKind::Connect | ErrorKind::Timeout | ErrorKind::Closed | ErrorKind::Tls => {
                Exit::Unreachable
            }
            ErrorKind::SchemaMissing | ErrorKind::SchemaOutdated => Exit::SchemaMissing,
            ErrorKind::SchemaNewer => Exit::SchemaNewer,
            ErrorKind::DatabaseMissing => Exit::DatabaseMissing,
            _ => Exit::Usage,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

/// Options given before or after the command, read by every command.
#[derive(Debug)]
pub struct Context {
    /// The connection string (URL or key=value).
    pub database_url: String,
    /// Where it came from: `--database-url`, `DATABASE_URL`, `PG* environment`, `default`.
    pub source: &'static str,
    /// `user@host:port/db`, without the password.
    pub database: String,
    /// `--schema` (or `POSTPONE_SCHEMA`): the schema of postpone's objects.
    pub schema: Option<String>,
    /// Print JSON instead of tables.
    pub json: bool,
    /// Deadline of connecting and of every round-trip.
    pub timeout: Duration,
    /// `-v` given.
    pub verbose: bool,
}

impl Context {
    /// Connects with the `--timeout` deadlines and a pool of two, without checking the
    /// schema (for `migrate` and `healthcheck`).
    pub fn connect_unchecked(&self) -> Result<App, CliError> {
        if self.verbose {
            eprintln!(
                "postpone: database {} (from {}){}",
                self.database,
                self.source,
                self.schema
                    .as_ref()
                    .map(|s| format!(", schema {s:?}"))
                    .unwrap_or_default()
            );
        }
        self.builder()
            .pool_size(2)
            .connect_timeout(self.timeout)
            .io_timeout(self.timeout)
            .pool_timeout(self.timeout + Duration::from_secs(1))
            .build()
            .map_err(CliError::from)
    }

    /// A builder for the database and schema given.
    pub fn builder(&self) -> postpone::AppBuilder {
        let b = App::builder(self.database_url.clone());
        match &self.schema {
            Some(s) => b.schema(s.clone()),
            None => b,
        }
    }

    /// Connects, and refuses a schema that is missing, older or newer than this postpone.
    pub fn connect(&self) -> Result<App, CliError> {
        let app = self.connect_unchecked()?;
        app.admin().check_schema().map_err(|e| {
            // Which database: without a URL the tool reads the PG* variables' defaults, and a
            // `postpone migrate` run on this advice should reach the database meant.
            CliError::Failed(Exit::of(&e), format!("database {}: {e}", self.database))
        })?;
        Ok(app)
    }
}

/// Why the tool stopped.
#[derive(Debug)]
pub enum CliError {
    /// Bad arguments: clap's message (it starts with `error:` and shows the usage).
    Usage(clap::Error),
    /// A failed operation, with its exit code.
    Failed(Exit, String),
    /// Writing the output failed (a closed pipe, say).
    Output(io::Error),
}

impl CliError {
    /// A failure of the tool itself (bad input found after parsing): exit 2.
    pub fn usage(msg: impl Into<String>) -> CliError {
        CliError::Failed(Exit::Usage, msg.into())
    }
}

impl CliError {
    /// Prints the error on stderr (`error: ...`, or one JSON object with `json`) and
    /// returns its exit code. A closed stdout (`postpone jobs | head`) is no error: exit 0.
    pub fn report(self, json: bool) -> ExitCode {
        match self {
            CliError::Usage(e) => {
                if json {
                    report_json(
                        Exit::Usage,
                        &snake_case(&format!("{:?}", e.kind())),
                        &plain_usage_error(&e.to_string()),
                    );
                } else {
                    eprint!("{}", e.render());
                }
                Exit::Usage.into()
            }
            CliError::Failed(exit, msg) => {
                if json {
                    report_json(exit, exit.name(), &msg);
                } else {
                    eprintln!("error: {}", crate::output::clean(&msg));
                }
                exit.into()
            }
            CliError::Output(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            CliError::Output(e) => {
                let msg = format!("writing the output: {e}");
                if json {
                    report_json(Exit::Usage, "output", &msg);
                } else {
                    eprintln!("error: {msg}");
                }
                Exit::Usage.into()
            }
        }
    }
}

impl From<postpone::Error> for CliError {
    fn from(e: postpone::Error) -> CliError {
        CliError::Failed(Exit::of(&e), e.to_string())
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> CliError {
        CliError::Output(e)
    }
}

/// clap's error text for a terminal, as one line for a JSON message: without the `error: `
/// prefix, the usage block and the pointer to `--help` (lines continued after a colon are
/// joined to it, tips follow after `; `).
fn plain_usage_error(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() {
            continue;
        }
        let line = line.strip_prefix("error: ").unwrap_or(line);
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
        }
        out.push_str(line);
    }
    out
}

/// `InvalidValue` to `invalid_value` (clap's error kinds, for JSON errors).
fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// An error under `--json`, on stderr: `{"error": {"code": "not_found", "exit_code": 3,
/// "message": "..."}}`.
fn report_json(exit: Exit, code: &str, message: &str) {
    #[derive(Serialize)]
    struct Body<'a> {
        code: &'a str,
        exit_code: u8,
        message: &'a str,
    }
    #[derive(Serialize)]
    struct Wrap<'a> {
        error: Body<'a>,
    }
    let w = Wrap {
        error: Body {
            code,
            exit_code: exit as u8,
            message: message.trim_end(),
        },
    };
    if let Ok(text) = serde_json::to_string(&w) {
        eprintln!("{text}");
    }
}

/// Writes `value` as pretty JSON and a newline. A closed pipe stays a closed pipe (so that
/// `postpone jobs --json | head` ends quietly).
pub fn json<T: Serialize + ?Sized>(out: &mut dyn Write, value: &T) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *out, value).map_err(|e| match e.io_error_kind() {
        Some(kind) => CliError::Output(io::Error::new(kind, e)),
        None => CliError::Output(io::Error::other(e)),
    })?;
    writeln!(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_documented_in_docs_cli_md() {
        let doc = include_str!("../../../docs/cli.md");
        for (e, name, meaning) in Exit::ALL {
            let row = format!("| {} | `{name}` | {meaning} |", e as u8);
            assert!(doc.contains(&row), "docs/cli.md lacks the row {row}");
        }
        assert!(doc.contains("| 0 | | success |"));
    }

    #[test]
    fn usage_errors_become_one_plain_line() {
        for (text, plain) in [
            (
                "error: unexpected argument '10' found\n\nUsage: postpone priority [OPTIONS] --to <N> [ID]\n\nFor more information, try '--help'.\n",
                "unexpected argument '10' found",
            ),
            (
                "error: the following required arguments were not provided:\n  <N>\n\nUsage: postpone priority <ID> <N>\n       postpone priority <ID> --to <N>\n\nFor more information, try '--help'.\n",
                "the following required arguments were not provided: <N>",
            ),
            (
                "error: unexpected argument '--too' found\n\n  tip: a similar argument exists: '--to'\n\nUsage: x\n",
                "unexpected argument '--too' found; tip: a similar argument exists: '--to'",
            ),
        ] {
            assert_eq!(plain_usage_error(text), plain);
        }
    }

    #[test]
    fn exit_codes_are_distinct_and_named() {
        let mut codes: Vec<u8> = Exit::ALL.iter().map(|(e, _, _)| *e as u8).collect();
        codes.dedup();
        assert_eq!(codes, vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(Exit::SchemaNewer.name(), "schema_newer");
    }
}
