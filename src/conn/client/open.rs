//! Opening a connection: each target of the connection string in turn, the socket, TLS,
//! the startup exchange and the target session attributes, all under `connect_timeout`.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_postgres::tls::TlsConnect;

use super::*;

impl Connection {
    /// Opens a connection: each target of the connection string in turn, each attempt under
    /// `connect_timeout` (and never past `overall`), its socket registered in `group` of the
    /// watchdog from before the first byte.
    pub(crate) fn open(
        opts: &Arc<ConnectOptions>,
        watchdog: &Watchdog,
        group: u64,
        overall: Option<Instant>,
    ) -> Result<Connection> {
        Self::open_within(
            opts,
            watchdog,
            group,
            overall.map(|d| (d, "shutdown timeout")),
        )
    }

    /// [`open`](Self::open), with the overall deadline named for errors (`pool_timeout`).
    pub(crate) fn open_within(
        opts: &Arc<ConnectOptions>,
        watchdog: &Watchdog,
        group: u64,
        overall: Option<(Instant, &str)>,
    ) -> Result<Connection> {
        let rt = ConnRuntime::new()?;
        let first = socket::attempt_deadline(opts.connect_timeout, overall);
        let severs = watchdog.sever_count(group);
        let severed = || watchdog.sever_count(group) != severs;
        let mut rt = Some(rt);
        let mut last = None;
        // Host by host, as libpq: each name resolved when its turn comes, under a deadline
        // of its own, then each of its addresses tried under its own. One pass over the hosts
        // per kind of server target_session_attrs wants (two for prefer-standby), in random
        // order for load_balance_hosts=random.
        let mut hosts: Vec<usize> = (0..socket::host_count(opts)).collect();
        if opts.routing.random {
            session_attrs::shuffle(&mut hosts);
        }
        let passes = opts.routing.attrs.passes();
        for (i, want) in passes
            .iter()
            .flat_map(|want| hosts.iter().map(move |i| (*i, *want)))
        {
            let deadline = socket::attempt_deadline(opts.connect_timeout, overall);
            if Instant::now() >= deadline.at {
                break;
            }
            let mut targets = match socket::resolve_host(opts, i, &deadline, &severed) {
                Ok(t) => t,
                Err(e) if e.kind() == ErrorKind::Shutdown => return Err(e),
                Err(e) => {
                    log::debug!("{e}");
                    last = Some(e);
                    continue;
                }
            };
            if opts.routing.random {
                session_attrs::shuffle(&mut targets);
            }
            for target in &targets {
                let deadline = socket::attempt_deadline(opts.connect_timeout, overall);
                if Instant::now() >= deadline.at {
                    break;
                }
                let runtime = match rt.take() {
                    Some(r) => r,
                    None => ConnRuntime::new()?,
                };
                match Self::open_target(runtime, opts, target, watchdog, group, &deadline)
                    .and_then(|conn| conn.settle(want, opts.routing.attrs, &deadline))
                    .and_then(|conn| conn.enter_namespace(opts, &deadline))
                {
                    Ok(conn) => return Ok(conn),
                    Err(e) if e.kind() == ErrorKind::Shutdown => return Err(e),
                    Err(e) => {
                        log::debug!("{e}");
                        last = Some(e);
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            Error::new(
                ErrorKind::Timeout,
                format!(
                    "connecting to {}: no answer within {}",
                    opts.describe(),
                    first.name
                ),
            )
        }))
    }

    fn open_target(
        rt: ConnRuntime,
        opts: &Arc<ConnectOptions>,
        target: &Target,
        watchdog: &Watchdog,
        group: u64,
        deadline: &socket::Deadline,
    ) -> Result<Connection> {
        let label = target.to_string();
        let mut with_check = opts.wants_check_interval(&label);
        let mut plain = false;
        loop {
            let (stream, reg) = socket::connect(&rt, opts, target, watchdog, group, deadline)?;
            let mut config = opts.config.clone();
            if with_check {
                let options = match config.get_options() {
                    Some(o) if !o.is_empty() => format!(
                        "{o} -c client_connection_check_interval={}",
                        opts.check_interval_ms()
                    ),
                    _ => format!(
                        "-c client_connection_check_interval={}",
                        opts.check_interval_ms()
                    ),
                };
                config.options(options);
            }
            let connector = if plain {
                None
            } else {
                opts.tls.connector(target)?
            };
            let over_tls = connector.is_some();
            let result = match connector {
                None => {
                    // No TLS for this target (sslmode=disable, or a Unix socket, where libpq
                    // does not use TLS either): do not even ask the server for it.
                    config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                    handshake(
                        &rt,
                        &reg,
                        &config,
                        stream,
                        tokio_postgres::NoTls,
                        deadline.at,
                    )
                }
                Some(tls) => {
                    let watch = tls.watch();
                    handshake(&rt, &reg, &config, stream, tls, deadline.at)
                        .map_err(|e| watch.explain(e))
                }
            };
            match result {
                Ok((client, notifications)) => {
                    let cancel = CancelRoute {
                        opts: opts.clone(),
                        target: target.clone(),
                        plain: !over_tls,
                        token: client.cancel_token(),
                        watchdog: watchdog.clone(),
                        group,
                    };
                    return Ok(Connection {
                        statements: HashMap::new(),
                        unnamed: opts.routing.transaction_pooler.then(HashMap::new),
                        client,
                        inner: Inner {
                            notifications,
                            rt,
                            reg,
                            io_timeout: opts.io_timeout,
                            deadline: None,
                            touched: false,
                            listening: false,
                            search_path: None,
                            broken: None,
                            in_tx: false,
                            last_ok: Instant::now(),
                            peer: target.to_string(),
                            cancel,
                            in_flight: false,
                            unanswered_since: None,
                        },
                    });
                }
                Err(e) => {
                    reg.sever();
                    if with_check && refuses_our_options(&e) {
                        log::warn!(
                            "server at {target} refuses our startup options ({e}); connecting \
                             without client_connection_check_interval (a severed client may keep \
                             its backend until the server notices)"
                        );
                        opts.disable_check_interval(&label);
                        with_check = false;
                        continue;
                    }
                    if e.kind() == ErrorKind::Tls
                        && !plain
                        && opts.tls.falls_back_to_plain()
                        && reg.severed() == SeverReason::Local
                        && Instant::now() < deadline.at
                    {
                        log::warn!(
                            "connecting to {target}: {e}; sslmode=prefer, so trying again in \
                             plain text (give sslrootcert, or sslmode=require, to refuse that)"
                        );
                        plain = true;
                        continue;
                    }
                    let e = match reg.severed() {
                        SeverReason::Shutdown => Error::new(
                            ErrorKind::Shutdown,
                            format!("connecting to {target}: connection severed by shutdown"),
                        ),
                        _ => e,
                    };
                    return Err(if e.kind() == ErrorKind::Timeout {
                        Error::new(
                            ErrorKind::Timeout,
                            format!(
                                "connecting to {target}: {e} got no answer within {}",
                                deadline.name
                            ),
                        )
                    } else {
                        e.context(format_args!("connecting to {target}"))
                    });
                }
            }
        }
    }
}

/// A startup refusal caused by the `options` parameter we add: a server that does not know
/// `client_connection_check_interval` (before 14) names it; a pooler that takes no
/// `options` at all (PgBouncer before 1.20: `unsupported startup parameter: options`) names
/// that.
fn refuses_our_options(e: &Error) -> bool {
    if !matches!(e.kind(), ErrorKind::Database | ErrorKind::Connect) {
        return false;
    }
    let text = e.to_string();
    text.contains("client_connection_check_interval")
        || (text.contains("options")
            && (text.contains("startup parameter") || e.sqlstate() == Some("08P01")))
}

/// TLS negotiation (if any) and the startup/auth exchange, under `deadline`; then the driver
/// task that forwards notifications.
fn handshake<T>(
    rt: &ConnRuntime,
    reg: &Registration,
    config: &tokio_postgres::Config,
    stream: Stream,
    tls: T,
    deadline: Instant,
) -> Result<(Client, Inbox)>
where
    T: TlsConnect<Stream> + Send + 'static,
    T::Stream: Send + 'static,
    T::Future: Send,
{
    let wait = deadline.saturating_duration_since(Instant::now());
    reg.arm(deadline);
    let res =
        rt.block_on(async { tokio::time::timeout(wait, config.connect_raw(stream, tls)).await });
    reg.disarm();
    let res = res?;
    let (client, mut connection) = match res {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => {
            if let Some(db) = e.as_db_error() {
                let code = db.code().code().to_owned();
                if code == "3D000" {
                    // The server's own text may be translated (lc_messages): ours names
                    // the database as the connection string gives it (the user name when
                    // it gives none, as the server reads it).
                    let name = config.get_dbname().or(config.get_user()).unwrap_or("");
                    return Err(Error::new(
                        ErrorKind::DatabaseMissing,
                        format!(
                            "database {name:?} does not exist; create it or check the URL [SQLSTATE {code}]"
                        ),
                    )
                    .set_sqlstate(&code));
                }
                if let Some(remedy) = crate::error::refusal_remedy(&code) {
                    return Err(Error::new(
                        ErrorKind::Connect,
                        format!(
                            "the server refused the connection: {}: {} [SQLSTATE {code}] ({remedy})",
                            db.severity(),
                            db.message()
                        ),
                    )
                    .set_sqlstate(&code));
                }
                let kind = if code == "28000" || code == "28P01" {
                    ErrorKind::Connect
                } else {
                    ErrorKind::Database
                };
                return Err(Error::new(
                    kind,
                    format!("{}: {} [SQLSTATE {code}]", db.severity(), db.message()),
                )
                .set_sqlstate(&code));
            }
            return Err(Error::with_source(ErrorKind::Connect, String::new(), e));
        }
        Err(_) => return Err(Error::new(ErrorKind::Timeout, "startup handshake")),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let gauge = std::sync::Arc::new(NotifyGauge::default());
    let counted = gauge.clone();
    rt.spawn(async move {
        let end = std::future::poll_fn(|cx| loop {
            match connection.poll_message(cx) {
                Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => {
                    let n = Notification {
                        channel: n.channel().to_owned(),
                        payload: n.payload().to_owned(),
                        process_id: n.process_id(),
                    };
                    if !counted.arrived(&n) {
                        // A flood: ending the driver closes the socket, and the round-trip
                        // waiting behind the notifications fails as closed.
                        log::debug!("connection dropped: a flood of notifications");
                        return Poll::Ready(Ok(()));
                    }
                    let _ = tx.send(n);
                }
                Poll::Ready(Some(Ok(AsyncMessage::Notice(n)))) => {
                    log::debug!("server notice: {}: {}", n.severity(), n.message());
                }
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        })
        .await;
        if let Err(e) = end {
            log::debug!("connection ended: {e}");
        }
    });
    Ok((client, Inbox { rx, gauge }))
}
