//! `postpone migrate`: install or upgrade the schema within `--timeout`, or print its SQL.

use std::io::Write;

use clap::Args;

use crate::context::{json, CliError, Context};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Print the SQL of the missing migrations instead of running it (for a DBA).
    #[arg(long)]
    pub print: bool,
    /// With --print: every migration, without connecting.
    #[arg(long, requires = "print")]
    pub all: bool,
    /// Record postpone tables that exist without a migration record, if they match this
    /// postpone's schema exactly.
    #[arg(long, conflicts_with = "print")]
    pub adopt: bool,
}

pub fn run(ctx: &Context, a: &MigrateArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if a.print && a.all {
        let sql = match &ctx.schema {
            Some(s) => postpone::Admin::migration_script_all_in(s)?,
            None => postpone::Admin::migration_script_all(),
        };
        write!(out, "{sql}")?;
        return Ok(());
    }
    let app = ctx.connect_unchecked()?;
    let admin = app.admin();
    if a.print {
        write!(out, "{}", admin.migration_sql()?)?;
        return Ok(());
    }
    if a.adopt {
        let v = admin.adopt_schema()?;
        if ctx.json {
            json(out, &serde_json::json!({"adopted": true, "version": v}))?;
        } else {
            writeln!(
                out,
                "adopted the existing tables: schema recorded at version {v}"
            )?;
        }
        return Ok(());
    }
    let r = admin.migrate(ctx.timeout)?;
    if ctx.json {
        json(out, &r)?;
    } else if r.applied.is_empty() {
        writeln!(out, "schema is up to date (version {})", r.version)?;
    } else {
        let list: Vec<String> = r.applied.iter().map(i32::to_string).collect();
        writeln!(
            out,
            "applied migration(s) {}; schema is at version {}",
            list.join(", "),
            r.version
        )?;
    }
    Ok(())
}
