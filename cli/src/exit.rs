//! Exit statuses: the command's own, or one of these (documented in `fencelock --help`).

use std::process::ExitStatus;

use fencelock::Error;

/// The lock or leadership was not acquired: taken (`--try`) or not within `--timeout`
/// (`EX_TEMPFAIL`).
pub(crate) const NOT_ACQUIRED: u8 = 75;
/// The grant was lost while the command ran; the command was stopped.
pub(crate) const LOST: u8 = 76;
/// The cluster could not be reached, or the session was lost before the command ran
/// (`EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// Bad configuration or input: a name, a TLS file, credentials, permissions (`EX_CONFIG`).
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
        Error::Connect { .. } | Error::SessionLost(_) | Error::NotHeld(_) => UNAVAILABLE,
        e if e.is_temporary() => UNAVAILABLE,
        _ => SOFTWARE,
    }
}

/// The exit status that passes on the command's: its code, or 128 + the signal that ended it.
pub(crate) fn of_command(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        (None, None) => SOFTWARE,
    }
}
