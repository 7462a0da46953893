//! The signals fencelock acts on, caught from its first moment to its last.
//!
//! SIGINT, SIGTERM, SIGHUP and SIGQUIT are caught once, before anything connects, and stay
//! caught until fencelock exits: none of them can kill fencelock between two phases (while it
//! connects, waits, spawns, releases or closes) and leave a queue entry to linger until the TTL.
//! Those that fencelock was started with ignored (`nohup`) stay ignored, for its command too.
//! SIGTSTP (Ctrl-Z) is caught too, so that a command in a process group of its own stops with
//! fencelock: stopped alone, fencelock would stop heartbeating while the command ran on, and
//! past the TTL another holder would run beside it.
//! What each phase does with them is in `fencelock --help` and in [`crate::child`].

use std::future::Future;

use futures_util::FutureExt;
use rustix::process::Signal;
use tokio::signal::unix::{signal, SignalKind};

/// The caught signals (`None`: ignored when fencelock started, see [`Signals::catch`]).
pub(crate) struct Signals {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
    quit: Option<tokio::signal::unix::Signal>,
    /// Job control's stop (Ctrl-Z): fencelock stops itself, and while the command runs in a
    /// process group of its own, the command with it (see [`crate::child`]).
    tstp: Option<tokio::signal::unix::Signal>,
}

/// A future's outcome, or the signal that stopped it first.
pub(crate) enum Stopped<T> {
    /// The future completed.
    Done(T),
    /// This signal arrived first (the future was dropped).
    Signal(Signal),
}

impl Signals {
    /// Catches the signals (needs a Tokio runtime with I/O enabled), but those that fencelock
    /// was started with ignored: `nohup fencelock …` ignores SIGHUP, a non-interactive shell's
    /// `fencelock … &` SIGINT and SIGQUIT, and both mean it for fencelock and its command alike
    /// (an ignored signal stays ignored across `exec`; a caught one would be reset for it).
    pub(crate) fn catch() -> std::io::Result<Signals> {
        let ignored = ignored_at_start();
        let catch = |kind: SignalKind| -> std::io::Result<_> {
            let bit = 1u64 << (kind.as_raw_value() - 1);
            if ignored & bit != 0 {
                return Ok(None);
            }
            signal(kind).map(Some)
        };
        Ok(Signals {
            int: catch(SignalKind::interrupt())?,
            term: catch(SignalKind::terminate())?,
            hup: catch(SignalKind::hangup())?,
            quit: catch(SignalKind::quit())?,
            tstp: catch(SignalKind::from_raw(Signal::TSTP.as_raw()))?,
        })
    }

    /// The next caught signal, SIGTSTP included (see [`stop`](Self::stop) for the others).
    pub(crate) async fn recv(&mut self) -> Signal {
        /// A caught signal's next delivery; never, for one that is not caught.
        async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = next(&mut self.int) => Signal::INT,
            _ = next(&mut self.term) => Signal::TERM,
            _ = next(&mut self.hup) => Signal::HUP,
            _ = next(&mut self.quit) => Signal::QUIT,
            _ = next(&mut self.tstp) => Signal::TSTP,
        }
    }

    /// The next signal that stops fencelock (SIGINT, SIGTERM, SIGHUP, SIGQUIT). A SIGTSTP
    /// meanwhile stops fencelock as its default action would ([`stop_self`]), and the wait goes
    /// on once it is continued.
    pub(crate) async fn stop(&mut self) -> Signal {
        loop {
            let sig = self.recv().await;
            if sig != Signal::TSTP {
                return sig;
            }
            stop_self();
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

/// Stops fencelock (SIGSTOP, the whole process), as SIGTSTP's default action would; returns
/// once it is continued (SIGCONT: the shell's `fg` or `bg`).
pub(crate) fn stop_self() {
    let _ = signal_hook::low_level::raise(Signal::STOP.as_raw());
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
