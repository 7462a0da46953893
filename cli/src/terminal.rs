//! The controlling terminal of a job whose command runs in a process group of its own (a
//! shell's `fencelock … &`): the terminal handed to the command's group once the job is in the
//! foreground, and back to fencelock's when the command is done, as a shell does for a job.

use std::fs::OpenOptions;

use rustix::process::Pid;

use crate::tree;

/// Makes `group` the terminal's foreground process group, if fencelock's own group is the
/// foreground one (the job was brought to the foreground: `fg`). Best effort: without a
/// terminal or visible IDs, nothing is done (the command then stays stopped on its read).
pub(crate) fn hand_to(group: Pid) {
    if tree::in_terminal_foreground() {
        set_foreground(group);
    }
}

/// Gives the terminal back to fencelock's own group if `group` has it (the command handed it
/// is done): fencelock's last messages must not stop it (`stty tostop`), and the shell takes
/// the terminal from the job's group, which is fencelock's.
pub(crate) fn take_back_from(group: Pid) {
    let Some((own, foreground)) = tree::own_groups() else {
        return;
    };
    if own > 0 && foreground == group.as_raw_nonzero().get() {
        if let Some(own) = Pid::from_raw(own) {
            set_foreground(own);
        }
    }
}

fn set_foreground(group: Pid) {
    let Ok(tty) = OpenOptions::new().read(true).write(true).open("/dev/tty") else {
        return;
    };
    // A process of a background group that sets the foreground gets SIGTTOU (which would
    // stop fencelock) unless it ignores it, as shells do around this call (fencelock ignores
    // it already while the command runs; this keeps the call safe on its own).
    // SAFETY: `signal` installs no handler of ours (SIG_IGN, then what was there before).
    let before = unsafe { libc::signal(libc::SIGTTOU, libc::SIG_IGN) };
    let _ = rustix::termios::tcsetpgrp(&tty, group);
    // SAFETY: as above: the disposition that was in place.
    unsafe { libc::signal(libc::SIGTTOU, before) };
}
