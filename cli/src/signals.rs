//! The signals fencelock acts on, caught from its first moment to its last.
//!
//! SIGINT, SIGTERM, SIGHUP and SIGQUIT are caught once, before anything connects, and stay
//! caught until fencelock exits: none of them can kill fencelock between two phases (while it
//! connects, waits, spawns, releases or closes) and leave a queue entry to linger until the TTL.
//! What each phase does with them is in `fencelock --help` and in [`crate::child`].

use std::future::Future;

use futures_util::FutureExt;
use rustix::process::Signal;
use tokio::signal::unix::{signal, SignalKind};

/// The caught signals.
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

/// A future's outcome, or the signal that stopped it first.
pub(crate) enum Stopped<T> {
    /// The future completed.
    Done(T),
    /// This signal arrived first (the future was dropped).
    Signal(Signal),
}

impl Signals {
    /// Catches the signals (needs a Tokio runtime with I/O enabled).
    pub(crate) fn catch() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next caught signal.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::INT,
            _ = self.term.recv() => Signal::TERM,
            _ = self.hup.recv() => Signal::HUP,
            _ = self.quit.recv() => Signal::QUIT,
        }
    }

    /// A signal that arrived and was not taken yet, if any.
    pub(crate) fn pending(&mut self) -> Option<Signal> {
        self.recv().now_or_never()
    }

    /// Runs `fut` until it completes or a signal arrives; then drops it (every fencelock future
    /// is cancel-safe: a dropped acquisition leaves no queue entry).
    pub(crate) async fn until<T>(&mut self, fut: impl Future<Output = T>) -> Stopped<T> {
        if let Some(sig) = self.pending() {
            return Stopped::Signal(sig);
        }
        tokio::select! {
            v = fut => Stopped::Done(v),
            sig = self.recv() => Stopped::Signal(sig),
        }
    }
}

/// The exit status of a process ended by `sig`, as a shell reports it (128 + N); fencelock
/// ends by `sig` itself once it has cleaned up (see [`crate::exit::by_signal`]).
pub(crate) fn status_of(sig: Signal) -> u8 {
    crate::exit::by_signal(sig.as_raw())
}
