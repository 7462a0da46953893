//! What `/proc` says of processes: whether it is fencelock's own PID namespace's, and each
//! process's parent, group, session, terminal and state, as the command's tree (`tree.rs`),
//! the keeper (`keeper/`) and the terminal's job control (`terminal.rs`) read them.

use rustix::process::Pid;

/// Whether `/proc` is that of fencelock's PID namespace (`/proc/self` names `me`): else its
/// numbers are another namespace's, and no PID read there may be signalled.
pub(crate) fn proc_is_ours(me: Pid) -> bool {
    // `NSpid` lists our PID in each namespace from `/proc`'s down to ours: one field when they
    // are the same. (Without it, an old kernel: `/proc/self` must name our PID, which a PID
    // that happens to be the same number in both namespaces would also pass.)
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(pids) = status.lines().find_map(|l| l.strip_prefix("NSpid:")) {
            let mut pids = pids.split_whitespace();
            return pids.next().and_then(|p| p.parse::<i32>().ok())
                == Some(me.as_raw_nonzero().get())
                && pids.next().is_none();
        }
    }
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<i32>().ok())
        == Some(me.as_raw_nonzero().get())
}

/// fencelock's own `/proc/self/stat`, its IDs as numbered by that `/proc`.
pub(crate) fn own() -> Option<Proc> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Its own first field, not `getpid()`: a `/proc` of a parent PID namespace numbers every
    // field of the file in that namespace.
    let pid = stat.split_whitespace().next()?.parse().ok()?;
    parse_stat(pid, &stat)
}

/// Process `pid` as `/proc/PID/stat` shows it now (`None` if gone or unreadable; read only
/// where [`proc_is_ours`]).
pub(crate) fn state_of(pid: Pid) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).ok()?;
    parse_stat(pid.as_raw_nonzero().get(), &stat)
}

/// One process, as `/proc/PID/stat` shows it.
pub(crate) struct Proc {
    pub(crate) pid: i32,
    pub(crate) ppid: i32,
    pub(crate) pgrp: i32,
    /// The session ID (0 if its leader is outside fencelock's PID namespace).
    pub(crate) session: i32,
    /// The foreground process group of its controlling terminal (-1 without one, 0 if not
    /// visible from fencelock's PID namespace).
    pub(crate) tpgid: i32,
    pub(crate) zombie: bool,
    /// Stopped by a signal (or traced): `T` or `t`.
    pub(crate) stopped: bool,
}

/// Every process of the machine that can be read (the others are not ours to stop).
pub(crate) fn processes() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        parse_stat(pid, &stat)
    })
    .collect()
}

/// Reads `pid (comm) state ppid pgrp session tty_nr tpgid …`; the command name may hold
/// spaces and parentheses, so the fields are read after its last `)`.
fn parse_stat(pid: i32, stat: &str) -> Option<Proc> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    let session = fields.next()?.parse().ok()?;
    let _tty_nr = fields.next()?;
    let tpgid = fields.next()?.parse().ok()?;
    Some(Proc {
        pid,
        ppid,
        pgrp,
        session,
        tpgid,
        zombie: state == "Z" || state == "X",
        stopped: state == "T" || state == "t",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        let p = parse_stat(42, "42 (a) b) c) S 7 42 42 0 -1 4194560").unwrap();
        assert_eq!((p.pid, p.ppid, p.pgrp, p.zombie), (42, 7, 42, false));
        assert_eq!((p.session, p.tpgid), (42, -1));
        let p = parse_stat(9, "9 (sleep) Z 1 5 5 0 0 0").unwrap();
        assert!(p.zombie);
        // In a PID namespace whose group and session leaders live outside it.
        let p = parse_stat(2, "2 (cat) R 1 0 0 0 -1 4194304").unwrap();
        assert_eq!((p.pgrp, p.session, p.tpgid), (0, 0, -1));
        assert!(parse_stat(1, "garbage").is_none());
    }
}
