//! The current-thread tokio runtime each [`Connection`](super::Connection) owns, driven from
//! whatever thread calls: a plain thread, a `spawn_blocking` closure, or an async task.
//!
//! tokio refuses two things on a thread that is driving a runtime (an async task, the body
//! of `#[tokio::main]`): to `block_on` another runtime ("Cannot start a runtime from within
//! a runtime") and to drop one in the ordinary way ("Cannot drop a runtime in a context where
//! blocking is not allowed"). Both panic. A [`ConnRuntime`]:
//! - drives a future on the calling thread when that thread has no tokio context: every
//!   thread of postpone's own and every plain thread of the program's. This is the normal
//!   path; it costs one thread-local read more than `Runtime::block_on`.
//! - drives it on a scoped helper thread (`postpone-io`) when the calling thread has a tokio
//!   context, while the caller waits for it. tokio does not say whether such a thread is
//!   driving a runtime (where blocking panics) or is a `spawn_blocking` thread (where it
//!   would not), so both take this path. The call blocks its caller exactly as long as it
//!   would have: the same futures under the same deadlines, and the watchdog severs the
//!   same sockets. It costs one thread start per round-trip (see docs/async.md).
//! - is shut down with `shutdown_background`, which neither waits for nor panics over a
//!   blocking pool (this runtime never uses one): dropping a connection takes a few system
//!   calls on any thread.
//!
//! Fails only when the helper thread cannot be started (the system is out of threads):
//! then the call returns an error of kind `Other` naming `spawn_blocking`, and nothing ran.

use std::future::Future;

use tokio::runtime::{EnterGuard, Runtime};

use crate::error::{Error, ErrorKind, Result};

/// A connection's runtime (I/O and timers, one thread: the caller's or a helper's).
pub(crate) struct ConnRuntime {
    /// Always `Some` until the drop takes it out.
    rt: Option<Runtime>,
}

/// True when the calling thread has a tokio context: it may be driving a runtime, where
/// blocking on another one panics. Also true on `spawn_blocking` threads, where it would
/// not: tokio does not tell the two apart.
pub(crate) fn in_tokio_context() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

impl ConnRuntime {
    /// A current-thread runtime with I/O and timers.
    pub(crate) fn new() -> Result<ConnRuntime> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| {
                Error::with_source(ErrorKind::Other, "starting a connection runtime", e)
            })?;
        Ok(ConnRuntime { rt: Some(rt) })
    }

    fn rt(&self) -> &Runtime {
        self.rt
            .as_ref()
            .expect("a connection's runtime lives until it is dropped")
    }

    /// Runs `fut` to completion on this runtime, on the calling thread or (inside a tokio
    /// context) on a helper thread the caller waits for. A panic inside `fut` (user code,
    /// such as a `ToSql`) resumes on the caller's thread, as it would have without a helper.
    pub(crate) fn block_on<F>(&self, fut: F) -> Result<F::Output>
    where
        F: Future + Send,
        F::Output: Send,
    {
        let rt = self.rt();
        if !in_tokio_context() {
            return Ok(rt.block_on(fut));
        }
        std::thread::scope(|scope| {
            let helper = std::thread::Builder::new()
                .name("postpone-io".into())
                .spawn_scoped(scope, move || rt.block_on(fut))
                .map_err(|e| {
                    Error::with_source(
                        ErrorKind::Other,
                        "starting a thread for a database call made inside an async runtime \
                         (make the call from tokio::task::spawn_blocking instead)",
                        e,
                    )
                })?;
            match helper.join() {
                Ok(out) => Ok(out),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Makes this runtime the current one until the guard drops (to register a socket with
    /// its I/O driver). Never blocks, on any thread.
    pub(crate) fn enter(&self) -> EnterGuard<'_> {
        self.rt().enter()
    }

    /// Spawns `fut` on this runtime; it runs while a call drives the runtime.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        drop(self.rt().spawn(fut));
    }
}

impl Drop for ConnRuntime {
    fn drop(&mut self) {
        // Drops the spawned tasks (the driver, hence the socket) here, without waiting for
        // a blocking pool: an ordinary drop would panic on a thread driving a runtime.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_is_driven_and_dropped_from_inside_another_runtime() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let got = outer.block_on(async {
            assert!(in_tokio_context());
            let rt = ConnRuntime::new().unwrap();
            let v = rt
                .block_on(async {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    7
                })
                .unwrap();
            drop(rt);
            v
        });
        assert_eq!(got, 7);
        assert!(!in_tokio_context());
    }

    #[test]
    fn a_panic_inside_the_future_reaches_the_caller() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let caught = outer.block_on(async {
            let rt = ConnRuntime::new().unwrap();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                rt.block_on(async { panic!("from a ToSql") })
            }))
        });
        let panic = caught.unwrap_err();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"from a ToSql"));
    }
}
