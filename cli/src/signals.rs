//! The signals fencelock acts on, caught from its first moment to its last.
//!
//! Every signal whose default action would end fencelock and that a user can send is caught
//! once, before anything connects, and stays caught until fencelock exits: SIGINT, SIGTERM,
//! SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT,
//! SIGXCPU, SIGXFSZ and the real-time signals (not the fault signals, SIGABRT, SIGTRAP and
//! SIGSYS, which report fencelock's own failure). None of them can kill fencelock between two phases (while it
//! connects, waits, spawns, releases or closes) and leave a queue entry to linger until the
//! TTL, or, while the command runs, leave the command running without the lock (SIGUSR1 did,
//! and another holder ran beside it once the TTL had passed). Those that fencelock was started
//! with ignored (`nohup`) stay ignored, for its command too, and so does SIGPIPE
//! ([`as_without_fencelock`]).
//! SIGTSTP (Ctrl-Z) and SIGTTIN are caught too, so that a command in a process group of its
//! own stops with fencelock: stopped alone, fencelock would stop heartbeating while the command
//! ran on, and past the TTL another holder would run beside it ([`is_job_stop`]). SIGTTOU is
//! ignored once the command runs (see `child.rs`). On a terminal, in an orphaned process group,
//! the stops are ignored ([`Signals::may_stop`]).
//!
//! Each signal comes with whether a process sent it (`kill`) or the kernel did (a terminal's
//! Ctrl-C, Ctrl-\ or hangup, which reach the terminal's whole foreground process group, the
//! command included when it shares fencelock's): see [`crate::child`] for what each phase
//! does with them, and `fencelock --help`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::FutureExt;
use rustix::process::Signal;
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use signal_hook::low_level::siginfo::Cause;
use tokio::sync::mpsc;

/// The signals caught by name (the real-time ones are added by number).
const NAMED: [Signal; 16] = [
    Signal::INT,
    Signal::TERM,
    Signal::HUP,
    Signal::QUIT,
    Signal::TSTP,
    Signal::TTIN,
    Signal::USR1,
    Signal::USR2,
    Signal::ALARM,
    Signal::VTALARM,
    Signal::PROF,
    Signal::IO,
    Signal::POWER,
    Signal::STKFLT,
    Signal::XCPU,
    Signal::XFSZ,
];

/// One caught signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caught {
    /// The signal.
    pub(crate) signal: Signal,
    /// Whether a process sent it (`kill`, `sigqueue`) rather than the kernel (a terminal's
    /// Ctrl-C, Ctrl-\, Ctrl-Z or hangup).
    pub(crate) sent: bool,
    /// [`continues`] when it was caught: a stop it asks for is over once a SIGCONT came
    /// since ([`stop_self`]).
    pub(crate) continues: u64,
}

/// How many SIGCONTs fencelock has had (counted by a handler of its own; the signal continues
/// the process all the same).
static CONTINUES: AtomicU64 = AtomicU64::new(0);

/// The number of SIGCONTs fencelock has had so far.
pub(crate) fn continues() -> u64 {
    CONTINUES.load(Ordering::SeqCst)
}

/// The caught signals, as a channel fed by a thread of their own.
pub(crate) struct Signals {
    caught: mpsc::UnboundedReceiver<Caught>,
}

/// A future's outcome, or the signal that stopped it first.
pub(crate) enum Stopped<T> {
    /// The future completed.
    Done(T),
    /// This signal arrived first (the future was dropped).
    Signal(Signal),
}

