//! The one managed child process of the harnesses: a server member, a holder process, a worker.
//! Output goes to a log file (its tail is kept for failure messages), signals go by PID through
//! `rustix` (never by spawning `kill`), and an orphan guard kills the child if the test process
//! dies without dropping it (a timeout kill, a panic in another thread), so that no server is
//! ever left behind. Dropping it kills the child.

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use rustix::process::{kill_process, Pid, Signal};

/// A child process started by a test; killed (by its PID) when dropped.
#[derive(Debug)]
pub struct ManagedChild {
    name: String,
    /// `None` once reaped: no signal may reach a recycled PID.
    child: Option<Child>,
    /// A `sh` loop that kills the child once this test process is gone.
    guard: Option<Child>,
    log: PathBuf,
    paused: bool,
    /// Its status, once [`try_wait`](Self::try_wait) reaped it.
    exited: Option<ExitStatus>,
}

impl ManagedChild {
    /// Starts `cmd` (stdin closed, stdout and stderr appended to `log`) and its orphan guard.
    pub fn spawn(name: impl Into<String>, mut cmd: Command, log: &Path) -> io::Result<Self> {
        let out = OpenOptions::new().create(true).append(true).open(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        Ok(Self::adopt(name, child, log))
    }

    /// Takes charge of a child spawned by the caller (one whose stdout the caller reads),
    /// giving it an orphan guard. `log` is where its stderr goes, if anywhere.
    pub fn adopt(name: impl Into<String>, child: Child, log: &Path) -> Self {
        let guard = orphan_guard(child.id());
        ManagedChild {
            name: name.into(),
            child: Some(child),
            guard,
            log: log.to_path_buf(),
            paused: false,
            exited: None,
        }
    }

    /// The child's name (for messages).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The child's process id, while it has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        if self.exited.is_some() {
            return None;
        }
        self.child.as_ref().map(Child::id)
    }

    /// Whether the child is running (started, not reaped, not exited).
    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none() && self.child.is_some()
    }

    /// Whether the child is paused (SIGSTOP) by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// The child's exit status if it has exited. Once it is reaped, no signal reaches its PID
    /// (which the system may give to another process): [`pid`](Self::pid) is `None`, and the
    /// orphan guard is stopped.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.exited = Some(status);
        if let Some(mut guard) = self.guard.take() {
            let _ = guard.kill();
            let _ = guard.wait();
        }
        Some(status)
    }

    /// Sends `sig` to the child by its PID; false if it is gone.
    pub fn signal(&self, sig: Signal) -> bool {
        let Some(pid) = self.pid().and_then(|p| Pid::from_raw(p as i32)) else {
            return false;
        };
        kill_process(pid, sig).is_ok()
    }

    /// Pauses the child (SIGSTOP), as a long GC pause would.
    pub fn pause(&mut self) {
        if self.signal(Signal::STOP) {
            self.paused = true;
        }
    }

    /// Resumes a paused child (SIGCONT).
    pub fn resume(&mut self) {
        self.signal(Signal::CONT);
        self.paused = false;
    }

    /// Kills the child (SIGKILL) and reaps it; its orphan guard first, so that the guard can
    /// never signal a recycled PID.
    pub fn kill(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            let _ = guard.kill();
            let _ = guard.wait();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// The last `lines` lines of the child's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of the file at `path` (empty if unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts `sh` polling this test process; once it is gone, the guard kills `pid`.
fn orphan_guard(pid: u32) -> Option<Child> {
    let script = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 1; done; kill -9 {pid} 2>/dev/null",
        me = std::process::id()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}
