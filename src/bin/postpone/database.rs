//! Which database a command uses: `--database-url`, `DATABASE_URL`, or libpq's `PG*`
//! variables over the defaults; and how it is named in messages (without the password).

/// Which database to use, as libpq would: `--database-url` or `DATABASE_URL` if given
/// (with `PGPASSWORD` and `PGSSLMODE` filling in what it does not say), else `PGHOST`,
/// `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE` over the defaults
/// `127.0.0.1`, `5432`, `postgres`, and a database named as the user.
pub fn resolve(
    given: Option<String>,
    from_flag: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> (String, &'static str) {
    let var = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(url) = given {
        let source = if from_flag {
            "--database-url"
        } else {
            "DATABASE_URL"
        };
        let mut url = url;
        for (key, var_name) in [("password", "PGPASSWORD"), ("sslmode", "PGSSLMODE")] {
            if let Some(v) = var(var_name) {
                url = with_param(&url, key, &v);
            }
        }
        return (url, source);
    }
    let any = [
        "PGHOST",
        "PGPORT",
        "PGUSER",
        "PGPASSWORD",
        "PGDATABASE",
        "PGSSLMODE",
    ]
    .iter()
    .any(|k| var(k).is_some());
    let user = var("PGUSER").unwrap_or_else(|| "postgres".to_owned());
    let mut s = format!(
        "host={} port={} user={} dbname={}",
        quote(&var("PGHOST").unwrap_or_else(|| "127.0.0.1".to_owned())),
        quote(&var("PGPORT").unwrap_or_else(|| "5432".to_owned())),
        quote(&user),
        quote(&var("PGDATABASE").unwrap_or_else(|| user.clone())),
    );
    if let Some(p) = var("PGPASSWORD") {
        s.push_str(&format!(" password={}", quote(&p)));
    }
    if let Some(m) = var("PGSSLMODE") {
        s.push_str(&format!(" sslmode={}", quote(&m)));
    }
    (s, if any { "PG* environment" } else { "default" })
}

/// A key=value value, quoted as libpq reads it when it needs quotes.
fn quote(v: &str) -> String {
    let plain = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:".contains(&b));
    if plain {
        v.to_owned()
    } else {
        format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

/// `url` with `key` set to `v`, unless it sets `key` (or a password in its userinfo) already.
fn with_param(url: &str, key: &str, v: &str) -> String {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if !is_url {
        let has = url
            .split_whitespace()
            .any(|kv| kv.split('=').next().map(str::trim) == Some(key));
        return if has {
            url.to_owned()
        } else {
            format!("{url} {key}={}", quote(v))
        };
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    if query.split('&').any(|kv| kv.split('=').next() == Some(key)) {
        return url.to_owned();
    }
    if key == "password" {
        let authority = base
            .split_once("://")
            .map_or("", |(_, r)| r.split('/').next().unwrap_or(""));
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            if userinfo.contains(':') {
                return url.to_owned();
            }
        }
    }
    let enc: String = v
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let sep = if query.is_empty() { "?" } else { "&" };
    format!("{url}{sep}{key}={enc}")
}

/// `user@host:port/db` of a connection string, without its password; the string itself
/// when it does not parse (the connection then fails and says why).
pub fn describe(conn: &str) -> String {
    match conn.parse::<tokio_postgres::Config>() {
        Ok(c) => {
            let hosts: Vec<String> = c
                .get_hosts()
                .iter()
                .map(|h| match h {
                    tokio_postgres::config::Host::Tcp(n) => n.clone(),
                    tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                })
                .collect();
            let port = c.get_ports().first().copied().unwrap_or(5432);
            format!(
                "{}@{}:{port}/{}",
                c.get_user().unwrap_or(""),
                hosts.join(","),
                c.get_dbname().unwrap_or("")
            )
        }
        Err(_) => "(unparsable connection string)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn libpq_variables_fill_in_what_is_not_given() {
        let (s, src) = resolve(None, false, &env(&[]));
        assert_eq!(s, "host=127.0.0.1 port=5432 user=postgres dbname=postgres");
        assert_eq!(src, "default");
        let (s, src) = resolve(
            None,
            false,
            &env(&[
                ("PGHOST", "db"),
                ("PGUSER", "ada"),
                ("PGPASSWORD", "it's"),
                ("PGSSLMODE", "require"),
            ]),
        );
        assert_eq!(
            s,
            "host=db port=5432 user=ada dbname=ada password='it\\'s' sslmode=require"
        );
        assert_eq!(src, "PG* environment");
        assert_eq!(describe(&s), "ada@db:5432/ada");
        let vars = [("PGPASSWORD", "p w"), ("PGSSLMODE", "disable")];
        let (s, src) = resolve(Some("postgres://u@h/d".into()), true, &env(&vars));
        assert_eq!(s, "postgres://u@h/d?password=p%20w&sslmode=disable");
        assert_eq!(src, "--database-url");
        let (s, _) = resolve(
            Some("postgres://u:x@h/d?sslmode=require".into()),
            false,
            &env(&vars),
        );
        assert_eq!(s, "postgres://u:x@h/d?sslmode=require");
        let (s, _) = resolve(Some("host=h password=x".into()), false, &env(&vars));
        assert_eq!(s, "host=h password=x sslmode=disable");
    }
}
