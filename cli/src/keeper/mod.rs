//! The keeper: a small process between fencelock and the command, so that the command's whole
//! tree ends when fencelock is killed outright (SIGKILL, the OOM killer, a crash) and nothing
//! of fencelock runs to stop it. Past the TTL the lock is another's, and whatever of the tree
//! ran on would run beside the next holder.
//!
//! fencelock starts the command by a fork of its own whose child, before `exec`, forks again:
//! the grandchild goes on to `exec` the command; the child starts fencelock's own binary again
//! as the keeper ([`ARG`], [`run`]). The keeper:
//! - is the tree's child subreaper: what the command starts and leaves (a `cmd &`, a daemon
//!   that called `setsid`) is re-parented to the keeper, so the whole tree stays below it;
//! - holds the read end of a pipe whose write end fencelock alone holds: however fencelock
//!   ends, the pipe then reads end of file, and the keeper SIGKILLs its children until none
//!   is left (each one killed hands its own children to the keeper in turn);
//! - reads on that pipe the instant to kill the tree at (the session's local deadline),
//!   which fencelock writes after each heartbeat
//!   ([`Keeper::hold_until`]), and SIGKILLs the tree as above once it passes: a
//!   fencelock that is stopped (SIGSTOP, a debugger) or stuck sends no heartbeat, and the
//!   lock may be another's soon after (black-box round 7: the command of a fencelock
//!   SIGSTOPped for 6 s at a TTL of 3 s ran 0.7-3.5 s beside the next holder's);
//! - otherwise stands for the command towards fencelock, which knows the keeper as its child
//!   (the PID it waits for): it exits with the command's status, or ends by the signal that
//!   ended it, and, where the command leads a group of its own, stops when it stops (a read of
//!   the terminal from the background, a debugger's SIGSTOP); fencelock continues it should it
//!   stay stopped while the command runs again (`Tree::tend`). In a terminal's foreground,
//!   where the command shares fencelock's group, it does not stop: a Ctrl-Z stops fencelock
//!   and the command, and the keeper kills the stopped tree at the deadline (`mirror`);
//! - is in the command's process group, which the command leads (in fencelock's, with the
//!   command, in a terminal's foreground), and ignores every signal but SIGKILL, SIGSTOP,
//!   SIGCONT and SIGCHLD from before its `exec` (the command gets its own copy of what its
//!   group is sent); holds none of the command's streams or descriptors (a pipeline's reader
//!   sees its end of file when the command's side closes), and has an empty environment
//!   (nothing of fencelock's credentials to read in `/proc`).
//!
//! The command's parent (`$PPID`) is the keeper, whose parent is fencelock. Should the keeper
//! die alone, the kernel SIGKILLs the command (`PR_SET_PDEATHSIG`), and what it started is
//! re-parented to fencelock, which stops it as before.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use rustix::process::Pid;
use tokio::time::Instant;

use crate::exit;
use crate::tree::{self, Tree};

mod process;

pub(crate) use process::run;

/// How close to a deadline its replacement must come for the keeper to have maybe killed the
/// tree at it first (it reads the pipe within microseconds, unless the machine is loaded).
const NEAR_MISS: Duration = Duration::from_millis(20);

/// The argument that starts fencelock's binary as the keeper, followed by the pipe's file
/// descriptor and the command's PID. Not for users: refused unless both are what fencelock
/// hands over (a pipe, and a child of the process).
pub(crate) const ARG: &str = "--internal-keeper";

/// The pipe to the keeper, held by fencelock while the command runs: dropped (or fencelock
/// gone), the keeper kills the tree; written to, it tells the keeper the deadline.
pub(crate) struct Keeper {
    /// Both ends (fencelock holds the read end too: harmless, it never reads), `None` where
    /// the command runs without a keeper.
    pipe: Option<(OwnedFd, OwnedFd)>,
    /// The deadline last written.
    told: Option<Instant>,
    /// A deadline replaced when it had (nearly) passed: the keeper may have killed the tree
    /// at it before it read the next one.
    near_miss: Option<Instant>,
    /// Where the keeper writes the command's PID before its `exec`: both ends (read once
    /// `spawn` returned, which waited for that `exec`).
    report: Option<(OwnedFd, OwnedFd)>,
}

