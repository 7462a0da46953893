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
//! - otherwise stands for the command towards fencelock, which knows the keeper as its child
//!   (the PID it waits for): it exits with the command's status, or ends by the signal that
//!   ended it, and stops when it stops (a read of the terminal from the background, a
//!   debugger's SIGSTOP); fencelock continues it should it stay stopped while the command runs
//!   again (`Tree::tend`);
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

use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use rustix::process::{
    getpid, kill_process, wait, waitid, Pid, Signal, WaitId, WaitIdOptions, WaitOptions,
};

use crate::exit;
use crate::tree::{self, Tree};

/// The argument that starts fencelock's binary as the keeper, followed by the pipe's file
/// descriptor and the command's PID. Not for users: refused unless both are what fencelock
/// hands over (a pipe, and a child of the process).
pub(crate) const ARG: &str = "--internal-keeper";

/// How long the keeper keeps killing its children after fencelock's end (SIGKILL cannot be
/// caught, but a process in an uninterruptible sleep takes as long as its I/O).
const KILL_FOR: Duration = Duration::from_secs(10);

/// The exit status of the keeper started by hand (clap's for a usage error).
const MISUSE: u8 = 2;

/// The pipe to the keeper, held by fencelock while the command runs: dropped (or fencelock
/// gone), the keeper kills the tree.
pub(crate) struct Keeper {
    /// Both ends (fencelock holds the read end too: harmless, it never reads), `None` where
    /// the command runs without a keeper.
    _pipe: Option<(OwnedFd, OwnedFd)>,
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
            _pipe: None,
            report: None,
        };
    };
    let fd = read.as_raw_fd();
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
        _pipe: Some((read, write)),
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

/// The keeper's whole life (`fencelock --internal-keeper FD PID`): returns the exit status
/// only where it does not end by the command's signal.
pub(crate) fn run(args: &[OsString]) -> u8 {
    let parse = |a: Option<&OsString>| a?.to_str()?.parse::<i32>().ok().filter(|n| *n > 0);
    let (Some(fd), Some(command)) = (parse(args.first()), parse(args.get(1))) else {
        say!("{ARG} is for fencelock's own use");
        return MISUSE;
    };
    let command = match Pid::from_raw(command) {
        Some(pid) if is_pipe(fd) && is_child(pid) => pid,
        _ => {
            say!("{ARG} is for fencelock's own use");
            return MISUSE;
        }
    };
    // SAFETY: `fd` is a pipe this process was handed (checked above), owned from here on.
    let fencelock = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: `prctl` with a static name; `signal` installs no handler.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"fencelock-keep".as_ptr());
    }
    let _ = rustix::process::set_child_subreaper(Some(getpid()));
    hold_nothing_but(fd);
    // Done before the `exec` already; again for a keeper started otherwise.
    // SAFETY: async-signal-safe, and so safe anywhere.
    unsafe { ignore_passed_on_signals(libc::SIGRTMIN()..=libc::SIGRTMAX()) };
    let Some(children) = child_events() else {
        return exit::SOFTWARE;
    };
    loop {
        // Reported before the wait too: the command may have stopped or ended already.
        if let Some(status) = mirror(command) {
            return status;
        }
        let mut fds = [
            libc::pollfd {
                fd: fencelock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: children.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is valid for its length.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } == -1 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            kill_tree(command);
            return exit::SOFTWARE;
        }
        if fds[0].revents != 0 {
            // End of file (fencelock never writes): fencelock is gone.
            kill_tree(command);
            return exit::SOFTWARE;
        }
        if fds[1].revents != 0 {
            drain(&children);
        }
    }
}

/// Reaps what ended among the keeper's children (orphans of the tree, the command), and
/// stands for the command: `Some` with the status to exit with once it has ended (after
/// ending by its signal if it was killed by one); stops the keeper while it is stopped.
fn mirror(command: Pid) -> Option<u8> {
    loop {
        // `wait`: any child (rustix's `waitpid(None, …)` is any child of our process group).
        let (pid, status) = match wait(WaitOptions::UNTRACED | WaitOptions::NOHANG) {
            Ok(Some(reported)) => reported,
            Ok(None) => return None,
            Err(rustix::io::Errno::INTR) => continue,
            // No child at all: the command cannot have been reaped but here.
            Err(_) => return Some(exit::SOFTWARE),
        };
        if pid != command {
            continue;
        }
        if let Some(sig) = status.stopping_signal() {
            // Stopped still (a SIGCONT may have come since): the keeper stops with it, by
            // the same signal, so that fencelock reads it as the command's stop. (Should it
            // stay stopped while the command runs again, fencelock continues it.)
            if stopped(command) {
                // SAFETY: the stop signal's default action for the time of `raise` (which
                // returns once the keeper is continued), then ignored again.
                unsafe {
                    libc::signal(sig, libc::SIG_DFL);
                    libc::raise(sig);
                    if sig != libc::SIGSTOP {
                        libc::signal(sig, libc::SIG_IGN);
                    }
                }
            }
            continue;
        }
        if let Some(code) = status.exit_status() {
            return Some(code.clamp(0, 255) as u8);
        }
        if let Some(sig) = status.terminating_signal() {
            end_by(sig);
            return Some(exit::by_signal(sig));
        }
    }
}

