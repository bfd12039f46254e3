//! Who may see the dashboard and act on it: the token or basic auth, the local-host guard
//! against DNS rebinding, and the checks every POST action passes (read-only, origin, CSRF).

use super::*;

pub(super) fn check_auth(st: &State, req: &Request) -> Option<Response> {
    let auth = st.auth.as_ref()?;
    match auth {
        DashboardAuth::Token(token) => {
            let bearer = req
                .header("authorization")
                .and_then(|h| h.strip_prefix("Bearer "))
                .map(str::trim);
            let cookie = req.header("cookie").and_then(|c| {
                c.split(';').find_map(|kv| {
                    let (k, v) = kv.trim().split_once('=')?;
                    (k == TOKEN_COOKIE).then(|| crate::web::http::parse_pairs(&format!("v={v}")))
                })
            });
            let cookie = cookie.and_then(|p| p.into_iter().next()).map(|(_, v)| v);
            if bearer.is_some_and(|b| same(b, token))
                || cookie.as_deref().is_some_and(|c| same(c, token))
            {
                return None;
            }
            if let Some(t) = req.param("token") {
                if same(t, token) && req.method == "GET" {
                    // Keep it in a cookie and drop it from the address bar.
                    let rest: Vec<String> = req
                        .query
                        .iter()
                        .filter(|(k, _)| k != "token")
                        .map(|(k, v)| format!("{}={}", url_enc(k), url_enc(v)))
                        .collect();
                    let mut to = st.link(&local_path(&req.path));
                    if !rest.is_empty() {
                        to = format!("{to}?{}", rest.join("&"));
                    }
                    return Some(Response::redirect(to).header(
                        "Set-Cookie",
                        format!(
                            "{TOKEN_COOKIE}={}; HttpOnly; SameSite=Strict; Path={}/",
                            url_enc(token),
                            st.base
                        ),
                    ));
                }
            }
            Some(Response::text(
                401,
                "the dashboard needs its token: open it once with ?token=... or send \
                 Authorization: Bearer ...\n",
            ))
        }
        DashboardAuth::Basic { user, password } => {
            let ok = req
                .header("authorization")
                .and_then(|h| h.strip_prefix("Basic "))
                .and_then(|b| base64_decode(b.trim()))
                .and_then(|raw| String::from_utf8(raw).ok())
                .and_then(|pair| {
                    let (u, p) = pair.split_once(':')?;
                    // Both compared, whatever the first says.
                    Some(same(u, user) & same(p, password))
                })
                .unwrap_or(false);
            if ok {
                None
            } else {
                Some(
                    Response::text(401, "the dashboard needs a user name and password\n").header(
                        "WWW-Authenticate",
                        "Basic realm=\"postpone\", charset=\"UTF-8\"",
                    ),
                )
            }
        }
    }
}

/// `127.0.0.1:8080`, `[::1]:8080`, `localhost`, `10.0.0.5`: an address or localhost, with
/// or without a port.
pub(super) fn is_local_host(host: &str) -> bool {
    let digits = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit());
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').is_some_and(|(addr, tail)| {
            addr.parse::<std::net::Ipv6Addr>().is_ok()
                && (tail.is_empty() || tail.strip_prefix(':').is_some_and(digits))
        });
    }
    let name = match host.rsplit_once(':') {
        Some((h, port)) if digits(port) => h,
        _ => host,
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// A path of ours to redirect to: never `//host` (which a browser reads as another site).
pub(super) fn local_path(p: &str) -> String {
    let p = p.trim_start_matches('/');
    format!(
        "/{}",
        p.split('/').map(url_enc).collect::<Vec<_>>().join("/")
    )
}

/// Compares secrets in time independent of where they differ.
pub(super) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

pub(super) fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=').as_bytes();
    if s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= val(*c)? << (18 - 6 * i);
        }
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    Some(out)
}

// --- actions -------------------------------------------------------------------------

