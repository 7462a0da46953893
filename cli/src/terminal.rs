//! fencelock's controlling terminal and process group: whether it has a terminal, whether its
//! group is the terminal's foreground one, alone, orphaned, and whether it leads its session
//! (read from `/proc`, see [`has_terminal`]); and, for a job whose command runs in a process
//! group of its own (a shell's `fencelock … &`), the terminal handed to the command's group
//! once the job is in the foreground, and back to fencelock's when the command is done, as a
//! shell does for a job.

use std::collections::HashMap;
use std::fs::OpenOptions;

use rustix::process::Pid;

use crate::procfs::{own, processes, Proc};

/// Whether fencelock runs in the foreground of its controlling terminal (then the command
/// shares its process group; see the module's docs). From `/proc/self/stat` for the reason
/// given on [`has_terminal`]: a 0 is "not visible", not foreground.
pub(crate) fn in_terminal_foreground() -> bool {
    own_groups().is_some_and(|(pgrp, tpgid)| pgrp > 0 && tpgid == pgrp)
}

/// The terminal's foreground process group, if fencelock has a terminal with one and it is
/// visible (-1 and 0 are none: `Pid` holds neither).
pub(crate) fn terminal_foreground() -> Option<Pid> {
    own_groups()
        .filter(|&(_, tpgid)| tpgid > 0)
        .and_then(|(_, tpgid)| Pid::from_raw(tpgid))
}

/// Whether fencelock is alone in its process group (no other side of a pipeline, no shell
/// without job control): read from `/proc`; false if it cannot tell.
pub(crate) fn alone_in_group() -> bool {
    let Some(me) = own() else {
        return false;
    };
    me.pgrp > 0
        && !processes()
            .iter()
            .any(|p| p.pgrp == me.pgrp && p.pid != me.pid && !p.zombie)
}

/// fencelock's process group and its terminal's foreground group (-1 without a terminal, 0
/// where not visible), from `/proc/self/stat`.
pub(crate) fn own_groups() -> Option<(i32, i32)> {
    own().map(|me| (me.pgrp, me.tpgid))
}

/// Whether fencelock has a controlling terminal (then a command in a group of its own is a
/// job's, whose job control fencelock relays).
///
/// Read from `/proc/self/stat`, not from `getpgrp`/`tcgetpgrp`: in a PID namespace whose
/// process group or session leader lives outside it (a container's shell, `unshare --pid`),
/// the kernel reports those IDs as 0, which rustix's `Pid` cannot hold (it asserts in debug
/// builds and is undefined behaviour in release ones). The terminal's foreground group there
/// is -1 without a terminal (0 when it is not visible: a terminal all the same).
pub(crate) fn has_terminal() -> bool {
    own().is_some_and(|me| me.tpgid != -1)
}

/// Whether fencelock's process group is orphaned (POSIX: no process of it has its parent in
/// another group of the same session): nobody is there to continue it once stopped, and the
/// kernel discards a SIGTSTP sent to its processes. So it is under `ssh -t host fencelock …`
/// (fencelock leads its session) or a shell without job control that leads its session;
/// never for a job of an interactive shell, which is the parent in another group. Only read,
/// never signalled: any `/proc` numbers its processes consistently (without one, fencelock
/// leading its session is taken for it).
pub(crate) fn group_is_orphaned() -> bool {
    let Some(me) = own() else {
        return false;
    };
    if me.pgrp <= 0 || me.session <= 0 {
        return me.session == me.pid;
    }
    let procs = processes();
    let by_pid: HashMap<i32, &Proc> = procs.iter().map(|p| (p.pid, p)).collect();
    !procs
        .iter()
        .filter(|p| p.pgrp == me.pgrp && !p.zombie)
        .filter_map(|p| by_pid.get(&p.ppid))
        .any(|parent| parent.pgrp != me.pgrp && parent.session == me.session)
}

/// Whether fencelock leads its session (then a terminal's hangup reaches it alone; see
/// `child.rs`). From `/proc/self/stat` for the reason given on [`has_terminal`].
pub(crate) fn leads_session() -> bool {
    own().is_some_and(|me| me.session == me.pid)
}

/// Makes `group` the terminal's foreground process group, if fencelock's own group is the
/// foreground one (the job was brought to the foreground: `fg`). Best effort: without a
/// terminal or visible IDs, nothing is done (the command then stays stopped on its read).
pub(crate) fn hand_to(group: Pid) {
    if in_terminal_foreground() {
        set_foreground(group);
    }
}

/// Gives the terminal back to fencelock's own group if `group` has it (the command handed it
/// is done): fencelock's last messages must not stop it (`stty tostop`), and the shell takes
/// the terminal from the job's group, which is fencelock's.
pub(crate) fn take_back_from(group: Pid) {
    let Some((own, foreground)) = own_groups() else {
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
