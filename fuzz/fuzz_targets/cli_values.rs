//! The CLI's value parsers (src/bin/postpone/parse.rs, included as it is): durations,
//! RFC 3339 times and ages, job ids, statuses.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../src/bin/postpone/parse.rs"]
mod parse;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    if let Ok(d) = parse::duration(&s) {
        // A duration prints back (as whole milliseconds) to one that parses the same.
        let ms = d.as_millis();
        if ms <= u128::from(u64::MAX) && d.subsec_nanos() % 1_000_000 == 0 {
            assert_eq!(parse::duration(&format!("{ms}ms")), Ok(d), "{s:?}");
        }
    }
    let _ = parse::time(&s);
    let _ = parse::time_or_age(&s);
    let _ = parse::job_id(&s);
    let _ = parse::status(&s);
    let _ = parse::finished_status(&s);
    postpone::fuzzing::ids_and_statuses(&s);
});