/// The refusal of a change (read-only, cross-origin, no or a stale form token), if any.
pub(super) fn refusal(st: &State, req: &Request) -> Option<Response> {
    if st.read_only {
        return Some(Response::text(
            403,
            "the dashboard is read-only: retry, cancel, abort, pause and resume are refused\n",
        ));
    }
    if let (Some(origin), Some(host)) = (req.header("origin"), req.header("host")) {
        let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
        if origin != "null" && origin_host != host {
            return Some(Response::text(403, "cross-origin request refused\n"));
        }
    }
    let form = req.form();
    let token = form
        .iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    if !same(token, &st.csrf) {
        return Some(Response::text(
            403,
            "missing or stale form token: reload the page and try again\n",
        ));
    }
    None
}

/// Pauses or resumes the queue named by the form's `queue` field (every queue without one),
/// then shows the overview again (its figures read afresh).
pub(super) fn act_queue(st: &State, req: &Request, action: &str) -> Result<Response, Error> {
    if let Some(r) = refusal(st, req) {
        return Ok(r);
    }
    let form = req.form();
    let queue = form
        .iter()
        .find(|(k, _)| k == "queue")
        .map(|(_, v)| v.as_str());
    let res = match (action, queue) {
        ("pause", Some(q)) => st.admin.pause(q).map(drop),
        ("resume", Some(q)) => st.admin.resume(q).map(drop),
        ("pause", None) => st.admin.pause_all().map(drop),
        ("resume", None) => st.admin.resume_all().map(drop),
        _ => return Ok(Response::text(404, "no such action\n")),
    };
    match res {
        Ok(()) => {
            *st.overview.lock().unwrap_or_else(|e| e.into_inner()) = None;
            Ok(Response::redirect(st.link("/")))
        }
        Err(e) if e.kind() == ErrorKind::InvalidInput => Ok(Response::text(400, format!("{e}\n"))),
        Err(e) => Err(e),
    }
}

pub(super) fn act(st: &State, req: &Request, id: JobId, action: &str) -> Result<Response, Error> {
    if let Some(r) = refusal(st, req) {
        return Ok(r);
    }
    let result = match action {
        "retry" => st.admin.retry(id).map(|()| "retried"),
        "cancel" => st.admin.cancel(id).map(|()| "cancelled"),
        "abort" => st.admin.abort(id).map(|o| match o {
            crate::AbortOutcome::Requested => "abort-requested",
            _ => "cancelled",
        }),
        _ => return Ok(Response::text(404, "no such action\n")),
    };
    match result {
        Ok(done) => Ok(Response::redirect(
            st.link(&format!("/jobs/{id}?done={done}")),
        )),
        // The status does not allow it, or another session holds the row (55P03: the admin
        // API gave up waiting): the job's page with the reason, as a conflict.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::InvalidState | ErrorKind::AlreadyEnqueued
            ) || e.sqlstate() == Some("55P03") =>
        {
            let mut resp = job(st, id, Some(&e.to_string()), None)?;
            resp.status = 409;
            Ok(resp)
        }
        Err(e) => Err(e),
    }
}

// --- pages ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
        assert!(!same("", "a"));
    }

    #[test]
    fn base64_decodes_basic_credentials() {
        assert_eq!(base64_decode("dXNlcjpwYXNz").unwrap(), b"user:pass");
        assert_eq!(base64_decode("YTpi").unwrap(), b"a:b");
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert!(base64_decode("***").is_none());
    }

    #[test]
    fn only_addresses_and_localhost_are_local_hosts() {
        for ok in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "[::1]:80",
            "localhost:8080",
            "LOCALHOST",
            "10.1.2.3:1",
        ] {
            assert!(is_local_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "[::1",
            "",
            "localhost.evil:80",
        ] {
            assert!(!is_local_host(bad), "{bad}");
        }
    }

    #[test]
    fn redirects_stay_on_this_site() {
        assert_eq!(local_path("//evil.example/x"), "/evil%2Eexample/x");
        assert_eq!(local_path("/jobs/1"), "/jobs/1");
    }
}
