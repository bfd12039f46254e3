//! The dashboard mounted under `/admin/queue` in a program's own web server (tiny_http
//! here; any server that hands over a method, a path, headers and a body will do), beside
//! the program's own pages.
//!
//! ```sh
//! cargo run --example mounted          # then open http://127.0.0.1:8081/admin/queue/
//! ```
//!
//! The dashboard has no access control of its own here: it answers requests addressed to
//! 127.0.0.1 or localhost only. Behind the program's own login, add `.any_host(true)`.

use std::io::Read;

use postpone::{App, Dashboard, DashboardRequest};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let app = App::connect(&url)?;
    app.migrate()?;
    let dashboard = Dashboard::new(&app).base_path("/admin/queue").handler()?;
    let addr = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:8081".to_owned());
    let server = tiny_http::Server::http(&addr).map_err(|e| format!("listening on {addr}: {e}"))?;
    println!("serving http://{addr}/ with the dashboard under http://{addr}/admin/queue/");
    // One thread per request here for brevity; a real program uses its server's pool.
    for mut request in server.incoming_requests() {
        let dashboard = dashboard.clone();
        std::thread::spawn(move || {
            if !request.url().starts_with("/admin/queue") {
                let page = tiny_http::Response::from_string("the program's own page\n");
                let _ = request.respond(page);
                return;
            }
            let mut req = DashboardRequest::new(request.method().as_str(), request.url());
            for h in request.headers() {
                req = req.header(h.field.as_str().as_str(), h.value.as_str());
            }
            // The dashboard reads at most 64 KiB of a body (its forms are small).
            let mut body = Vec::new();
            let _ = request
                .as_reader()
                .take(64 * 1024 + 1)
                .read_to_end(&mut body);
            let resp = dashboard.handle(req.body(body));
            let headers = resp
                .headers()
                .iter()
                .filter_map(|(k, v)| tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).ok())
                .collect();
            let (status, len) = (resp.status(), resp.len());
            // The body is read as tiny_http writes it: a job's raw arguments stream from
            // the database 256 KiB at a time.
            let reply = tiny_http::Response::new(
                status.into(),
                headers,
                resp.into_body(),
                Some(len as usize),
                None,
            );
            let _ = request.respond(reply);
        });
    }
    Ok(())
}