impl Keeper {
    /// The tree of the process fencelock `spawned` (the keeper, or without one the command),
    /// the command the leader of a process group of its own if `own_group`.
    pub(crate) fn tree(&mut self, spawned: Pid, own_group: bool) -> Tree {
        let Some((report, ours)) = self.report.take() else {
            return Tree::new(spawned, own_group.then_some(spawned), None);
        };
        // Our write end closed first: a keeper that wrote nothing (it failed before) reads as
        // an end of file, not as a wait for ever.
        drop(ours);
        let mut pid = [0u8; 4];
        let read = rustix::io::read(&report, &mut pid);
        let command = match read {
            Ok(4) => {
                Pid::from_raw(i32::from_ne_bytes(pid)).filter(|p| p.as_raw_nonzero().get() > 0)
            }
            _ => None,
        };
        // The command leads its group (the keeper joined it), which is named by its PID.
        Tree::new(spawned, if own_group { command } else { None }, command)
    }

    /// Whether the keeper may have killed the tree at a deadline by now: the one last
    /// written has passed, or one replaced when it had nearly passed did within the last
    /// seconds. (A keeper that exited [`exit::LOST`] then most likely did.)
    pub(crate) fn deadline_passed(&self) -> bool {
        let now = Instant::now();
        let recent = |at: Instant| at <= now && now - at < Duration::from_secs(2);
        self.pipe.is_some()
            && (self.told.is_some_and(|at| now >= at) || self.near_miss.is_some_and(recent))
    }

    /// Tells the keeper to kill the tree at `deadline` unless told a later one before. Written
    /// as an instant of `CLOCK_BOOTTIME`, which both processes read: a deadline the keeper
    /// reads late (stopped with the command meanwhile) still means the instant it meant when
    /// written. A full pipe (a keeper stopped for hours) is left to the next call.
    pub(crate) fn hold_until(&mut self, deadline: Instant) {
        let Some((_, write)) = &self.pipe else {
            return;
        };
        if self.told == Some(deadline) {
            return;
        }
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        let left = u64::try_from(left.as_nanos()).unwrap_or(u64::MAX);
        let at = process::boottime().saturating_add(left);
        if rustix::io::write(write, &at.to_ne_bytes()) == Ok(8) {
            if let Some(old) = self.told.filter(|old| *old <= now + NEAR_MISS) {
                self.near_miss = Some(old);
            }
            self.told = Some(deadline);
        }
    }
}

/// Starts `cmd` below a keeper (see the module's documentation), the command the leader of a
/// process group of its own if `own_group`, else in fencelock's. Where fencelock's binary
/// cannot be started again (no `/proc`), the command is fencelock's child, with only the
/// kernel's parent-death signal ([`tree::dies_with_fencelock`]). Keep what is returned until
/// the command's tree is gone.
pub(crate) fn between(cmd: &mut tokio::process::Command, own_group: bool) -> Keeper {
    let exe = c"/proc/self/exe";
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
    let (Ok(_), Ok((read, write)), Ok((report, reported))) =
        (std::fs::metadata("/proc/self/exe"), pipe(), pipe())
    else {
        if own_group {
            cmd.process_group(0);
        }
        tree::dies_with_fencelock(cmd);
        return Keeper {
            pipe: None,
            told: None,
            near_miss: None,
            report: None,
        };
    };
    let fd = read.as_raw_fd();
    // Never blocks fencelock, whatever the keeper does (`hold_until`); the keeper's end, a
    // description of its own, blocks.
    // SAFETY: `fcntl` on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(write.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(write.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    let reported_fd = reported.as_raw_fd();
    let rt = libc::SIGRTMIN()..=libc::SIGRTMAX();
    let arg = CString::new(ARG).expect("no NUL");
    let fd_arg = CString::new(fd.to_string()).expect("no NUL");
    // SAFETY: the closure calls only async-signal-safe functions (`getpid`, `fork`,
    // `sigaction`, `setpgid`, `prctl`, `getppid`, `kill`, `fcntl`, `execve`, `write`, `_exit`), and
    // allocates nothing: every string is made beforehand, the PID written into a buffer on
    // the stack.
    unsafe {
        cmd.pre_exec(move || {
            let keeper = libc::getpid();
            // The subreaper from before the command exists (it is kept across `exec`, not
            // passed to a child): what the command starts and leaves in its first moments is
            // the keeper's too (a daemon started at once went to fencelock, and outlived it).
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                0 => {
                    // The command: the leader of its group (its parent sets it too, whichever
                    // comes first), killed with the keeper should the keeper die alone.
                    if own_group && libc::setpgid(0, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::getppid() != keeper {
                        libc::kill(libc::getpid(), libc::SIGKILL);
                    }
                    Ok(())
                }
                command => {
                    ignore_passed_on_signals(rt.clone());
                    // The keeper: in the command's group if it has its own (a SIGKILL to the
                    // group takes both, and fencelock stops the rest), else in fencelock's
                    // with the command. (A group of its own would be a parent in another
                    // group of the session for the command: fencelock's group would no longer
                    // be orphaned where nothing can continue it, `ssh -t host fencelock …`,
                    // and a Ctrl-Z there would stop it for good.)
                    if own_group {
                        libc::setpgid(command, command);
                        if libc::setpgid(0, command) == -1 {
                            not_started(command);
                        }
                    }
                    let pid = command.to_ne_bytes();
                    if libc::write(reported_fd, pid.as_ptr().cast(), pid.len()) != 4 {
                        not_started(command);
                    }
                    // The read end passes across `exec`, the write end does not.
                    libc::fcntl(fd, libc::F_SETFD, 0);
                    let mut pid = [0u8; 16];
                    decimal(command, &mut pid);
                    let argv = [
                        c"fencelock-keeper".as_ptr(),
                        arg.as_ptr(),
                        fd_arg.as_ptr(),
                        pid.as_ptr().cast(),
                        std::ptr::null(),
                    ];
                    let envp = [std::ptr::null::<libc::c_char>()];
                    libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
                    not_started(command);
                }
            }
        });
    }
    Keeper {
        pipe: Some((read, write)),
        told: None,
        near_miss: None,
        report: Some((report, reported)),
    }
}

