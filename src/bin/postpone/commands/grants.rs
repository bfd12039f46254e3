//! `postpone grants ROLE --for PART`: print the SQL that gives a database role what one
//! part of a deployment needs (see docs/roles.md). It reads the installed schema's
//! catalogue and changes nothing: pipe the output into `psql` as the objects' owner.

use std::io::Write;

use clap::{Args, ValueEnum};
use postpone::GrantsFor;

use crate::context::{json, CliError, Context};

#[derive(Debug, Args)]
pub struct GrantsArgs {
    /// The database role to grant to (created beforehand, e.g. `CREATE ROLE ... LOGIN`).
    pub role: String,
    /// The part the role plays (see docs/roles.md).
    #[arg(long = "for", value_enum, value_name = "PART")]
    pub part: Part,
}

/// The parts, as the command line names them.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Part {
    // Owns postpone's objects; runs `migrate`.
    Migrator,
    // Runs workers: claims, records outcomes, heartbeats, defers; no DDL, owns nothing.
    Worker,
    // Defers jobs (from Rust or `postpone_defer`) and nothing else.
    Producer,
    // Reads everything, changes nothing (the dashboard's read-only mode, stats).
    Reader,
}

impl From<Part> for GrantsFor {
    fn from(p: Part) -> GrantsFor {
        match p {
            Part::Migrator => GrantsFor::Migrator,
            Part::Worker => GrantsFor::Worker,
            Part::Producer => GrantsFor::Producer,
            Part::Reader => GrantsFor::Reader,
        }
    }
}

pub fn run(ctx: &Context, a: &GrantsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let part = GrantsFor::from(a.part);
    let app = ctx.connect_unchecked()?;
    let sql = app.admin().grants(&a.role, part)?;
    if ctx.json {
        return json(
            out,
            &serde_json::json!({"role": a.role, "for": part.name(), "sql": sql}),
        );
    }
    write!(out, "{sql}")?;
    Ok(())
}
