//! A child process of a test (usually this test binary again, running one ignored test):
//! its stdout lines arrive on a channel stamped with the time they were read, the last lines
//! of its stderr are kept for failure messages, closing its stdin asks it to stop, and it is
//! killed on drop.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver};

/// A running child process.
pub struct ChildProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<(Instant, String)>,
    /// The last lines of its stderr.
    errors: Arc<Mutex<Vec<String>>>,
}

impl ChildProc {
    /// Starts `cmd` with piped stdin, stdout and stderr.
    pub fn spawn(mut cmd: Command) -> ChildProc {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let keep = errors.clone();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut kept = keep.lock().unwrap_or_else(|e| e.into_inner());
                kept.push(line);
                if kept.len() > 40 {
                    kept.remove(0);
                }
            }
        });
        let (tx, lines) = unbounded();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send((Instant::now(), line));
            }
        });
        ChildProc {
            stdin: child.stdin.take(),
            child,
            lines,
            errors,
        }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its stdout lines, with the time each was read.
    pub fn lines(&self) -> &Receiver<(Instant, String)> {
        &self.lines
    }

    /// The end of its stderr.
    pub fn stderr_tail(&self) -> String {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }

    /// Waits for a stdout line containing `marker`; returns it from the marker on (the test
    /// harness may have written `test name ... ` on the same line first). Lines before it
    /// are dropped. Panics with the end of its stderr after `timeout`.
    pub fn wait_line(&self, marker: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((_, line)) if line.contains(marker) => {
                    return line[line.find(marker).unwrap_or(0)..].to_owned()
                }
                Ok(_) => {}
                Err(_) => panic!(
                    "child process {}: no {marker} line within {timeout:?}; its stderr ends with:\n{}",
                    self.child.id(),
                    self.stderr_tail()
                ),
            }
        }
    }

    /// Closes its stdin (the agreed signal to shut down) without waiting: to stop many at
    /// once, then [`stop`](Self::stop) each.
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Closes its stdin (the agreed signal to shut down), waits for its `marker` line and
    /// its exit (killing it after 10 s more); returns the line.
    pub fn stop(mut self, marker: &str, timeout: Duration) -> String {
        drop(self.stdin.take());
        let line = self.wait_line(marker, timeout);
        let exited = super::wait_until(Duration::from_secs(10), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !exited {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        line
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
