//! `postpone migrate`: install or upgrade the schema.

use postpone::App;
use serde::Serialize;
use std::io::Write;

use crate::context::{json, CliError, Context};

pub fn run(ctx: &Context, app: &App, out: &mut dyn Write) -> Result<(), CliError> {
    let applied = app.migrate()?;
    let version = app.schema_version()?.unwrap_or(0);
    if ctx.json {
        #[derive(Serialize)]
        struct Migrated {
            applied: Vec<i32>,
            version: i32,
        }
        json(out, &Migrated { applied, version })?;
    } else if applied.is_empty() {
        writeln!(out, "schema is up to date (version {version})")?;
    } else {
        let list: Vec<String> = applied.iter().map(i32::to_string).collect();
        writeln!(
            out,
            "applied migration(s) {}; schema is at version {version}",
            list.join(", ")
        )?;
    }
    Ok(())
}