impl Signals {
    /// Catches the signals (the tasks that wait for them need a Tokio runtime), but those that
    /// fencelock was started with ignored: `nohup fencelock …` ignores SIGHUP, a
    /// non-interactive shell's `fencelock … &` SIGINT and SIGQUIT, and both mean it for
    /// fencelock and its command alike (an ignored signal stays ignored across `exec`; a caught
    /// one would be reset for it).
    pub(crate) fn catch() -> std::io::Result<Signals> {
        let ignored = ignored_at_start();
        let mut numbers: Vec<i32> = NAMED.iter().map(|s| s.as_raw()).collect();
        numbers.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
        numbers.retain(|&n| (1..=64).contains(&n) && ignored & (1u64 << (n - 1)) == 0);
        // SAFETY: the handler only adds to an atomic, which is async-signal-safe.
        unsafe {
            signal_hook::low_level::register(libc::SIGCONT, || {
                CONTINUES.fetch_add(1, Ordering::SeqCst);
            })?;
        }
        let mut info = SignalsInfo::<WithOrigin>::new(&numbers)?;
        let (tx, caught) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for origin in info.forever() {
                    let Some(signal) = signal_of(origin.signal) else {
                        continue;
                    };
                    let sent = matches!(origin.cause, Cause::Sent(_));
                    // (Read as the signal is taken: one that came between its delivery and
                    // now makes the stop shorter, never one that is not undone.)
                    let continues = continues();
                    if tx
                        .send(Caught {
                            signal,
                            sent,
                            continues,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
            })?;
        Ok(Signals { caught })
    }

    /// The next caught signal, the job-control stops included (see [`stop`](Self::stop) for
    /// the others).
    pub(crate) async fn recv(&mut self) -> Caught {
        match self.caught.recv().await {
            Some(c) => c,
            // The thread that reads them is gone (it never ends while the process lives).
            None => std::future::pending().await,
        }
    }

    /// Whether a job-control stop (SIGTSTP, SIGTTIN) is to stop fencelock: not on a terminal
    /// where its process group is
    /// orphaned (`ssh -t host fencelock …`: no shell to continue it), where the kernel
    /// discards a Ctrl-Z for the command sharing that group, and fencelock does the same (it
    /// stopped the whole tree with SIGSTOP, which nothing there could continue: the lock was
    /// lost after the TTL).
    pub(crate) fn may_stop(&self) -> bool {
        // Without a terminal (a service, cron): stopped with its tree, for whoever sent it to
        // send SIGCONT.
        !(crate::terminal::has_terminal() && crate::terminal::group_is_orphaned())
    }

    /// The next signal that ends fencelock (every caught one but the job-control stops). A
    /// job-control stop meanwhile stops fencelock as its default action would ([`stop_self`]),
    /// and the wait goes on once it is continued.
    pub(crate) async fn stop(&mut self) -> Signal {
        loop {
            let caught = self.recv().await;
            if !is_job_stop(caught.signal) {
                return caught.signal;
            }
            if self.may_stop() {
                stop_self(caught.continues);
            }
        }
    }

    /// A signal that stops fencelock, if one arrived and was not taken yet.
    pub(crate) fn pending(&mut self) -> Option<Signal> {
        self.stop().now_or_never()
    }

    /// Runs `fut` until it completes or a signal arrives; then drops it (every fencelock future
    /// is cancel-safe: a dropped acquisition leaves no queue entry).
    pub(crate) async fn until<T>(&mut self, fut: impl Future<Output = T>) -> Stopped<T> {
        if let Some(sig) = self.pending() {
            return Stopped::Signal(sig);
        }
        tokio::select! {
            v = fut => Stopped::Done(v),
            sig = self.stop() => Stopped::Signal(sig),
        }
    }
}

/// Unblocks every signal in the calling thread, and so in every thread it starts afterwards:
/// to be called first thing. A process may be started with signals blocked (a parent's mask is
/// inherited across `exec`, and some supervisors leak theirs): with SIGTERM blocked, fencelock
/// never saw it, and neither passed it on nor ended. The command starts with none blocked
/// either way (Rust's `Command` clears the mask in the child), so fencelock now runs as its
/// command does.
pub(crate) fn unblock_all() {
    // SAFETY: `none` is initialised by `sigemptyset` before it is read; only the calling
    // thread's mask changes.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

/// Whether `sig` is a job-control stop that fencelock catches: SIGTSTP (Ctrl-Z, `kill -TSTP`)
/// and SIGTTIN (a read of the terminal from a background group: a process of fencelock's own
/// group, such as the other side of a pipeline, or `kill -TTIN %1`). Stopped by them alone,
/// fencelock would send no heartbeat while its command, in a group of its own, ran on.
pub(crate) fn is_job_stop(sig: Signal) -> bool {
    matches!(sig, Signal::TSTP | Signal::TTIN)
}

/// `Signal` of a caught signal's number: a named one, or a real-time one.
fn signal_of(n: i32) -> Option<Signal> {
    Signal::from_named_raw(n).or_else(|| {
        (libc::SIGRTMIN()..=libc::SIGRTMAX())
            .contains(&n)
            // SAFETY: a real-time signal the C library leaves to applications (from its
            // SIGRTMIN on); fencelock only passes it on to the command's processes.
            .then(|| unsafe { Signal::from_raw_unchecked(n) })
    })
}

/// Stops fencelock (SIGSTOP, the whole process), as SIGTSTP's default action would; returns
/// once it is continued (SIGCONT: the shell's `fg` or `bg`). Unless a SIGCONT came since
/// [`continues`] was `since` (when the stop was asked for): that stop is over already, as for
/// a process the stop signal had stopped at once. (fencelock first stops its command's tree,
/// which takes up to 600 ms; a `kill -CONT` meanwhile was lost, and fencelock stopped for
/// good, its heartbeats with it.)
pub(crate) fn stop_self(since: u64) {
    if continues() == since {
        let _ = signal_hook::low_level::raise(Signal::STOP.as_raw());
    }
}

/// The exit status of a process ended by `sig`, as a shell reports it (128 + N); fencelock
/// ends by `sig` itself once it has cleaned up (see [`crate::exit::by_signal`]).
pub(crate) fn status_of(sig: Signal) -> u8 {
    crate::exit::by_signal(sig.as_raw())
}

/// The signals this process was started with ignored, as a mask (bit N - 1 for signal N), from
/// the kernel's own account (`SigIgn` in `/proc/self/status`); none if it cannot be read.
fn ignored_at_start() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|l| l.strip_prefix("SigIgn:"))?;
            u64::from_str_radix(line.trim(), 16).ok()
        })
        .unwrap_or(0)
}