/// The keeper could not be set up (in the child, before `exec`): the command must not run
/// without it. Async-signal-safe.
fn not_started(command: libc::pid_t) -> ! {
    // SAFETY: `kill`, `write` and `_exit` are async-signal-safe.
    unsafe {
        libc::kill(command, libc::SIGKILL);
        let msg = b"fencelock: cannot start the keeper of the command's tree\n";
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(i32::from(exit::SOFTWARE))
    }
}

/// Writes `n` (positive) in decimal into `buf`, NUL-terminated, without allocating.
fn decimal(n: libc::pid_t, buf: &mut [u8; 16]) {
    let mut digits = [0u8; 12];
    let (mut n, mut len) = (n.unsigned_abs(), 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[i] = digits[len - 1 - i];
    }
    buf[len] = 0;
}

/// Ignores every signal fencelock may pass on to the tree (the command gets its own copy),
/// the job-control stops too: the keeper stops only as the command does (`process.rs`), not
/// when a Ctrl-Z reaches the group of a command that does not stop for it (a shell, an
/// editor). Leaves at their defaults SIGCONT and SIGCHLD (which a parent may have left
/// ignored: its children would then be reaped unseen).
///
/// Called in the child before the keeper's `exec` (an ignored signal stays ignored across it),
/// before it joins the command's group: a signal sent to the group while the keeper's binary
/// started would have ended it by its default action, and the command with it. `rt` is the
/// range of real-time signals (`SIGRTMIN()..=SIGRTMAX()`, read beforehand).
///
/// # Safety
///
/// Async-signal-safe: `sigaction` alone.
unsafe fn ignore_passed_on_signals(rt: std::ops::RangeInclusive<i32>) {
    // The fault signals are ignored too (a `kill -ABRT 0` of the command's ended the keeper,
    // with a core file): a fault of the keeper's own still ends it, as the kernel restores
    // their default action to deliver them.
    const KEEP: [i32; 4] = [libc::SIGKILL, libc::SIGSTOP, libc::SIGCONT, libc::SIGCHLD];
    for sig in (1..32).chain(rt) {
        // SAFETY: a zeroed `sigaction` is valid; SIG_IGN and SIG_DFL install no handler.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = if KEEP.contains(&sig) {
                libc::SIG_DFL
            } else {
                libc::SIG_IGN
            };
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pids_in_decimal() {
        for (n, s) in [
            (1, "1"),
            (42, "42"),
            (4194304, "4194304"),
            (i32::MAX, "2147483647"),
        ] {
            let mut buf = [0xffu8; 16];
            super::decimal(n, &mut buf);
            let end = buf.iter().position(|&b| b == 0).unwrap();
            assert_eq!(&buf[..end], s.as_bytes());
        }
    }
}
