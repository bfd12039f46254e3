//! `postpone dashboard`: serves the web dashboard until the process is stopped.
//!
//! Access control comes from the environment (`POSTPONE_DASHBOARD_TOKEN`, or
//! `POSTPONE_DASHBOARD_USER` with `POSTPONE_DASHBOARD_PASSWORD`), never from the command
//! line where other users of the machine could read it.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use postpone::{Dashboard, DashboardAuth};

use crate::context::{CliError, Context};
use crate::parse;

#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// Address to listen on (host:port; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    listen: String,
    /// Show the queue only: no retry, cancel or abort.
    #[arg(long)]
    read_only: bool,
    /// Requests served at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Lengthen every worker's lease to at least this: a worker is marked stalled once its
    /// last heartbeat is older than its own stalled_after, or than this when longer. Defaults
    /// to each worker's own.
    #[arg(long, value_parser = parse::duration, value_name = "DURATION")]
    stalled_after: Option<Duration>,
}

pub(crate) fn run(
    ctx: &Context,
    args: &DashboardArgs,
    out: &mut dyn Write,
) -> Result<ExitCode, CliError> {
    let timeout = ctx.timeout;
    let auth = DashboardAuth::from_env()?;
    let app = ctx
        .builder()
        .pool_size(u32::from(args.threads).min(16))
        .connect_timeout(timeout)
        .io_timeout(timeout)
        .pool_timeout(timeout + Duration::from_secs(1))
        .lazy(true)
        .build()?;
    let protected = auth.is_some();
    let handle = Dashboard::new(&app)
        .listen(args.listen.as_str())?
        .read_only(args.read_only)
        .auth(auth)
        .threads(usize::from(args.threads))
        .stalled_after(args.stalled_after.unwrap_or_default())
        .spawn()?;
    if !protected && !handle.addr().ip().is_loopback() {
        // Other machines can reach it, and nothing asks them who they are.
        eprintln!(
            "postpone dashboard: warning: no access control on {}: anyone who can reach it \
             sees every job{}; set POSTPONE_DASHBOARD_TOKEN (or POSTPONE_DASHBOARD_USER and \
             POSTPONE_DASHBOARD_PASSWORD){}",
            handle.addr(),
            if args.read_only {
                ""
            } else {
                " and can retry, cancel and delete jobs"
            },
            if args.read_only {
                ""
            } else {
                ", or add --read-only"
            }
        );
    }
    writeln!(
        out,
        "postpone dashboard on {}{}{} (Ctrl-C stops it)",
        handle.url(),
        if args.read_only { ", read-only" } else { "" },
        if protected { ", access protected" } else { "" }
    )?;
    out.flush()?;
    handle.wait();
    Ok(ExitCode::SUCCESS)
}
