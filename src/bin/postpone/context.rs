//! What every command shares: the global options, the connection, the JSON writer and the
//! error type that `main` turns into a message and an exit code.

use std::io::{self, Write};
use std::time::Duration;

use postpone::App;
use serde::Serialize;

/// Options given before or after the command, read by every command.
#[derive(Debug)]
pub struct Context {
    /// The database URL or key=value string.
    pub database_url: String,
    /// Print JSON instead of tables.
    pub json: bool,
    /// Deadline of connecting and of every round-trip.
    pub timeout: Duration,
}

impl Context {
    /// Connects with the `--timeout` deadlines and a pool of two.
    pub fn connect(&self) -> Result<App, postpone::Error> {
        App::builder(self.database_url.clone())
            .pool_size(2)
            .connect_timeout(self.timeout)
            .io_timeout(self.timeout)
            .pool_timeout(self.timeout + Duration::from_secs(1))
            .build()
    }
}

/// Why the tool stopped.
#[derive(Debug)]
pub enum CliError {
    /// Bad arguments: clap's message (it starts with `error:` and shows the usage).
    Usage(clap::Error),
    /// A failed operation.
    Failed(String),
    /// Writing the output failed (a closed pipe, say).
    Output(io::Error),
}

impl From<postpone::Error> for CliError {
    fn from(e: postpone::Error) -> CliError {
        CliError::Failed(e.to_string())
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> CliError {
        CliError::Output(e)
    }
}

/// Writes `value` as pretty JSON and a newline.
pub fn json<T: Serialize + ?Sized>(out: &mut dyn Write, value: &T) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *out, value)
        .map_err(|e| CliError::Output(io::Error::other(e)))?;
    writeln!(out)?;
    Ok(())
}
