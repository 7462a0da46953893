//! The command's process tree: everything the command starts, found and stopped as one.
//!
//! fencelock is a *child subreaper* (Linux `PR_SET_CHILD_SUBREAPER`): a process the command
//! starts that outlives its parent (a daemonising grandchild, even one that left the group with
//! `setsid`) is re-parented to fencelock rather than to init, so every process the command
//! started is a descendant of fencelock. How signals reach them depends on where fencelock runs:
//!
//! - **In the foreground of a terminal** (the terminal's foreground process group is
//!   fencelock's), the command stays in fencelock's process group, as with `timeout
//!   --foreground`: it reads the terminal, and the terminal's signals (Ctrl-C, Ctrl-\, Ctrl-Z,
//!   hangup) reach it once, from the kernel; Ctrl-Z stops fencelock with it, as one job.
//!   fencelock signals the tree's processes one by one (never its own group, which a shell
//!   pipeline may share).
//! - **Elsewhere** (a service, a script without a terminal, a shell's background job), the
//!   command leads a process group of its own: a signal sent to fencelock's group (a shell's
//!   `kill %1`) reaches only fencelock, which passes it on to the command's group, and to any
//!   descendant that left it. For a shell's background job, fencelock relays job control
//!   between the shell, which knows fencelock alone, and the command's group (`child.rs`,
//!   `terminal.rs`): `fg` hands the terminal to the command's group, and a Ctrl-Z there stops
//!   fencelock too.
//!
//! The process fencelock starts is the command's keeper (`keeper.rs`), which starts the command
//! below it and stands for it: fencelock waits for the keeper, and the keeper, the tree's
//! subreaper while it lives, kills the tree if fencelock dies without doing so.
//!
//! fencelock waits until none of the tree is left before it releases the grant or exits. What
//! escapes: a process that another service starts on the command's behalf (`systemd-run`,
//! `at`, a D-Bus activation) is not a descendant and is not stopped.
//!
//! The tree is read from `/proc`, and only from a `/proc` of fencelock's own PID namespace
//! (`/proc/self` names fencelock's PID): under `unshare --pid` without `--mount-proc`, `/proc`
//! numbers another namespace's processes, and taking them for ours would signal strangers
//! (as PID 1, "our descendants" would be the whole host). Without it, fencelock knows only the
//! command and its process group: descendants that left the group are not found, nor (in a
//! terminal's foreground, where the command shares fencelock's group) any process but the
//! command; orphans re-parented to fencelock are reaped only once the command is; and
//! fencelock takes itself to be outside a terminal's foreground.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::procfs::{self, proc_is_ours, processes};

use rustix::process::{
    getpid, kill_process, kill_process_group, test_kill_process_group, waitid, waitpgid, waitpid,
    Pid, Signal, WaitId, WaitIdOptions, WaitOptions,
};

/// How often the tree is looked at while waiting for it to end.
const POLL: Duration = Duration::from_millis(20);
/// How long SIGKILL is given to take effect (it cannot be caught; a process in an
/// uninterruptible sleep takes as long as its I/O).
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);

/// Makes fencelock the reaper of the command's orphans (Linux; elsewhere a no-op). Call before
/// spawning.
pub(crate) fn adopt_orphans() {
    // Failure only means orphans go to init: the process group still reaches most of them.
    let _ = rustix::process::set_child_subreaper(Some(getpid()));
}

