//! Cron expressions and time zone names as periodic tasks read them (src/periodic.rs):
//! input is `expression 0xFF zone 0xFF start`, the start as 8 little-endian bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let f = postpone::fuzzing::fields(data, 3);
    let mut start = [0u8; 8];
    for (i, b) in f[2].bytes().take(8).enumerate() {
        start[i] = b;
    }
    postpone::fuzzing::schedule(&f[0], &f[1], u64::from_le_bytes(start));
});