/// Starts `cmd` with the signal dispositions it would have been started with without
/// fencelock:
/// - SIGPIPE ignored if fencelock was started so (systemd's `IgnoreSIGPIPE=yes`, its default for
///   services; a shell's `trap '' PIPE`). Rust's runtime ignores SIGPIPE for itself before
///   `main`, and resets it for the processes it starts, so `SigIgn` read later tells nothing
///   of it.
/// - glibc's own signals (32 and 33, below SIGRTMIN) at their default. A process started with
///   `posix_spawn` (Rust's `Command`, fencelock's own as much as any other's) gets them
///   ignored: glibc's spawn ignores them in its child, and an ignored signal stays ignored
///   across `exec`. Programs whose runtime is not glibc's use them as real-time signals, and
///   glibc refuses to touch them (its `sigaction` fails with `EINVAL`), so no program can
///   have meant them ignored. A closure before `exec` also makes Rust start the command with
///   `fork` rather than `posix_spawn`.
///
/// (And with the standard streams closed that fencelock was started with closed:
/// [`crate::stdio::as_at_start`].)
pub(crate) fn as_without_fencelock(cmd: &mut tokio::process::Command) {
    crate::stdio::as_at_start(cmd);
    let keep_sigpipe = SIGPIPE_IGNORED_AT_START.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: `signal` and `syscall` are async-signal-safe, and the closure touches nothing
    // else.
    unsafe {
        cmd.pre_exec(move || {
            if keep_sigpipe {
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            }
            for sig in 32..libc::SIGRTMIN() {
                default_disposition(sig);
            }
            Ok(())
        });
    }
}

/// Sets `sig` to its default disposition by the system call itself, which glibc's
/// `sigaction` refuses for its own signals.
///
/// # Safety
///
/// Async-signal-safe; changes only the disposition of `sig`.
unsafe fn default_disposition(sig: i32) {
    /// The kernel's `struct sigaction` (on x86-64 and arm64 alike), not the C library's.
    #[repr(C)]
    struct KernelSigaction {
        handler: libc::sighandler_t,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    let dfl = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: `dfl` outlives the call; no old action is asked for; the size is the kernel's
    // signal set's (8 bytes).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            &dfl as *const KernelSigaction,
            std::ptr::null_mut::<KernelSigaction>(),
            8usize,
        );
    }
}

static SIGPIPE_IGNORED_AT_START: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Run by the C runtime before Rust's (which sets SIGPIPE to ignored): the disposition that
/// fencelock was started with.
#[used]
#[link_section = ".init_array"]
static READ_SIGPIPE_AT_START: extern "C" fn() = read_sigpipe_at_start;

extern "C" fn read_sigpipe_at_start() {
    // SAFETY: a zeroed `sigaction` is a valid value of the C struct, and `sigaction` with no
    // new action only reads the current one into it.
    let ignored = unsafe {
        let mut now: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut now) == 0
            && now.sa_sigaction == libc::SIG_IGN
    };
    SIGPIPE_IGNORED_AT_START.store(ignored, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_time_signals_are_named_by_number() {
        assert_eq!(signal_of(Signal::USR1.as_raw()), Some(Signal::USR1));
        let rt = libc::SIGRTMIN() + 3;
        assert_eq!(signal_of(rt).map(|s| s.as_raw()), Some(rt));
        assert_eq!(signal_of(0), None);
        assert_eq!(signal_of(libc::SIGRTMAX() + 1), None);
    }
}