/// Ends the keeper by `sig`, as the command ended, without a core dump of its own.
fn end_by(sig: i32) {
    // Not dumpable: the kernel writes no core of it (a `core` file beside the command's would
    // replace the command's own), and no core limit of 0 either, which a hard limit the
    // keeper may not raise could refuse.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let mut limit = rustix::process::getrlimit(rustix::process::Resource::Core);
    limit.current = Some(0);
    let _ = rustix::process::setrlimit(rustix::process::Resource::Core, limit);
    // SAFETY: `signal` with SIG_DFL installs no handler; `sigprocmask` only unblocks.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
}

/// Whether `pid` is stopped now (from `/proc`; taken as stopped if it cannot be read, or if
/// `/proc` numbers another PID namespace's processes).
fn stopped(pid: Pid) -> bool {
    if !tree::proc_is_ours(getpid()) {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero()))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            Some(matches!(rest.split_whitespace().next()?, "T" | "t"))
        })
        .unwrap_or(true)
}

/// SIGKILLs the command, then every child of the keeper until none is left (the command's
/// orphans are re-parented to the keeper, the subreaper, as their parents die), bounded by
/// [`KILL_FOR`]. Without a `/proc` of the keeper's PID namespace only the command and its
/// group are known.
fn kill_tree(command: Pid) {
    let _ = kill_process(command, Signal::KILL);
    let me = getpid();
    let listed = tree::proc_is_ours(me);
    if !listed {
        // Only the command's group is known: the keeper in it goes too (its work is done).
        // SAFETY: `getpgid` only reads.
        if unsafe { libc::getpgid(0) } == command.as_raw_nonzero().get() {
            let _ = rustix::process::kill_process_group(command, Signal::KILL);
        }
    }
    let until = Instant::now() + KILL_FOR;
    loop {
        if listed {
            for p in tree::processes() {
                if p.ppid == me.as_raw_nonzero().get() && !p.zombie {
                    if let Some(pid) = Pid::from_raw(p.pid) {
                        let _ = kill_process(pid, Signal::KILL);
                    }
                }
            }
        }
        loop {
            match waitid(WaitId::All, WaitIdOptions::EXITED | WaitIdOptions::NOHANG) {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(rustix::io::Errno::INTR) => continue,
                // No child left.
                Err(_) => return,
            }
        }
        if Instant::now() >= until {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `fd` is an open pipe.
fn is_pipe(fd: RawFd) -> bool {
    // SAFETY: `fstat` only writes into `st`.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO
    }
}

/// Whether `pid` is a child of this process (its state left to be reported).
fn is_child(pid: Pid) -> bool {
    let all = WaitIdOptions::EXITED
        | WaitIdOptions::STOPPED
        | WaitIdOptions::NOHANG
        | WaitIdOptions::NOWAIT;
    waitid(WaitId::Pid(pid), all).is_ok()
}

/// Points the standard streams at `/dev/null` and closes every other descriptor but `keep`:
/// the command's own, which the keeper must not hold open.
fn hold_nothing_but(keep: RawFd) {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            // SAFETY: `dup2` onto a standard stream.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in open {
        if fd > 2 && fd != keep {
            // SAFETY: closing a descriptor nothing in the keeper uses (the directory's own,
            // listed too, is closed already: this fails harmlessly for it).
            unsafe { libc::close(fd) };
        }
    }
}

/// Ignores every signal fencelock may pass on to the tree (the command gets its own copy),
/// the job-control stops too: the keeper stops only as the command does ([`mirror`]), not
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

/// SIGCHLD as a descriptor to poll (the signal blocked, read from a `signalfd`).
fn child_events() -> Option<OwnedFd> {
    // SAFETY: `set` is initialised by `sigemptyset`; `signalfd` returns a new descriptor,
    // owned from here on.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        (fd >= 0).then(|| <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd))
    }
}

/// Reads every pending SIGCHLD off `children` (what ended is then asked of `waitid`).
fn drain(children: &OwnedFd) {
    let mut buf = [0u8; std::mem::size_of::<libc::signalfd_siginfo>() * 8];
    // SAFETY: `buf` is valid for its length; the descriptor is non-blocking.
    while unsafe { libc::read(children.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
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
