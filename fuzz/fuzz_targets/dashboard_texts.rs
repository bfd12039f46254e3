//! Texts the dashboard's access code reads on their own: redirect paths, base64 of basic
//! credentials, Host headers.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        postpone::fuzzing::auth_texts(s);
    }
});
