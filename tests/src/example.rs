//! The programs of the `fencelock-examples` package, run as an operator runs them: built once
//! per test process, started with arguments, their output lines awaited (bounded).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::process::ManagedChild;

/// The example `name`'s binary (next to the running test's), built (or brought up to date)
/// once per test process: `cargo test` builds examples under hashed names and leaves the plain
/// name pointing at whatever `cargo build` made last, which may be stale.
///
/// Every example of the workspace is built at once, with the packages `scripts/test.sh` tests
/// (the workspace but the benchmark): the dependencies' features are then the ones its
/// `cargo test` resolved, so their builds are reused (`-p fencelock-examples` alone resolved
/// fewer features and rebuilt much of the dependency tree, a minute in CI).
pub fn binary(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("examples").join(name);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !*built {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args([
                "build",
                "--workspace",
                "--exclude",
                "fencelock-bench",
                "--examples",
            ])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cannot build the examples");
        *built = true;
    }
    assert!(bin.exists(), "no example {name} at {}", bin.display());
    bin
}

/// A running example, with its output lines (and when each was printed). Killed on drop.
#[derive(Debug)]
pub struct Program {
    /// The process.
    pub child: ManagedChild,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<(Instant, String)>,
}

impl Program {
    /// Starts the example `name` with `args`; `label` names it in messages.
    pub fn start(name: &str, label: &str, args: &[&str]) -> Program {
        let mut child = Command::new(binary(name))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the example");
        let out = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((Instant::now(), line));
            }
        });
        let child = ManagedChild::adopt(label, child, Path::new("/dev/null"));
        Program {
            child,
            stdin,
            lines,
        }
    }

    /// Writes `line` to the program's standard input.
    pub fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write to the example");
        stdin.flush().expect("flush");
    }

    /// Waits (bounded) for a line containing `what`; returns the line and when it was printed.
    pub fn wait_for_line(&self, what: &str, within: Duration) -> (Instant, String) {
        self.wait_for_any(&[what], within)
    }

    /// Waits (bounded) for a line containing any of `whats`; returns the line and when it was
    /// printed.
    pub fn wait_for_any(&self, whats: &[&str], within: Duration) -> (Instant, String) {
        let what = whats.join(" or ");
        let deadline = Instant::now() + within;
        // The last lines passed over, for the failure message: what the program did instead.
        let mut skipped: std::collections::VecDeque<String> = Default::default();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, line)) if whats.iter().any(|w| line.contains(w)) => return (at, line),
                Ok((_, line)) => {
                    if skipped.len() == 20 {
                        skipped.pop_front();
                    }
                    skipped.push_back(line);
                }
                Err(_) => panic!(
                    "{}: no {what:?} within {within:?}; the last lines printed meanwhile:\n{}",
                    self.child.name(),
                    Vec::from(skipped).join("\n")
                ),
            }
        }
    }

    /// Waits (bounded) for a line containing `what`; returns when it was printed.
    pub fn wait_for(&self, what: &str, within: Duration) -> Instant {
        self.wait_for_line(what, within).0
    }
}