/// Has the kernel SIGKILL the command if fencelock dies first (a SIGKILL, an OOM kill, a
/// crash): past the TTL another holder would run beside it. Only the command itself: what it
/// started is adopted by init and runs on, as fencelock no longer exists to stop it. For
/// where no keeper can be started (`keeper.rs`), which takes the whole tree. (The signal
/// comes when the thread that started the command ends: a worker of fencelock's runtime,
/// which lasts as long as fencelock.)
pub(crate) fn dies_with_fencelock(cmd: &mut tokio::process::Command) {
    let parent = std::process::id();
    // SAFETY: `prctl`, `getppid` and `kill` are async-signal-safe, and the closure touches
    // nothing else.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // fencelock died between the fork and now: the signal will never come.
            if libc::getppid() as u32 != parent {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// The tree of one spawned command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tree {
    /// The PID fencelock started, and Tokio waits for (never reaped here): the keeper, which
    /// stands for the command (`keeper.rs`), or the command itself without one.
    command: Pid,
    /// The command's process group: its own (the command leads it), or `None` when it shares
    /// fencelock's.
    group: Option<Pid>,
    /// The command, when `command` is its keeper.
    below: Option<Pid>,
}

impl Tree {
    /// The tree of the command `command` (the process fencelock started and waits for: the
    /// keeper, see `keeper.rs`), in the process group `group` of its own, or in fencelock's.
    pub(crate) fn new(command: Pid, group: Option<Pid>, below: Option<Pid>) -> Tree {
        Tree {
            command,
            group,
            below,
        }
    }

    /// Whether nothing of the tree is left: no live process in it, and no child of fencelock
    /// at all. The second half is what makes it sure: fencelock is the subreaper of the tree,
    /// so every process of it has an ancestor among fencelock's children, and none means none
    /// is left. `/proc` alone cannot tell: its listing is read before each process's state, so
    /// a process forked in between is missed while its parent is read as exited (a double fork
    /// that ends as the command does: a daemon outlived fencelock in a third of the runs).
    ///
    /// Only with a `/proc` of our own, where the tree's exited orphans are reaped as they are
    /// found: without one, those outside the command's group are never reaped, and would
    /// count as children for good.
    pub(crate) fn is_empty(&self) -> bool {
        self.live().is_empty() && !(proc_is_ours(getpid()) && has_children())
    }

    /// The live processes of the tree (zombies left out; ours are reaped on the way).
    pub(crate) fn members(&self) -> Vec<Pid> {
        self.live().into_iter().map(|(pid, _)| pid).collect()
    }

    /// The live processes of the tree, each with whether it is in the command's group.
    fn live(&self) -> Vec<(Pid, bool)> {
        let me = getpid();
        if !proc_is_ours(me) {
            return self.live_unlisted();
        }
        let procs = processes();
        let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
        for p in &procs {
            children.entry(p.ppid).or_default().push(p.pid);
        }
        // Descendants of fencelock, then the command's group (members whose parent left it).
        let mut tree = HashSet::new();
        let mut todo = vec![me.as_raw_nonzero().get()];
        while let Some(pid) = todo.pop() {
            for &c in children.get(&pid).into_iter().flatten() {
                if tree.insert(c) {
                    todo.push(c);
                }
            }
        }
        let group = self.group.map(|g| g.as_raw_nonzero().get());
        let mut live = Vec::new();
        for p in &procs {
            let in_group = Some(p.pgrp) == group;
            if !(tree.contains(&p.pid) || in_group) {
                continue;
            }
            if p.zombie {
                // An orphan re-parented to us: reap it. The command itself is reaped by
                // whoever waits for it (Tokio), never here: only pids that are not its.
                if p.ppid == me.as_raw_nonzero().get()
                    && p.pid != self.command.as_raw_nonzero().get()
                {
                    if let Some(pid) = Pid::from_raw(p.pid) {
                        let _ = waitpid(Some(pid), WaitOptions::NOHANG);
                    }
                }
                continue;
            }
            if let Some(pid) = Pid::from_raw(p.pid) {
                live.push((pid, in_group));
            }
        }
        live
    }

    /// [`live`](Self::live) without a `/proc` of our own: the command's group (one entry, to
    /// signal as a group) while any of it may live, else the command while it runs.
    fn live_unlisted(&self) -> Vec<(Pid, bool)> {
        // `NOWAIT`: the command's status stays Tokio's to collect.
        let command = waitid(
            WaitId::Pid(self.command),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
        );
        let (running, reaped) = (matches!(command, Ok(None)), command.is_err());
        let Some(group) = self.group else {
            // The keeper's command too: the keeper ignores what it is sent.
            return if running {
                std::iter::once(self.command)
                    .chain(self.below)
                    .map(|p| (p, false))
                    .collect()
            } else {
                Vec::new()
            };
        };
        if reaped {
            // The group's other exited members are orphans re-parented to us (the
            // subreaper): reaped here, so that they stop counting. (Never while the command
            // is unreaped: it is in the group, and its status is Tokio's.)
            while let Ok(Some(_)) = waitpgid(group, WaitOptions::NOHANG) {}
        }
        // An exited command not yet reaped keeps the group alive: counted as live until
        // Tokio reaps it (bounded by the grace and the kill wait of `stop`).
        if test_kill_process_group(group).is_ok() {
            vec![(group, true)]
        } else {
            Vec::new()
        }
    }

    /// The processes of the tree that run (not stopped), from `/proc` (none without one of
    /// our own: then nothing is known of their states).
    fn running(&self) -> Vec<Pid> {
        if !proc_is_ours(getpid()) {
            return Vec::new();
        }
        let stopped: HashSet<i32> = processes()
            .into_iter()
            .filter(|p| p.stopped)
            .map(|p| p.pid)
            .collect();
        // Not the keeper: it stops with the command by itself, or not at all where the
        // command shares fencelock's group (see `keeper/process.rs`, `mirror`), to kill the
        // tree at the deadline while fencelock is stopped.
        let keeper = self.below.map(|_| self.command);
        self.members()
            .into_iter()
            .filter(|p| !stopped.contains(&p.as_raw_nonzero().get()) && Some(*p) != keeper)
            .collect()
    }

    /// After SIGTSTP in a terminal's foreground: waits up to `within` for the tree to stop (a
    /// Ctrl-Z reaches the whole group from the terminal), then stops what still runs and
    /// returns it, to continue when fencelock is. A `kill -TSTP` aimed at fencelock alone
    /// stopped it alone, and the command ran on while fencelock sent no heartbeat, past the
    /// TTL. First with SIGTSTP, so that a program that handles it (an editor) puts the terminal
    /// back (SIGSTOP would freeze it in raw mode); then, `within` later, SIGSTOP for what still
    /// runs: one that ignores or blocks SIGTSTP. (In an orphaned process group, where the
    /// kernel discards SIGTSTP, fencelock ignores it too: see `signals.rs`.)
    pub(crate) async fn stopped_with_us(&self, within: Duration) -> Vec<Pid> {
        let mut signalled: Vec<Pid> = Vec::new();
        for sig in [Signal::TSTP, Signal::STOP] {
            let until = tokio::time::Instant::now() + within;
            let running = loop {
                let running = self.running();
                if running.is_empty() || tokio::time::Instant::now() >= until {
                    break running;
                }
                tokio::time::sleep(POLL).await;
            };
            if running.is_empty() {
                break;
            }
            for &pid in &running {
                let _ = kill_process(pid, sig);
                if !signalled.contains(&pid) {
                    signalled.push(pid);
                }
            }
        }
        signalled
    }

    /// The signal that stopped the command, if it is stopped (`waitid` without taking the
    /// report: Tokio waits for its exit alone).
    pub(crate) fn command_stopped_by(&self) -> Option<Signal> {
        let status = waitid(
            WaitId::Pid(self.command),
            WaitIdOptions::STOPPED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
        )
        .ok()??;
        status
            .stopping_signal()
            .map(|n| Signal::from_named_raw(n).unwrap_or(Signal::STOP))
    }

    /// Whether the command (not its keeper) is stopped now, from `/proc` (false without one).
    pub(crate) fn command_is_stopped(&self) -> bool {
        procfs::state_of(self.below.unwrap_or(self.command)).is_some_and(|p| p.stopped)
    }

    /// The command's own process group, if it has one.
    pub(crate) fn group(&self) -> Option<Pid> {
        self.group
    }

    /// Sends `sig` once to every process of the tree: to the command's group (if it has its
    /// own), and to each other descendant.
    pub(crate) fn signal(&self, sig: Signal) {
        if let Some(group) = self.group {
            let _ = kill_process_group(group, sig);
        }
        for (pid, in_group) in self.live() {
            if !in_group {
                let _ = kill_process(pid, sig);
            }
        }
    }

    /// Called every tick while the command runs: reaps the orphans that exited if `reap`
    /// (they would linger as zombies until the command ends; it reads `/proc`), and continues
    /// the keeper if it is stopped while the command is not. The keeper stops when the command
    /// stops, to stand for it; a SIGCONT sent to the command alone (a debugger's, a `kill
    /// -CONT` of its PID), or one that reached the keeper just before it stopped, would leave
    /// it stopped for good while the command ran on and ended, and fencelock, waiting for the
    /// keeper, would hold the lock for ever.
    pub(crate) fn tend(&self, reap: bool) {
        if reap {
            let _ = self.live();
        }
        let Some(command) = self.below else {
            return;
        };
        if !proc_is_ours(getpid()) {
            return;
        }
        let keeper_stopped = procfs::state_of(self.command).is_some_and(|p| p.stopped);
        // A command gone (or a zombie the stopped keeper has to reap) runs no more either.
        if keeper_stopped && procfs::state_of(command).is_none_or(|p| !p.stopped) {
            let _ = kill_process(self.command, Signal::CONT);
        }
    }

    /// Stops the whole tree: SIGTERM (with SIGCONT, so that a stopped process gets it), then
    /// SIGKILL to whatever is left after `grace` (at once, without SIGTERM, if it is zero). Returns once nothing of it runs (or after a
    /// bounded wait for SIGKILL to take effect).
    pub(crate) async fn stop(&self, grace: Duration) {
        if self.is_empty() {
            return;
        }
        if !grace.is_zero() {
            self.signal(Signal::TERM);
            self.signal(Signal::CONT);
            if self.gone_within(grace).await {
                return;
            }
            say!("the command's processes did not exit within {grace:?} of SIGTERM: SIGKILL");
        }
        let until = tokio::time::Instant::now() + KILL_WAIT;
        loop {
            self.signal(Signal::KILL);
            if self.gone_within(POLL).await || tokio::time::Instant::now() >= until {
                return;
            }
        }
    }

    /// Waits up to `d` for the tree to be empty; true if it is.
    async fn gone_within(&self, d: Duration) -> bool {
        let until = tokio::time::Instant::now() + d;
        loop {
            if self.is_empty() {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Whether fencelock has a child, running, stopped or exited and not yet reaped (`waitid`
/// without taking a report).
fn has_children() -> bool {
    !matches!(
        waitid(
            WaitId::All,
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
        ),
        Err(rustix::io::Errno::CHILD)
    )
}
