//! The integration suite: one test binary for every test that can share a process with the
//! others (its own database each, no process-wide counters, loggers, child re-runs of the
//! test binary or server settings). Those that cannot stay binaries of their own beside this
//! directory: `admin`, `async_runtime`, `conn`, `support_selftest`, `web_limits`,
//! `worker_recovery` and `worker_shutdown` count the process's sockets, threads or file
//! descriptors; `chaos`, `netns`, `pgbouncer` and `worker_rescue` re-run the test binary as
//! child processes; `fleet` and `roles` install loggers of their own; `metrics` and
//! `tracing` install global recorders (and need their features); `tls` and `failover` change
//! server settings; `cli` needs the `cli` feature; `web_browser` drives Chromium.
//!
//! Run one module with `cargo test --test suite flow::`, one test with its name.
//!
//! Table of contents, by the promises of ../shared/DESIGN.md and by surface:

#[path = "../support/mod.rs"]
mod support;
#[path = "../web_util/mod.rs"]
mod web_util;
#[path = "../worker_util/mod.rs"]
mod worker_util;

// Queue semantics (promise 5): order, priority, scheduling, locks, limits, flow control; the
// claim's byte budget.
mod claim_bytes;
mod claim_walk;
mod compression;
mod defer;
mod flow;
mod limits;
mod parked;
mod prune_groups;
mod prune_plan;
mod rates;
mod rates_admin;
mod scheduled;
mod unique;
mod worker_queue;

// Nothing lost, fenced attempts, nothing wedges, the database is the truth (promises 4, 7-9).
mod bad_rows;
mod integrity;
mod locked;
mod ride;
mod share;
mod split;

// Claimed is not started (promise 10); leases, deploys and shutdowns (promises 11, 12).
mod claimed;
mod deploy;

// Clear errors on bad input (promise 6), and every parser fed generated input; bounded inputs.
mod args_limit;
mod args_text;
mod bad_inputs;
mod fuzz_props;
mod stats_waits;

// Coordination and results: batches, dependencies, workflows, deadlines (jobs that expire),
// waiting.
mod batches;
mod dependencies;
mod expiry;
mod expiry_backlog;
mod wait;
mod workflows;

// Tasks as users write them, and their tests.
mod task_errors;
mod testing;
mod typed;

// The schema: migrations, upgrades under load, the present files, lean claims, vacuum.
mod lean;
mod migrate;
mod migrate_v1_live;
mod schema_present;
mod vacuum;

// Surfaces: SQL, namespaces (schemas), periodic schedules, the dashboard over HTTP, async callers.
mod async_web;
mod namespaces;
mod periodic;
mod schedules;
mod sql_defer;
mod web;
