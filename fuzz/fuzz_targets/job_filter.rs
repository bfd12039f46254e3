//! Job filters as the CLI and the dashboard build them from texts (src/admin/filter.rs):
//! sort, statuses, queue, task, lock, error text, tag, id, cursor, split at 0xFF.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    postpone::fuzzing::job_filter(&postpone::fuzzing::fields(data, 9));
});
