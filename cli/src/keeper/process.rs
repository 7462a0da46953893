//! The keeper's own process (`fencelock --internal-keeper FD PID`, started by
//! [`between`](super::between)): stands for the command towards fencelock until fencelock's
//! pipe reads end of file, or the last deadline fencelock wrote on it passes, then kills the
//! tree.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use rustix::process::{
    getpid, kill_process, wait, waitid, Pid, Signal, WaitId, WaitIdOptions, WaitOptions,
};

use super::{ignore_passed_on_signals, ARG};
use crate::{exit, procfs};

/// How long the keeper keeps killing its children after fencelock's end (SIGKILL cannot be
/// caught, but a process in an uninterruptible sleep takes as long as its I/O).
const KILL_FOR: Duration = Duration::from_secs(10);

/// The exit status of the keeper started by hand (clap's for a usage error).
const MISUSE: u8 = 2;

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
    let Some(timer) = deadline_timer() else {
        return exit::SOFTWARE;
    };
    // Read to the end each time (`read_deadline`); fencelock, which never reads its copy of
    // this end, is not affected.
    // SAFETY: `fcntl` on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fencelock.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(
            fencelock.as_raw_fd(),
            libc::F_SETFL,
            flags | libc::O_NONBLOCK,
        );
    }
    // The last deadline fencelock wrote (none before the first).
    let mut until: Option<u64> = None;
    // In the command's group, which it leads (`between`), or in fencelock's with it.
    // SAFETY: `getpgid` only reads.
    let own_group = unsafe { libc::getpgid(0) } == command.as_raw_nonzero().get();
    loop {
        // Reported before the wait too: the command may have stopped or ended already.
        if let Some(status) = mirror(command, own_group) {
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
            libc::pollfd {
                fd: timer.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is valid for its length.
        if unsafe { libc::poll(fds.as_mut_ptr(), 3, -1) } == -1 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            kill_tree(command);
            return exit::SOFTWARE;
        }
        if fds[0].revents != 0 {
            match read_deadline(&fencelock) {
                // End of file: fencelock is gone.
                Read::Gone => {
                    kill_tree(command);
                    return exit::SOFTWARE;
                }
                Read::Deadline(at) => {
                    until = Some(at);
                    arm(&timer, at);
                }
                Read::Nothing => {}
            }
        }
        if fds[1].revents != 0 {
            drain(&children);
        }
        if fds[2].revents != 0 {
            drain(&timer);
        }
        // Asked of the clock, not of the timer alone: a deadline read in this same round
        // replaces the one the timer fired for.
        if until.is_some_and(|at| boottime() >= at) {
            // The session's local deadline passed and fencelock said nothing since: it is
            // stopped (SIGSTOP, a debugger) or stuck, and the lock is about to be another's.
            kill_tree(command);
            return exit::LOST;
        }
    }
}

/// What a read of fencelock's pipe found.
enum Read {
    /// End of file: fencelock is gone.
    Gone,
    /// The deadline it wrote last (`CLOCK_BOOTTIME`, ns).
    Deadline(u64),
    /// Nothing new.
    Nothing,
}

/// Reads every deadline fencelock wrote (8 bytes each, written whole: less than `PIPE_BUF`),
/// to the last: a keeper continued after a long stop (it stops with the command) finds many
/// queued, and the first of them are stale (one read of a few took a stale one for the last,
/// and killed the tree of a holder that heartbeated all along). `fencelock` is non-blocking.
fn read_deadline(fencelock: &OwnedFd) -> Read {
    let mut buf = [0u8; 8 * 64];
    let mut last = None;
    loop {
        // SAFETY: `buf` is valid for its length.
        let n = unsafe { libc::read(fencelock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match usize::try_from(n) {
            Ok(0) => return Read::Gone,
            Ok(n) if n >= 8 => {
                let record = &buf[(n / 8 - 1) * 8..n / 8 * 8];
                last = Some(u64::from_ne_bytes(record.try_into().expect("8 bytes")));
            }
            // A short read cannot happen (whole writes of 8 bytes).
            Ok(_) => {}
            Err(_) => match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::Interrupted => {}
                // Drained (EAGAIN), or an error there is no more to do about.
                _ => return last.map_or(Read::Nothing, Read::Deadline),
            },
        }
    }
}

/// Now on `CLOCK_BOOTTIME` in ns: the clock the session's deadline counts on, which goes on
/// while the machine is suspended.
pub(crate) fn boottime() -> u64 {
    // SAFETY: `clock_gettime` only writes into `ts`.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts);
        ts
    };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// A timer on `CLOCK_BOOTTIME` as a descriptor to poll, unarmed.
fn deadline_timer() -> Option<OwnedFd> {
    // SAFETY: `timerfd_create` returns a new descriptor, owned from here on.
    unsafe {
        let fd = libc::timerfd_create(libc::CLOCK_BOOTTIME, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK);
        (fd >= 0).then(|| <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd))
    }
}

/// Sets `timer` to fire at `at` (`CLOCK_BOOTTIME`, ns; at once if past).
fn arm(timer: &OwnedFd, at: u64) {
    let value = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: libc::time_t::try_from(at / 1_000_000_000).unwrap_or(libc::time_t::MAX),
            // Never 0 with a second of 0: an `it_value` of zero disarms the timer.
            tv_nsec: libc::c_long::try_from(at % 1_000_000_000)
                .unwrap_or(0)
                .max(1),
        },
    };
    // SAFETY: `value` is a valid itimerspec; the old value is not asked for.
    unsafe {
        libc::timerfd_settime(
            timer.as_raw_fd(),
            libc::TFD_TIMER_ABSTIME,
            &value,
            std::ptr::null_mut(),
        );
    }
}

/// Reaps what ended among the keeper's children (orphans of the tree, the command), and
/// stands for the command: `Some` with the status to exit with once it has ended (after
/// ending by its signal if it was killed by one); stops the keeper while it is stopped, if
/// `stops` (the command leads a group of its own).
///
/// Not where the command shares fencelock's group, a terminal's foreground: there a Ctrl-Z
/// stops fencelock and the command together, and the shell's `fg` continues the whole group
/// at once. A keeper stopped too could not kill the tree at the deadline meanwhile, and past
/// it the command ran again for a few milliseconds beside the next holder before fencelock
/// or the keeper, continued with it, killed it (black-box round 8: 1 to 3 runs of 4 on etcd
/// and Redis). Running, the keeper kills the stopped tree at the deadline, and `fg` finds it
/// gone. fencelock learns of the command's stops otherwise there (its own SIGTSTP, SIGTTIN).
fn mirror(command: Pid, stops: bool) -> Option<u8> {
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
            if stops && stopped(command) {
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
    !procfs::proc_is_ours(getpid()) || procfs::state_of(pid).is_none_or(|p| p.stopped)
}

/// SIGKILLs the command, then every child of the keeper until none is left (the command's
/// orphans are re-parented to the keeper, the subreaper, as their parents die), bounded by
/// [`KILL_FOR`]. Without a `/proc` of the keeper's PID namespace only the command and its
/// group are known.
fn kill_tree(command: Pid) {
    let _ = kill_process(command, Signal::KILL);
    let me = getpid();
    let listed = procfs::proc_is_ours(me);
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
            for p in procfs::processes() {
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

/// Reads everything pending off a non-blocking descriptor: every SIGCHLD of `signalfd` (what
/// ended is then asked of `waitid`), the expiries of the timer.
fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; std::mem::size_of::<libc::signalfd_siginfo>() * 8];
    // SAFETY: `buf` is valid for its length; the descriptor is non-blocking.
    while unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}
