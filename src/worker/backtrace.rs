//! Backtraces of tasks' panics. `catch_unwind` hands back the panic's payload, not its stack:
//! the stack exists only while the panic hook runs. So a hook of ours, installed once when
//! the first worker spawns and chained to the hook that was there before (which still runs:
//! the panic is printed as usual), captures a backtrace on the threads that asked for one
//! (an executor running a task, see [`capturing`]) and leaves it in a thread-local for the
//! executor to take once `catch_unwind` returns. Every other panic of the process goes
//! straight to the previous hook.
//!
//! The backtrace is appended to the error the attempt records, after [`MARK`]
//! (`task panicked: ...\n\nbacktrace:\n   7: app::tasks::resize ...`), so every view of the
//! error (the dashboard shows it collapsed, `postpone job --full`, the admin API's
//! [`AttemptError::backtrace`](crate::AttemptError::backtrace)) has it. Only the task's own
//! frames are kept (those between the panic machinery and `catch_unwind`), at most
//! [`MAX_BYTES`]; the whole error stays within
//! [`MAX_ERROR_BYTES`](crate::limits::MAX_ERROR_BYTES).
//!
//! Captured unless `RUST_LIB_BACKTRACE` (or, when it is not set, `RUST_BACKTRACE`) is `0`,
//! as the standard library reads them, read when the first worker spawns. A program that
//! installs its own panic hook after its first worker spawned replaces ours: its tasks'
//! panics are then recorded without a backtrace.

use std::backtrace::{Backtrace, BacktraceStatus};
use std::cell::{Cell, RefCell};
use std::sync::Once;

/// What separates a panic's message from its backtrace in a recorded error.
pub(crate) use crate::admin::info::BACKTRACE_MARK as MARK;

/// Bytes of backtrace an error keeps, at most.
pub(crate) const MAX_BYTES: usize = 8 * 1024;

thread_local! {
    /// Set while this thread runs a task: its panics are captured.
    static WANTED: Cell<bool> = const { Cell::new(false) };
    /// The backtrace of this thread's last panic while `WANTED`.
    static CAPTURED: RefCell<Option<Backtrace>> = const { RefCell::new(None) };
}

/// Whether the environment turns backtraces off (`RUST_LIB_BACKTRACE=0`, or
/// `RUST_BACKTRACE=0` without it).
fn disabled(lib: Option<&str>, any: Option<&str>) -> bool {
    match (lib, any) {
        (Some(v), _) => v == "0",
        (None, Some(v)) => v == "0",
        (None, None) => false,
    }
}

/// Installs the hook, once per process (a no-op when backtraces are turned off).
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let lib = std::env::var("RUST_LIB_BACKTRACE").ok();
        let any = std::env::var("RUST_BACKTRACE").ok();
        if disabled(lib.as_deref(), any.as_deref()) {
            return;
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if WANTED.with(Cell::get) {
                let bt = Backtrace::force_capture();
                CAPTURED.with(|c| *c.borrow_mut() = Some(bt));
            }
            previous(info);
        }));
    });
}

/// Runs `f` (a task under `catch_unwind`) with this thread's panics captured; returns its
/// result and the backtrace of its last panic, formatted and cut ([`trim`]), if there was
/// one and the hook is ours.
pub(crate) fn capturing<R>(f: impl FnOnce() -> R) -> (R, Option<String>) {
    CAPTURED.with(|c| c.borrow_mut().take());
    WANTED.with(|w| w.set(true));
    let r = f();
    WANTED.with(|w| w.set(false));
    let bt = CAPTURED.with(|c| c.borrow_mut().take());
    let text = bt
        .filter(|b| b.status() == BacktraceStatus::Captured)
        .map(|b| trim(&b.to_string(), MAX_BYTES));
    (r, text)
}

