//! Raw HTTP requests through the dashboard's parser (src/web/http.rs: head, query string,
//! form body) and its access checks (src/web/pages/auth.rs: token, cookie, basic auth,
//! Host, origin, CSRF).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    postpone::fuzzing::http_request(data);
});
