//! Exit statuses: the command's own, or one of these (documented in `fencelock --help`).

use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use fencelock::Error;

/// The lock or leadership was not acquired: taken (`--try`) or not within `--timeout`
/// (`EX_TEMPFAIL`).
pub(crate) const NOT_ACQUIRED: u8 = 75;
/// The grant was lost while the command ran; the command was stopped.
pub(crate) const LOST: u8 = 76;
/// The cluster could not be reached, or the session was lost before the command ran
/// (`EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// Bad configuration or input: a name, a TLS file, a server certificate not trusted, a host
/// name that does not resolve, credentials, permissions (`EX_CONFIG`).
pub(crate) const CONFIG: u8 = 78;
/// Anything else that went wrong in fencelock itself (`EX_SOFTWARE`).
pub(crate) const SOFTWARE: u8 = 70;
/// The command exists but could not be run (the shell's convention).
pub(crate) const CANNOT_RUN: u8 = 126;
/// The command was not found (the shell's convention).
pub(crate) const NOT_FOUND: u8 = 127;

/// The exit status for a fencelock error.
pub(crate) fn of_error(e: &Error) -> u8 {
    match e {
        Error::Timeout { .. } => NOT_ACQUIRED,
        Error::InvalidName(_)
        | Error::InvalidTtl(_)
        | Error::InvalidValue(_)
        | Error::InvalidConfig(_)
        | Error::Unauthenticated { .. }
        | Error::PermissionDenied { .. } => CONFIG,
        // Not the cluster being away, but what trying again cannot mend: a server certificate
        // the CA does not sign, a host name that does not resolve.
        Error::Connect {
            temporary: false, ..
        } => CONFIG,
        // (A waiting entry deleted by someone else, or lost with a server's data: as a lost
        // session, not an internal failure. A cluster out of space, Redis at `maxmemory` or
        // etcd past its quota, cannot serve: it said 70, an internal failure.)
        Error::Connect { .. }
        | Error::OutOfSpace { .. }
        | Error::SessionLost(_)
        | Error::NotHeld(_)
        | Error::EntryVanished { .. } => UNAVAILABLE,
        e if e.is_temporary() => UNAVAILABLE,
        _ => SOFTWARE,
    }
}

/// The exit status for a session that could not be started: nothing was asked for yet, so a
/// timeout (its first heartbeat) means the cluster could not be reached, not "not acquired";
/// refused credentials are bad configuration as anywhere.
pub(crate) fn of_session_start(e: &Error) -> u8 {
    match e {
        Error::Timeout { .. } => UNAVAILABLE,
        e => of_error(e),
    }
}

/// The exit status that passes on the command's: its code, or 128 + the signal that ended it
/// (and fencelock then ends by that signal too, see [`by_signal`]).
pub(crate) fn of_command(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(sig)) => by_signal(sig),
        (None, None) => SOFTWARE,
    }
}

/// The signal fencelock ends by once it has cleaned up (0: none).
static END_BY: AtomicI32 = AtomicI32::new(0);

/// The status 128 + `sig`, and a note that fencelock is to end by `sig` itself once it has
/// cleaned up ([`end`]): a shell tells a process killed by SIGINT from one that exited 130
/// (bash stops a loop or a script only for the former), so fencelock reports what stopped it,
/// or its command, the way the shell expects, as `timeout(1)` does.
pub(crate) fn by_signal(sig: i32) -> u8 {
    END_BY.store(sig, Ordering::SeqCst);
    (128 + sig).clamp(0, 255) as u8
}

/// The signals whose default action is not to terminate without a core: they dump one, stop,
/// continue, or are ignored. Every other signal (SIGINT, SIGTERM, SIGPIPE, SIGPROF, the
/// real-time signals, ...) just terminates.
const NOT_PLAIN_TERMINATION: [i32; 18] = {
    use signal_hook::consts::signal::*;
    [
        SIGQUIT, SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGXCPU, SIGXFSZ, SIGSYS,
        SIGCHLD, SIGCONT, SIGURG, SIGWINCH, SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU,
    ]
};

/// Ends fencelock by the signal noted with [`by_signal`], if its default action terminates
/// without a core dump; returns if there is none (then `status` is the exit status).
pub(crate) fn end(status: u8) -> u8 {
    let sig = END_BY.load(Ordering::SeqCst);
    if sig > 0 && i32::from(status) == 128 + sig && !NOT_PLAIN_TERMINATION.contains(&sig) {
        // Restores the default action of a signal fencelock caught, then raises it (by hand:
        // signal-hook's emulation knows no real-time signal, and takes SIGIO's default for
        // "ignore").
        // SAFETY: `signal` with SIG_DFL installs no handler of ours; the process is ending.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
        let _ = signal_hook::low_level::raise(sig);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiting entry deleted by someone else is the cluster's doing, as a lost session: 69,
    /// not 70 (an internal failure).
    #[test]
    fn a_vanished_entry_is_not_an_internal_failure() {
        let e = Error::EntryVanished { key: "k".into() };
        assert_eq!(of_error(&e), UNAVAILABLE);
    }
}
