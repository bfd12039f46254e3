//! Connection strings (URL and key=value) as `App::connect` reads them: options.rs,
//! session_attrs.rs (target_session_attrs, load balancing), the TLS parameters.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        postpone::fuzzing::connection_string(s);
    }
});