/// The frames of a formatted backtrace that belong to the task: past the last frame of the
/// panic machinery (this hook, `std::panicking`, `core::panicking`) and before
/// `catch_unwind`'s; all of them when neither is found (no symbols). Cut at a line boundary
/// to at most `max` bytes, saying how many lines were left out.
pub(crate) fn trim(text: &str, max: usize) -> String {
    // Frames: a line "  12: name", then "at file:line" lines.
    let mut frames: Vec<Vec<&str>> = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let starts_frame = t
            .split_once(": ")
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        match frames.last_mut() {
            Some(f) if !starts_frame => f.push(line),
            _ => frames.push(vec![line]),
        }
    }
    let name = |f: &Vec<&str>| -> String {
        f.first()
            .and_then(|l| l.trim_start().split_once(": "))
            .map_or(String::new(), |(_, n)| n.to_owned())
    };
    let bottom = frames
        .iter()
        .position(|f| {
            let n = name(f);
            n.contains("std::panicking::try")
                || n.contains("std::panicking::catch_unwind")
                || n.contains("std::panic::catch_unwind")
                || n.contains("__rust_try")
                || n.starts_with("do_call<")
                || n.starts_with("catch_unwind<")
        })
        .unwrap_or(frames.len());
    let top = frames[..bottom]
        .iter()
        .rposition(|f| {
            let n = name(f);
            n.starts_with("std::panicking::")
                || n.starts_with("core::panicking::")
                || n.contains("rust_begin_unwind")
                || n.contains("__rust_end_short_backtrace")
                || n.contains("worker::backtrace::")
        })
        .map_or(0, |i| i + 1);
    let kept = if top < bottom {
        &frames[top..bottom]
    } else {
        &frames[..]
    };
    let lines: Vec<&str> = kept.iter().flatten().copied().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        if out.len() + line.len() + 1 > max.saturating_sub(40) {
            out.push_str(&format!("... ({} more lines)", lines.len() - i));
            return out;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.truncate(out.trim_end().len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_turns_backtraces_off_as_std_reads_it() {
        assert!(!disabled(None, None));
        assert!(disabled(Some("0"), None));
        assert!(disabled(None, Some("0")));
        assert!(!disabled(Some("1"), Some("0")));
        assert!(disabled(Some("0"), Some("1")));
    }

    #[test]
    fn only_the_tasks_frames_are_kept_and_the_text_is_cut() {
        let text = "   0: std::backtrace::Backtrace::force_capture
             at /rustc/library/std/src/backtrace.rs:312:9
   1: postpone::worker::backtrace::install::{{closure}}
   2: std::panicking::rust_panic_with_hook
   3: core::panicking::panic_fmt
   4: app::tasks::resize
             at ./src/tasks.rs:12:5
   5: postpone::worker::exec::run::{{closure}}
   6: std::panicking::try
   7: main";
        assert_eq!(
            trim(text, 1000),
            "   4: app::tasks::resize\n             at ./src/tasks.rs:12:5\n   5: postpone::worker::exec::run::{{closure}}"
        );
        // Without symbols, every frame.
        let bare = "   0: <unknown>\n   1: <unknown>";
        assert_eq!(trim(bare, 1000), bare);
        let long = (0..1000)
            .map(|i| format!("  {i}: f{i}"))
            .collect::<Vec<_>>()
            .join("\n");
        let cut = trim(&long, 2000);
        assert!(cut.len() <= 2000, "{}", cut.len());
        assert!(cut.ends_with("more lines)"), "{cut}");
    }

    #[test]
    fn a_panic_under_capturing_leaves_its_backtrace_and_others_do_not() {
        install();
        let (r, bt) = capturing(|| std::panic::catch_unwind(|| panic!("kaput")));
        assert!(r.is_err());
        // Another hook may have replaced ours in this test binary; when ours ran, the
        // backtrace names this test.
        if let Some(bt) = bt {
            assert!(bt.len() <= MAX_BYTES);
            assert!(!bt.contains("rust_panic_with_hook"), "{bt}");
        }
        let (r, bt) = capturing(|| 7);
        assert_eq!((r, bt), (7, None));
        let _ = std::panic::catch_unwind(|| panic!("not captured"));
        assert!(CAPTURED.with(|c| c.borrow().is_none()));
    }
}
