//! `postpone healthcheck`: exit 0 if the database answers and its schema is current, else 1.

use std::process::ExitCode;

use serde::Serialize;
use std::io::Write;

use crate::context::{json, CliError, Context};

pub fn run(ctx: &Context, out: &mut dyn Write) -> Result<ExitCode, CliError> {
    #[derive(Serialize)]
    struct Health {
        healthy: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        schema_version: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    }
    let res = ctx.connect().and_then(|app| app.admin().check_schema());
    let health = match res {
        Ok(v) => Health {
            healthy: true,
            schema_version: Some(v),
            error: None,
        },
        Err(e) => Health {
            healthy: false,
            schema_version: None,
            error: Some(e.to_string()),
        },
    };
    if ctx.json {
        json(out, &health)?;
    } else if let Some(e) = &health.error {
        writeln!(out, "unhealthy: {e}")?;
    } else {
        writeln!(
            out,
            "ok: database answers, schema version {}",
            health.schema_version.unwrap_or(0)
        )?;
    }
    Ok(if health.healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
