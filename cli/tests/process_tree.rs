//! The command's whole process tree goes with the grant (pipelines, background jobs, a
//! daemonising grandchild), the exit status says when the grant was lost while the command ran,
//! and signals are handled in every phase: end to end against real servers.

use std::path::Path;
use std::time::{Duration, Instant};

use fencelock::conformance::unique_namespace;
use fencelock::Session;
use rustix::process::{kill_process_group, Pid, Signal};

#[macro_use]
mod common;
use common::*;

/// A script that starts a pipeline, a background job and a daemon (a grandchild in a session
/// of its own, orphaned at once), writes their PIDs, then loops appending its token to `out`.
const TREE: &str = r#"
sleep 1000 & echo $! > bg
(setsid sleep 1000 & echo $! > daemon)
echo $$ > pid
while :; do echo "$FENCELOCK_TOKEN" >> out; sleep 0.05; done | cat > /dev/null
"#;

/// The PIDs the [`TREE`] script wrote in `dir`.
async fn tree_pids(dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    for f in ["pid", "bg", "daemon"] {
        pids.push(pid_in(&dir.join(f)).await);
    }
    pids
}

/// fencelock's PID, from the `$PPID` its command wrote in `path`: the command's parent is
/// fencelock's keeper, whose parent is fencelock.
async fn fencelock_in(path: &Path) -> i32 {
    let keeper = pid_in(path).await;
    let stat = std::fs::read_to_string(format!("/proc/{keeper}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Asserts that none of `pids` runs any more and that `out` stopped growing.
async fn all_gone(label: &str, pids: &[i32], dir: &Path) {
    for &pid in pids {
        assert!(!alive(pid), "{label}: process {pid} outlived fencelock");
    }
    let out = dir.join("out");
    let before = size_of(&out);
    // The loop appends every 50 ms: 500 ms without growth means it is gone.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = size_of(&out);
    assert_eq!(before, after, "{label}: the work went on without the lock");
}

/// The holder's entry deleted on the server: fencelock exits 76 and every process of the
/// command's tree is gone (the issue's `while …; done | cat` pipeline kept running before).
async fn lost_grant_stops_the_tree(t: Target) {
    let ns = unique_namespace("cli_tree_lost");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let s = t.session(&ns).await;
    let mut r = Run::start(
        &t.url,
        &ns,
        d,
        "lost",
        &["lock", "m", "--grace", "1s", "--", "bash", "-c", TREE],
    );
    let pids = tree_pids(d).await;
    file_contains(&d.join("out"), "\n").await;
    let holder = s.mutex("m").unwrap().holder().await.unwrap().expect("held");
    t.factory.delete_as_admin(&holder.key).await.unwrap();
    assert_eq!(r.code(WITHIN).await, 76, "{}", r.output());
    all_gone("lost", &pids, d).await;
    s.close().await.unwrap();
}

/// A command that exits leaving processes behind: they are stopped before the lock is released
/// and fencelock exits with the command's status; SIGTERM to fencelock stops the whole tree.
async fn nothing_outlives_fencelock(t: Target) {
    let ns = unique_namespace("cli_tree_exit");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let script = format!("{TREE_BACKGROUND} exit 3");
    let (code, out) = run(
        &t.url,
        &ns,
        d,
        &["lock", "m", "--grace", "1s", "--", "bash", "-c", &script],
    )
    .await;
    assert_eq!(code, 3, "{out}");
    let pids = [pid_in(&d.join("bg")).await, pid_in(&d.join("daemon")).await];
    all_gone("exited", &pids, d).await;
    // The lock was released: a new holder gets it at once.
    let s = t.session(&ns).await;
    let g = s.mutex("m").unwrap().try_lock().await.unwrap();
    assert!(g.is_some(), "released");
    drop(g);

    // SIGTERM to fencelock while the tree runs.
    for f in ["pid", "bg", "daemon", "out"] {
        let _ = std::fs::remove_file(d.join(f));
    }
    let mut r = Run::start(
        &t.url,
        &ns,
        d,
        "term",
        &["lock", "m", "--grace", "1s", "--", "bash", "-c", TREE],
    );
    let pids = tree_pids(d).await;
    file_contains(&d.join("out"), "\n").await;
    assert!(r.child.signal(Signal::TERM));
    let status = r.exit(WITHIN).await;
    // The command died of the SIGTERM passed on; fencelock reports it the shell's way.
    assert_eq!(shell_status(status), 143, "{status:?}: {}", r.output());
    all_gone("sigterm", &pids, d).await;
    s.close().await.unwrap();
}

/// A daemon made by a double fork that ends as the command does (`setsid -f`: the command
/// exits while its child forks the daemon and exits too) is stopped like any leftover, run
/// after run: `/proc`'s listing, read before each process's state, missed the daemon forked in
/// between while its parent read as exited, and the daemon outlived fencelock in about a
/// third of the runs, running beside the next holder.
async fn a_double_forked_daemon_does_not_escape(t: Target) {
    let ns = unique_namespace("cli_double_fork");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut started = 0;
    for run_no in 0..12 {
        let daemon = d.join(format!("daemon{run_no}"));
        // The daemon writes its PID (whole, by a rename), then lives on.
        let script = format!(
            r#"setsid -f sh -c "sh -c 'echo \$\$ > {f}.tmp && mv {f}.tmp {f}; exec sleep 1000' & exit 0""#,
            f = daemon.display()
        );
        let (code, out) = run(
            &t.url,
            &ns,
            d,
            &["lock", "m", "--grace", "1s", "--", "sh", "-c", &script],
        )
        .await;
        assert_eq!(code, 0, "{out}");
        // Written within moments if the daemon got that far (an escaped one writes after
        // fencelock's exit too).
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(pid) = std::fs::read_to_string(&daemon)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            started += 1;
            assert!(
                !alive(pid),
                "run {run_no}: the daemon {pid} outlived fencelock: {out}"
            );
        }
    }
    assert!(
        started > 0,
        "no daemon ever started: the test tested nothing"
    );
}

/// The background part of [`TREE`] alone.
const TREE_BACKGROUND: &str =
    r#"sleep 1000 & echo $! > bg; (setsid sleep 1000 & echo $! > daemon);"#;

/// The lock `m` of `ns`, taken by a session of the test's once the paused holder's session is
/// gone (within [`WITHIN`]).
async fn next_holder(t: &Target, ns: &str) -> (Session, fencelock::Guard) {
    let s = t.session(ns).await;
    let next = tokio::time::timeout(WITHIN, s.mutex("m").unwrap().lock())
        .await
        .expect("granted after the paused holder's TTL")
        .unwrap();
    (s, next)
}

/// fencelock paused (SIGSTOP) past its TTL while the command runs to its end: when it resumes,
/// the grant is gone and the status is 76, not the command's 0.
async fn lost_while_paused(t: Target) {
    let ns = unique_namespace("cli_paused");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut cmd = command(&t.url, &ns);
    cmd.env("FENCELOCK_TTL", "2s").args([
        "lock",
        "m",
        "--",
        "sh",
        "-c",
        "echo started > started; sleep 1; exit 0",
    ]);
    let mut r = Run::spawn(cmd, d, "paused");
    file_contains(&d.join("started"), "started").await;
    r.child.pause();
    // Past the TTL: the cluster expires the session; another holder may take the lock.
    let (s, next) = next_holder(&t, &ns).await;
    r.child.resume();
    assert_eq!(r.code(WITHIN).await, 76, "{}", r.output());
    assert!(r.output().contains("lost"), "{}", r.output());
    next.release().await.unwrap();
    s.close().await.unwrap();
}

/// fencelock stopped (SIGSTOP) while its command's tree runs on: the keeper SIGKILLs the tree
/// at the session's local deadline, fencelock still stopped, before the cluster expires the
/// session and another holder is granted (black-box round 7: the tree ran 0.7-3.5 s beside
/// the next holder's command, until fencelock was continued). Continued, fencelock exits 76.
async fn a_stopped_fencelock_does_not_leave_its_tree_running(t: Target) {
    let ns = unique_namespace("cli_stopped_tree");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut cmd = command(&t.url, &ns);
    cmd.env("FENCELOCK_TTL", "3s")
        .args(["lock", "m", "--", "bash", "-c", TREE]);
    let mut r = Run::spawn(cmd, d, "stopped");
    let pids = tree_pids(d).await;
    file_contains(&d.join("out"), "\n").await;
    r.child.pause();
    let stopped_at = Instant::now();
    let (s, next) = next_holder(&t, &ns).await;
    // fencelock is stopped still: whatever stopped the tree was its keeper.
    all_gone("stopped", &pids, d).await;
    assert!(stopped_at.elapsed() < WITHIN);
    r.child.resume();
    assert_eq!(r.code(WITHIN).await, 76, "{}", r.output());
    next.release().await.unwrap();
    s.close().await.unwrap();
}

/// A command stopped for long while fencelock heartbeats keeps its grant: its keeper stops
/// with it, and fencelock's deadlines queue up in the keeper's pipe meanwhile (about 35 in
/// 24 s at a TTL of 2 s). Continued, the keeper read a few of them, took a stale one for the
/// last, and killed the tree of a holder that had heartbeated all along (diff review). The
/// command continues (and runs on for a while: the keeper, continued by fencelock, reads the
/// pipe while it runs) and exits 0, and so does fencelock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_stopped_for_long_keeps_its_grant() {
    let Some(t) = Target::redis().await else {
        return;
    };
    let ns = unique_namespace("cli_stopped_command");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut cmd = command(&t.url, &ns);
    cmd.env("FENCELOCK_TTL", "2s").args([
        "lock",
        "m",
        "--",
        "sh",
        "-c",
        "echo $$ > pid; kill -STOP $$; echo resumed > resumed; sleep 2",
    ]);
    let mut r = Run::spawn(cmd, d, "stopped-command");
    let pid = pid_in(&d.join("pid")).await;
    until_stopped(&[pid], true, "the command stopped itself").await;
    // The scenario: a stop long enough for dozens of deadlines to queue.
    tokio::time::sleep(Duration::from_secs(24)).await;
    assert!(alive(pid), "killed while stopped: {}", r.output());
    rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::CONT).unwrap();
    file_contains(&d.join("resumed"), "resumed").await;
    assert_eq!(r.code(WITHIN).await, 0, "{}", r.output());
}

on_each!(
    lost_grant_stops_the_tree,
    nothing_outlives_fencelock,
    lost_while_paused,
    a_double_forked_daemon_does_not_escape,
    a_stopped_fencelock_does_not_leave_its_tree_running
);

/// A signal sent to fencelock's whole process group (Ctrl-C in a terminal) reaches the command
/// once, not once from the kernel and once passed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_signal_reaches_the_command_once() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_group_signal");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut cmd = command(&t.url, &ns);
    // fencelock as a shell's job: the leader of a group of its own.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.args([
        "lock",
        "m",
        "--",
        "sh",
        "-c",
        r#"trap 'echo INT >> ints' INT; echo ready > ready; while :; do sleep 0.05; done"#,
    ]);
    let mut r = Run::spawn(cmd, d, "group");
    file_contains(&d.join("ready"), "ready").await;
    let group = Pid::from_raw(r.child.pid().unwrap() as i32).unwrap();
    kill_process_group(group, Signal::INT).unwrap();
    file_contains(&d.join("ints"), "INT").await;
    // A second delivery would follow within milliseconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ints = std::fs::read_to_string(d.join("ints")).unwrap();
    assert_eq!(ints.lines().count(), 1, "delivered {ints:?}");
    assert!(r.child.signal(Signal::TERM));
    assert_eq!(r.code(WITHIN).await, 143, "{}", r.output());
}

/// Started with SIGHUP ignored (`nohup fencelock …`), fencelock and its command both ignore it:
/// a hangup neither stops fencelock nor reaches the command (before, fencelock caught it, passed
/// it on, and the command, its handler reset by `exec`, died of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nohup_keeps_sighup_ignored() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_nohup");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut cmd = std::process::Command::new("nohup");
    cmd.arg(env!("CARGO_BIN_EXE_fencelock"))
        .env("FENCELOCK_ENDPOINTS", &t.url)
        .env("FENCELOCK_NAMESPACE", &ns)
        .env("FENCELOCK_TTL", "3s")
        .args([
            "lock",
            "m",
            "--",
            "sh",
            "-c",
            "echo $$ > pid; while :; do sleep 0.05; done",
        ]);
    let mut r = Run::spawn(cmd, d, "nohup");
    let command = pid_in(&d.join("pid")).await;
    let _left = KillOnDrop(vec![command]);
    let fencelock = r.child.pid().unwrap() as i32;
    assert!(r.child.signal(Signal::HUP));
    kill_process_group(Pid::from_raw(command).unwrap(), Signal::HUP).unwrap();
    // Both would be gone within milliseconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        alive(fencelock),
        "fencelock ended by SIGHUP: {}",
        r.output()
    );
    assert!(
        alive(command),
        "the command ended by SIGHUP: {}",
        r.output()
    );
    assert!(r.child.signal(Signal::TERM));
    assert_eq!(r.code(WITHIN).await, 143, "{}", r.output());
    assert!(!alive(command), "the command outlived fencelock");
}

/// A command ended by any signal that terminates (not only the common eight: SIGPROF, a
/// real-time signal) ends fencelock by the same signal, as `--help` says; one that dumps a core
/// gives 128 + N.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencelock_ends_by_the_signal_that_ended_its_command() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_end_by");
    let dir = tempfile::tempdir().unwrap();
    // SIGRTMIN + 2 under glibc (whose SIGRTMIN is 34).
    let rt = 36;
    for (kill, signal) in [
        ("PROF".to_string(), Some(Signal::PROF.as_raw())),
        (rt.to_string(), Some(rt)),
        ("USR1".to_string(), Some(Signal::USR1.as_raw())),
        ("SEGV".to_string(), None),
    ] {
        let script = format!("ulimit -c 0; kill -{kill} $$");
        let mut r = Run::start(
            &t.url,
            &ns,
            dir.path(),
            "end_by",
            &["lock", "m", "--", "sh", "-c", &script],
        );
        let status = r.exit(WITHIN).await;
        use std::os::unix::process::ExitStatusExt;
        match signal {
            Some(sig) => assert_eq!(status.signal(), Some(sig), "{kill}: {status:?}"),
            None => assert_eq!(status.code(), Some(128 + 11), "{kill}: {status:?}"),
        }
    }
}

/// The state letter of process `pid` (`R`, `S`, `T` for stopped, ...); `None` once it is gone.
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits (bounded) until every one of `pids` is stopped (`stopped`) or none is.
async fn until_stopped(pids: &[i32], stopped: bool, what: &str) {
    let start = Instant::now();
    while !pids.iter().all(|&p| (state(p) == Some('T')) == stopped) {
        let states: Vec<_> = pids.iter().map(|&p| state(p)).collect();
        assert!(start.elapsed() < WITHIN, "{what}: states {states:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Job control with the command in a process group of its own (a service's `kill -TSTP`):
/// SIGTSTP stops the command's whole tree with fencelock, a `setsid` daemon that ignores
/// SIGTSTP included (by SIGSTOP), and SIGCONT continues them (before, fencelock stopped alone and
/// the command ran on without heartbeats, past the TTL beside the next holder; then the daemon
/// did); stopped past the TTL (by SIGTTIN this time), the command is killed without running
/// again, and fencelock exits 76.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_control_stops_the_command_with_fencelock() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_tstp");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut cmd = command(&t.url, &ns);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.args([
        "lock",
        "m",
        "--grace",
        "1s",
        "--",
        "sh",
        "-c",
        "(setsid sh -c 'trap \"\" TSTP; echo $$ > daemon; while :; do sleep 0.05; done' &); \
         echo $$ > pid; while :; do echo x >> out; sleep 0.05; done",
    ]);
    let mut r = Run::spawn(cmd, d, "tstp");
    let command = pid_in(&d.join("pid")).await;
    let daemon = pid_in(&d.join("daemon")).await;
    let _left = KillOnDrop(vec![command, daemon]);
    let fencelock = r.child.pid().unwrap() as i32;
    let out = d.join("out");
    file_contains(&out, "x").await;
    // Stopped and continued within the TTL: all stop, all go on.
    assert!(r.child.signal(Signal::TSTP));
    until_stopped(&[fencelock, command, daemon], true, "stopped").await;
    assert!(r.child.signal(Signal::CONT));
    until_stopped(&[fencelock, command, daemon], false, "continued").await;
    grows_past(&out, size_of(&out), String::new).await;
    // Stopped past the TTL (3 s): the grant is lost; continued, the command never runs again.
    assert!(r.child.signal(Signal::TTIN));
    until_stopped(&[fencelock, command, daemon], true, "stopped again").await;
    let stopped_at = size_of(&out);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(r.child.signal(Signal::CONT));
    assert_eq!(r.code(WITHIN).await, 76, "{}", r.output());
    assert!(!alive(command), "the command outlived the lost grant");
    assert!(!alive(daemon), "the daemon outlived the lost grant");
    assert_eq!(
        size_of(&out),
        stopped_at,
        "the command ran again after the grant was lost"
    );
}

/// Processes a test started outside its own tree, killed (SIGKILL, by PID) when it ends, passed
/// or failed.
struct KillOnDrop(Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if alive(pid) {
                let _ = rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL);
            }
        }
    }
}

/// Whether `script` can make a pseudo-terminal here (util-linux; a sandbox may have no
/// `/dev/ptmx`); else the tests that need one say so and pass.
fn may_use_a_pty() -> bool {
    let probe = std::process::Command::new("script")
        .args(["-qec", "true", "/dev/null"])
        .env("SHELL", "/bin/sh")
        .stdin(std::process::Stdio::null())
        .output();
    let ok = probe.is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: script cannot make a pseudo-terminal here");
    }
    ok
}

/// Runs `fencelock lock m -- sh cmd.sh` (`cmd.sh` in `d` holding `script`) on a pseudo-terminal
/// of `script`'s, fencelock leading its session (TTL 3 s): `script`'s shell leads a new session
/// on the terminal, and `exec` makes fencelock that leader. (`setsid --ctty` took the terminal
/// from the shell's session instead, which the kernel allows only with CAP_SYS_ADMIN: not in
/// every sandbox.)
fn on_a_pty(t: &Target, ns: &str, d: &Path, script: &str, label: &str) -> Run {
    std::fs::write(d.join("cmd.sh"), script).unwrap();
    let inner = format!(
        "exec {} lock m -- sh {}",
        env!("CARGO_BIN_EXE_fencelock"),
        d.join("cmd.sh").display()
    );
    let mut cmd = std::process::Command::new("script");
    cmd.args(["-qec", &inner, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .env("FENCELOCK_ENDPOINTS", &t.url)
        .env("FENCELOCK_NAMESPACE", ns)
        .env("FENCELOCK_TTL", "3s");
    Run::spawn(cmd, d, label)
}

/// fencelock leading a session on a terminal (`ssh -t host fencelock …`), the command in its
/// process group: the terminal's hangup, which the kernel sends to the session's leader alone,
/// reaches the command (before, fencelock took it for one the terminal had sent the command
/// too, and the command ran on, holding the lock). The terminal is `script`'s pseudo-terminal,
/// fencelock its session's leader by `exec`; killing `script` hangs it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hangup_of_its_terminal_reaches_the_command() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    if !may_use_a_pty() {
        return;
    }
    let ns = unique_namespace("cli_tty_hup");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let r = on_a_pty(
        &t,
        &ns,
        d,
        "trap 'echo HUP >> hups; exit 0' HUP; echo $PPID > fencelock; echo $$ > pid; \
         while :; do sleep 0.05; done",
        "tty",
    );
    let command = pid_in(&d.join("pid")).await;
    // Outside our process tree once `script` is killed: killed here if the test fails.
    let _left = KillOnDrop(vec![fencelock_in(&d.join("fencelock")).await, command]);
    let s = t.session(&ns).await;
    assert_eq!(s.list_entries().await.unwrap().len(), 1, "{}", r.output());
    assert!(r.child.signal(Signal::KILL));
    file_contains(&d.join("hups"), "HUP").await;
    let start = Instant::now();
    while alive(command) || !s.list_entries().await.unwrap().is_empty() {
        assert!(start.elapsed() < WITHIN, "the lock was not released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.close().await.unwrap();
}

/// SIGHUP while waiting for the lock: fencelock removes its queue entry and exits 129 (it used
/// to die at once, its entry left until the TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_while_waiting_leaves_no_entry() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_hup");
    let dir = tempfile::tempdir().unwrap();
    let s = t.session(&ns).await;
    let held = s.mutex("m").unwrap().lock().await.unwrap();
    let mut w = Run::start(&t.url, &ns, dir.path(), "w", &["lock", "m", "--", "true"]);
    let start = Instant::now();
    while s.list_entries().await.unwrap().len() < 2 {
        assert!(start.elapsed() < WITHIN, "never queued: {}", w.output());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(w.child.signal(Signal::HUP));
    let status = w.exit(WITHIN).await;
    // Cleaned up, then ended by the signal itself (a shell tells that from an exit 129).
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(Signal::HUP.as_raw()),
        "{status:?}: {}",
        w.output()
    );
    assert_eq!(
        s.list_entries().await.unwrap(),
        vec![held.key().to_string()]
    );
    held.release().await.unwrap();
    s.close().await.unwrap();
}

/// A server that accepts connections and never answers: SIGTERM, SIGINT and SIGHUP stop
/// fencelock while it connects, for every subcommand, with 128 + N (not killed by the signal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_while_connecting() {
    let mut accepted = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    for scheme in ["etcd", "zk", "redis"] {
        for (args, sig, want) in [
            (&["lock", "m", "--", "true"][..], Signal::TERM, 143),
            (&["leader", "e"][..], Signal::INT, 130),
            (&["list"][..], Signal::HUP, 129),
        ] {
            // A listener per run: a connection the previous run opened late (etcd's client
            // has more than one) must not pass for this run's.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let silent = listener.local_addr().unwrap();
            let url = format!("{scheme}://{silent}");
            let mut cmd = command(&url, "ns");
            cmd.args(["--connect-timeout", "20s"]).args(args);
            let label = format!("{scheme}-{}", args[0]);
            let mut r = Run::spawn(cmd, dir.path(), &label);
            // Connected to the silent server: its signal handlers are in place (they come
            // first), and it waits for an answer that never comes.
            let (conn, _) = tokio::time::timeout(WITHIN, listener.accept())
                .await
                .unwrap_or_else(|_| panic!("{label} never connected: {}", r.output()))
                .unwrap();
            accepted.push((conn, listener));
            assert!(r.child.try_wait().is_none(), "{label}: {}", r.output());
            assert!(r.child.signal(sig));
            let status = r.exit(Duration::from_secs(10)).await;
            assert_eq!(
                shell_status(status),
                want,
                "{label}: {status:?} {}",
                r.output()
            );
        }
    }
    drop(accepted);
}

/// A server that accepts connections and never answers: `--connect-timeout` bounds connecting
/// and starting the session together, for every kind of cluster URL (against a silent
/// ZooKeeper server the two steps in a row took 2.5 times the bound), and fencelock exits 69.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_bounds_a_silent_server() {
    let dir = tempfile::tempdir().unwrap();
    let bound = Duration::from_secs(2);
    for scheme in ["etcd", "zk", "redis", "redis+sentinel", "redis+cluster"] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent = listener.local_addr().unwrap();
        // Every connection accepted and held open, unanswered (clients open more than one).
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let path = if scheme == "redis+sentinel" { "/m" } else { "" };
        let mut cmd = command(&format!("{scheme}://{silent}{path}"), "ns");
        cmd.args([
            "--connect-timeout",
            "2s",
            "lock",
            "--try",
            "x",
            "--",
            "true",
        ]);
        let start = Instant::now();
        let mut r = Run::spawn(cmd, dir.path(), scheme);
        // Generous (a loaded machine starts processes slowly), yet under the 2.5 times.
        let code = r.code(bound * 2 + Duration::from_secs(1)).await;
        assert_eq!(code, 69, "{scheme}: {}", r.output());
        // (A message said "though the cluster answered" of a silent ZooKeeper server.)
        assert!(!r.output().contains("answered"), "{scheme}: {}", r.output());
        assert!(
            start.elapsed() < bound * 2,
            "{scheme}: exited after {:?} with --connect-timeout {bound:?}",
            start.elapsed()
        );
        holder.abort();
    }
}

/// `observe` outlives its session: the Redis server paused past the TTL loses the observer's
/// session, and it starts a new one and goes on printing the changes (not ending with 69, as
/// it did), until interrupted (0). A private server: pausing it must not disturb other tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_outlives_a_lost_session() {
    use fencelock_integration::servers::redis::{available, Durability, RedisServer};
    if !available() {
        return;
    }
    let server = tokio::task::spawn_blocking(|| RedisServer::start(Durability::None))
        .await
        .unwrap();
    let ns = unique_namespace("cli_observe");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let url = format!("redis://{}", server.addr());
    let mut cmd = command(&url, &ns);
    cmd.args(["--ttl", "2s", "observe", "e"]);
    let mut r = Run::spawn(cmd, d, "observe");
    let log = d.join("observe.log");
    let campaign = |value: &'static str| {
        let backend = server.backend();
        let ns = ns.clone();
        async move {
            let s = Session::builder(backend.await)
                .namespace(&ns)
                .ttl(Duration::from_secs(2))
                .start()
                .await
                .unwrap();
            let l = s.election("e").unwrap().campaign(value).await.unwrap();
            (s, l)
        }
    };
    file_contains(&log, "no leader").await;
    let (s, l) = campaign("one").await;
    file_contains(&log, "one").await;
    l.resign().await.unwrap();
    s.close().await.unwrap();
    // Paused until the observer has noticed its session lost (its local deadline passes while
    // the server is silent), then resumed: its new session finds the server answering.
    server.pause();
    file_contains(&log, "starting a new session").await;
    server.resume();
    let (s, l) = campaign("two").await;
    file_contains(&log, "two").await;
    assert!(r.child.try_wait().is_none(), "{}", r.output());
    l.resign().await.unwrap();
    s.close().await.unwrap();
    assert!(r.child.signal(Signal::INT));
    assert_eq!(r.code(WITHIN).await, 0, "{}", r.output());
}

/// Whether this user may make PID namespaces (`unshare --pid`: root); else the tests that
/// need one say so and pass.
fn may_unshare() -> bool {
    let probe = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output();
    let ok = probe.is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: unshare --pid is not permitted here");
    }
    ok
}

/// Runs `fencelock lock m -- sh -c SCRIPT` in a new PID namespace (`unshare` with `flags`)
/// with `--grace 60s`; returns its exit status, how long it took, and its output.
async fn in_pid_namespace(t: &Target, flags: &[&str], script: &str) -> (Option<i32>, Duration) {
    let ns = unique_namespace("cli_pidns");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(flags)
        .arg(env!("CARGO_BIN_EXE_fencelock"))
        .args(["lock", "m", "--grace", "60s", "--", "sh", "-c"])
        .arg(format!("echo $FENCELOCK_TOKEN > token; {script}"))
        .env("FENCELOCK_ENDPOINTS", &t.url)
        .env("FENCELOCK_NAMESPACE", &ns);
    let start = Instant::now();
    let mut r = Run::spawn(cmd, d, "pidns");
    let status = r.exit(Duration::from_secs(90)).await;
    let took = start.elapsed();
    let token = std::fs::read_to_string(d.join("token")).unwrap_or_default();
    assert!(
        token.trim().parse::<u64>().is_ok_and(|t| t > 0),
        "{}",
        r.output()
    );
    let s = t.session(&ns).await;
    assert!(s.list_entries().await.unwrap().is_empty(), "{}", r.output());
    s.close().await.unwrap();
    (status.code(), took)
}

/// In a PID namespace whose session and process group leaders live outside it (a container's
/// shell, `unshare --pid`), the kernel reports those IDs as 0: fencelock panicked reading
/// them (rustix's `Pid` holds no 0), before running the command. It now runs it as anywhere,
/// and stops what the command left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_where_its_session_leader_is_not_visible() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    if !may_unshare() {
        return;
    }
    let flags = ["--pid", "--fork", "--mount-proc"];
    let (code, took) = in_pid_namespace(&t, &flags, "sleep 1000 & exit 3").await;
    assert_eq!(code, Some(3));
    assert!(
        took < Duration::from_secs(30),
        "{took:?}: waited out the grace"
    );
}

/// With a `/proc` of another PID namespace (`unshare --pid` without `--mount-proc`), fencelock
/// took that namespace's processes for its own: as PID 1 the whole host was "its" tree, which
/// never emptied (it waited out the grace and the kill, 65 s here, and signalled PIDs of the
/// wrong namespace). It now stops what it knows, the command's group, and ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proc_of_another_namespace_is_not_taken_for_ours() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    if !may_unshare() {
        return;
    }
    let (code, took) = in_pid_namespace(&t, &["--pid", "--fork"], "sleep 1000 & exit 3").await;
    assert_eq!(code, Some(3));
    assert!(
        took < Duration::from_secs(30),
        "{took:?}: waited out the grace"
    );
}

/// Started with SIGCHLD ignored (a daemon's child, `perl -e '$SIG{CHLD}="IGNORE"'`), fencelock
/// still ends with its command's status: the kernel reaped the command itself and fencelock
/// exited 70 ("waiting for the command: No child processes").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_ignoring_sigchld_still_gets_the_status() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_sigchld");
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new("perl");
    cmd.args(["-e", "$SIG{CHLD} = 'IGNORE'; exec @ARGV or die", "--"])
        .arg(env!("CARGO_BIN_EXE_fencelock"))
        .args(["lock", "m", "--", "sh", "-c", "exit 3"])
        .env("FENCELOCK_ENDPOINTS", &t.url)
        .env("FENCELOCK_NAMESPACE", &ns);
    let mut r = Run::spawn(cmd, dir.path(), "sigchld");
    let status = r.exit(WITHIN).await;
    assert_eq!(status.code(), Some(3), "{}", r.output());
    let s = t.session(&ns).await;
    assert!(s.list_entries().await.unwrap().is_empty(), "{}", r.output());
    s.close().await.unwrap();
}

/// Started with SIGPIPE ignored (systemd's `IgnoreSIGPIPE=yes`, `trap '' PIPE`), fencelock
/// starts its command with it ignored too, as the command would be without fencelock (it got
/// the default, Rust's runtime's reset for the processes it starts); started with the default,
/// the command gets the default. And no other signal is ignored: the command was started with
/// signals 32 and 33 ignored (by glibc's `posix_spawn`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ignored_sigpipe_stays_ignored_for_the_command() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_sigpipe");
    let dir = tempfile::tempdir().unwrap();
    for (label, disposition, ignored) in [
        ("ignored", "'IGNORE'", true),
        ("default", "'DEFAULT'", false),
    ] {
        let mut cmd = std::process::Command::new("perl");
        cmd.args([
            "-e",
            &format!("$SIG{{PIPE}} = {disposition}; exec @ARGV or die"),
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_fencelock"))
        .args([
            "lock",
            "m",
            "--",
            "sh",
            "-c",
            "grep SigIgn /proc/self/status",
        ])
        .env("FENCELOCK_ENDPOINTS", &t.url)
        .env("FENCELOCK_NAMESPACE", &ns);
        let mut r = Run::spawn(cmd, dir.path(), label);
        assert_eq!(r.code(WITHIN).await, 0, "{}", r.output());
        let out = r.output();
        let mask = out
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or_else(|| panic!("no SigIgn line: {out}"));
        let pipe = 1u64 << (Signal::PIPE.as_raw() - 1);
        // Nothing else ignored but what this test was started with (`nohup` passes SIGHUP
        // on): not glibc's own signals 32 and 33, which this test's spawn (a `posix_spawn`)
        // passes on ignored to perl and fencelock.
        let glibc = (1u64 << 31) | (1u64 << 32);
        let inherited = ignored_here() & !glibc & !pipe;
        let expected = inherited | if ignored { pipe } else { 0 };
        assert_eq!(mask, expected, "{label}: SigIgn {mask:x}");
    }
}

/// The signals this process ignores (`SigIgn` in `/proc/self/status`).
fn ignored_here() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mask = status.lines().find_map(|l| l.strip_prefix("SigIgn:"));
    u64::from_str_radix(mask.expect("SigIgn").trim(), 16).unwrap()
}

/// An interactive bash (job control on) on a pseudo-terminal of `script`'s, in `d`, lines
/// typed into it through `script`'s input; its output in `d/{label}.log`. `$FL` in a line is
/// fencelock, with the cluster and namespace in its environment and TTL `ttl`.
struct Shell {
    run: Run,
    input: std::process::ChildStdin,
    dir: std::path::PathBuf,
}

impl Shell {
    fn start(t: &Target, ns: &str, d: &Path, label: &str, ttl: &str) -> Shell {
        let log = d.join(format!("{label}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut child = std::process::Command::new("script")
            .args(["-qec", "bash --norc --noprofile -i", "/dev/null"])
            .current_dir(d)
            .env("SHELL", "/bin/sh")
            .env("PS1", "$ ")
            .env("FL", env!("CARGO_BIN_EXE_fencelock"))
            .env("FENCELOCK_ENDPOINTS", &t.url)
            .env("FENCELOCK_NAMESPACE", ns)
            .env("FENCELOCK_TTL", ttl)
            .stdin(std::process::Stdio::piped())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start script");
        let input = child.stdin.take().unwrap();
        let child = fencelock_integration::process::ManagedChild::adopt(label, child, &log);
        Shell {
            run: Run { child, log },
            input,
            dir: d.to_path_buf(),
        }
    }

    /// Types `$FL lock m -- sh cmd.sh` (a job in the background if `background`), `cmd.sh` in
    /// the shell's directory holding `script`, which writes `$PPID` to `fencelock` and `$$` to
    /// `pid`; returns fencelock's and the command's PIDs, killed when the guard is dropped.
    async fn job(&mut self, script: &str, background: bool) -> (i32, i32, KillOnDrop) {
        std::fs::write(self.dir.join("cmd.sh"), script).unwrap();
        self.type_in(if background {
            "$FL lock m -- sh cmd.sh &\n"
        } else {
            "$FL lock m -- sh cmd.sh\n"
        });
        let command = pid_in(&self.dir.join("pid")).await;
        let fencelock = fencelock_in(&self.dir.join("fencelock")).await;
        (fencelock, command, KillOnDrop(vec![fencelock, command]))
    }

    /// Types `text` (a `\n` ends a line; `\x03` is Ctrl-C).
    fn type_in(&mut self, text: &str) {
        use std::io::Write;
        self.input.write_all(text.as_bytes()).unwrap();
        self.input.flush().unwrap();
    }
}

/// Sends `sig` to process `pid`.
fn signal(pid: i32, sig: Signal) {
    rustix::process::kill_process(Pid::from_raw(pid).unwrap(), sig).unwrap()
}

/// A job of an interactive shell (the command shares fencelock's process group): a `kill
/// -TSTP` aimed at fencelock alone stops the command too, and SIGCONT to fencelock continues
/// it (the command ran on while fencelock, stopped, sent no heartbeat: past the TTL, beside
/// the next holder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_targeted_tstp_stops_the_command_of_a_job() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    if !may_use_a_pty() {
        return;
    }
    let ns = unique_namespace("cli_fg_tstp");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut sh = Shell::start(&t, &ns, d, "fg_tstp", "10s");
    let (fencelock, command, _left) = sh
        .job(
            "echo $PPID > fencelock; echo $$ > pid; while :; do echo x >> out; sleep 0.05; done",
            false,
        )
        .await;
    file_contains(&d.join("out"), "x").await;
    signal(fencelock, Signal::TSTP);
    until_stopped(&[fencelock, command], true, "stopped").await;
    signal(fencelock, Signal::CONT);
    until_stopped(&[fencelock, command], false, "continued").await;
    let out = d.join("out");
    grows_past(&out, size_of(&out), || sh.run.output()).await;
}

/// fencelock leading its session on a terminal (`ssh -t host fencelock …`): its process group
/// is orphaned, nothing could continue it, and the kernel discards SIGTSTP for the command; so
/// does fencelock (it stopped itself and its tree, for good, and the lock was lost after the
/// TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tstp_is_ignored_where_nothing_could_continue_it() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    if !may_use_a_pty() {
        return;
    }
    let ns = unique_namespace("cli_orphan_tstp");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let r = on_a_pty(
        &t,
        &ns,
        d,
        "echo $PPID > fencelock; echo $$ > pid; while :; do echo x >> out; sleep 0.05; done",
        "orphan_tstp",
    );
    let command = pid_in(&d.join("pid")).await;
    let fencelock = fencelock_in(&d.join("fencelock")).await;
    let _left = KillOnDrop(vec![fencelock, command]);
    file_contains(&d.join("out"), "x").await;
    signal(fencelock, Signal::TSTP);
    // Given time to stop (fencelock waits 300 ms for the tree, then 300 ms more).
    tokio::time::sleep(Duration::from_secs(2)).await;
    for pid in [fencelock, command] {
        assert_ne!(state(pid), Some('T'), "{pid} stopped: {}", r.output());
    }
    let out = d.join("out");
    let before = size_of(&out);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        size_of(&out) > before,
        "the command stopped: {}",
        r.output()
    );
}

/// A job started in the background whose command reads the terminal: the shell's `fg` brings
/// it back, and the command reads what is typed, as with `flock`. (The command, in a process
/// group of its own, stopped on its read, and `fg` could not reach it: the lock stayed held.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_job_reading_the_terminal_comes_back_with_fg() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    if !may_use_a_pty() {
        return;
    }
    let ns = unique_namespace("cli_bg_read");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut sh = Shell::start(&t, &ns, d, "bg_read", "20s");
    let (_, command, _left) = sh
        .job(
            "echo $PPID > fencelock; echo $$ > pid; read line; echo \"got:$line\" > got",
            true,
        )
        .await;
    until_stopped(&[command], true, "the read stops the command").await;
    sh.type_in("fg\n");
    until_stopped(&[command], false, "fg continues it").await;
    sh.type_in("hello\n");
    let got = file_contains(&d.join("got"), "\n").await;
    assert_eq!(got.trim(), "got:hello", "{}", sh.run.output());
    let s = t.session(&ns).await;
    let start = Instant::now();
    while !s.list_entries().await.unwrap().is_empty() {
        assert!(
            start.elapsed() < WITHIN,
            "not released: {}",
            sh.run.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.close().await.unwrap();
}

/// A job in a terminal's foreground: SIGINT sent to fencelock alone (`kill -INT`) is passed on
/// to the command (it was dropped: taken for the terminal's, which the command gets itself),
/// while a Ctrl-C typed at the terminal reaches the command once, from the terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigint_sent_to_fencelock_alone_reaches_the_command_once() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    if !may_use_a_pty() {
        return;
    }
    let ns = unique_namespace("cli_fg_int");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut sh = Shell::start(&t, &ns, d, "fg_int", "10s");
    let (fencelock, command, _left) = sh
        .job(
            "trap 'echo INT >> ints' INT; echo $PPID > fencelock; echo $$ > pid; \
         while :; do sleep 0.05; done",
            false,
        )
        .await;
    let lines = |path: &Path| {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .count()
    };
    signal(fencelock, Signal::INT);
    file_contains(&d.join("ints"), "INT").await;
    sh.type_in("\x03");
    let start = Instant::now();
    while lines(&d.join("ints")) < 2 {
        assert!(start.elapsed() < WITHIN, "Ctrl-C: {}", sh.run.output());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(lines(&d.join("ints")), 2, "{}", sh.run.output());
    assert!(alive(fencelock) && alive(command), "{}", sh.run.output());
}

/// SIGUSR1, SIGUSR2, SIGALRM and a real-time signal sent to fencelock while the command runs
/// are passed on to it, and fencelock goes on to exit with the command's status. (SIGUSR1
/// killed fencelock, and the command ran on without the lock: after the TTL, beside the next
/// holder.) Sent while fencelock waits, SIGALRM ends it by SIGALRM with its entry removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_terminating_signal_is_passed_on_or_ends_the_wait() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_usr1");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rt = libc::SIGRTMIN() + 3;
    let script = format!(
        "for s in USR1 USR2 ALRM {rt}; do trap \"echo $s >> got\" $s; done; echo $$ > pid; \
         while [ ! -e done ]; do sleep 0.05; done; exit 7"
    );
    let mut r = Run::start(
        &t.url,
        &ns,
        d,
        "usr1",
        &["lock", "m", "--", "bash", "-c", &script],
    );
    let fencelock = r.child.pid().unwrap() as i32;
    let _left = KillOnDrop(vec![pid_in(&d.join("pid")).await]);
    // SAFETY: a real-time signal applications may use; only sent.
    let rt_signal = unsafe { Signal::from_raw_unchecked(rt) };
    for (sig, name) in [
        (Signal::USR1, "USR1".to_string()),
        (Signal::USR2, "USR2".to_string()),
        (Signal::ALARM, "ALRM".to_string()),
        (rt_signal, rt.to_string()),
    ] {
        signal(fencelock, sig);
        file_contains(&d.join("got"), &format!("{name}\n")).await;
        assert!(alive(fencelock), "{name} ended fencelock: {}", r.output());
    }
    std::fs::write(d.join("done"), "").unwrap();
    assert_eq!(r.code(WITHIN).await, 7, "{}", r.output());

    // While waiting for the lock.
    let s = t.session(&ns).await;
    let held = s.mutex("m").unwrap().lock().await.unwrap();
    let mut r = Run::start(&t.url, &ns, d, "alrm", &["lock", "m", "--", "true"]);
    let start = Instant::now();
    while s.list_entries().await.unwrap().len() < 2 {
        assert!(start.elapsed() < WITHIN, "never queued: {}", r.output());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(r.child.signal(Signal::ALARM));
    assert_eq!(
        r.code(WITHIN).await,
        128 + Signal::ALARM.as_raw(),
        "{}",
        r.output()
    );
    assert_eq!(
        s.list_entries().await.unwrap().len(),
        1,
        "the entry was left"
    );
    held.release().await.unwrap();
    s.close().await.unwrap();
}

/// A lost grant (here its entry deleted) with a long `--grace`: the tree is SIGKILLed at once,
/// not after the grace (60 s; a command that ignores SIGTERM would have run that long beside
/// the next holder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_grant_kills_before_the_lock_can_move() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_grace_margin");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let s = t.session(&ns).await;
    let mut r = Run::start(
        &t.url,
        &ns,
        d,
        "margin",
        &[
            "lock",
            "m",
            "--grace",
            "60s",
            "--",
            "bash",
            "-c",
            "trap '' TERM; echo $$ > pid; while :; do sleep 0.05; done",
        ],
    );
    let command = pid_in(&d.join("pid")).await;
    let _left = KillOnDrop(vec![command]);
    let holder = s.mutex("m").unwrap().holder().await.unwrap().expect("held");
    let lost_at = Instant::now();
    t.factory.delete_as_admin(&holder.key).await.unwrap();
    assert_eq!(r.code(WITHIN).await, 76, "{}", r.output());
    assert!(!alive(command), "{}", r.output());
    // The loss is seen within a few hundred ms.
    assert!(
        lost_at.elapsed() < Duration::from_secs(5),
        "took {:?}: {}",
        lost_at.elapsed(),
        r.output()
    );
    s.close().await.unwrap();
}

/// A background job's `kill %1` (SIGTERM to the job's process group, which is fencelock's)
/// reaches the command once: fencelock passes it on, and the command, in a group of its own,
/// gets it from nobody else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_jobs_kill_reaches_the_command_once() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    if !may_use_a_pty() {
        return;
    }
    let ns = unique_namespace("cli_bg_kill");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut sh = Shell::start(&t, &ns, d, "bg_kill", "10s");
    let (_, _, _left) = sh
        .job(
            "trap 'echo TERM >> terms' TERM; echo $PPID > fencelock; echo $$ > pid; \
         while :; do sleep 0.05; done",
            true,
        )
        .await;
    sh.type_in("kill %1\n");
    file_contains(&d.join("terms"), "TERM").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let terms = std::fs::read_to_string(d.join("terms")).unwrap_or_default();
    assert_eq!(terms.lines().count(), 1, "{terms:?}: {}", sh.run.output());
}

/// A background job brought to the foreground (the terminal handed to the command's group): a
/// Ctrl-Z stops the command and fencelock with it, so that the shell sees the job stopped and
/// gives the prompt back (the shell, waiting for fencelock, would wait for ever); `fg`
/// continues both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_brought_to_the_foreground_stops_on_ctrl_z() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    if !may_use_a_pty() {
        return;
    }
    let ns = unique_namespace("cli_bg_fg_tstp");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut sh = Shell::start(&t, &ns, d, "bg_fg_tstp", "20s");
    let (fencelock, command, _left) = sh
        .job(
            "echo $PPID > fencelock; echo $$ > pid; while :; do echo x >> out; sleep 0.05; done",
            true,
        )
        .await;
    sh.type_in("fg\n");
    // The terminal goes to the command's group within a tick of fencelock's.
    let start = Instant::now();
    while foreground_group_of(fencelock) != Some(command) {
        assert!(
            start.elapsed() < WITHIN,
            "never handed over: {}",
            sh.run.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sh.type_in("\x1a");
    until_stopped(&[fencelock, command], true, "Ctrl-Z").await;
    sh.type_in("fg\n");
    until_stopped(&[fencelock, command], false, "fg").await;
    let out = d.join("out");
    grows_past(&out, size_of(&out), || sh.run.output()).await;
}

/// A Ctrl-Z at a terminal, fencelock and its command the shell's foreground job (one process
/// group), for longer than the session lasts: the keeper, which does not stop there, kills the
/// stopped tree at the deadline while fencelock is stopped still, so the shell's `fg`, which
/// continues the whole group at once, finds nothing to continue but fencelock, which exits 76.
/// Before, the keeper stopped with the command, and `fg` let the command run again for a few
/// milliseconds beside the next holder (black-box round 8: 1 to 3 runs of 4 on etcd and Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ctrl_z_past_the_deadline_leaves_nothing_to_continue() {
    let Some(t) = Target::redis().await else {
        return;
    };
    if !may_use_a_pty() {
        return;
    }
    let ns = unique_namespace("cli_ctrl_z");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut sh = Shell::start(&t, &ns, d, "ctrl_z", "2s");
    let (fencelock, command, _left) = sh
        .job(
            "echo $PPID > fencelock; echo $$ > pid; while :; do echo x >> out; sleep 0.05; done",
            false,
        )
        .await;
    file_contains(&d.join("out"), "x").await;
    sh.type_in("\x1a");
    // Both stop; the command may be gone already when first looked at (the deadline can come
    // a few polls after the Ctrl-Z: 1 run in 15 here), which is where this test leads anyway.
    let start = Instant::now();
    while state(fencelock) != Some('T') || !matches!(state(command), Some('T' | 'Z') | None) {
        let states = [state(fencelock), state(command)];
        assert!(start.elapsed() < WITHIN, "Ctrl-Z: states {states:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The local deadline, when the keeper kills, comes within the TTL (2 s) of the last
    // heartbeat.
    let start = Instant::now();
    while alive(command) {
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "the stopped command outlived the deadline: {}",
            sh.run.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state(fencelock), Some('T'), "fencelock is stopped still");
    sh.type_in("fg\n");
    sh.type_in("echo \"status $?\" > status\n");
    let status = file_contains(&d.join("status"), "\n").await;
    assert!(
        status.contains("status 76"),
        "{status}: {}",
        sh.run.output()
    );
    sh.type_in("exit\n");
}

/// The foreground process group of the terminal of process `pid` (`tpgid` of its stat).
fn foreground_group_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(5)?
        .parse()
        .ok()
}

/// A stderr that blocks (a full pipe nobody reads) does not stop fencelock midway: the
/// command's leftovers are stopped and the lock released all the same. fencelock stopped at
/// its message about the leftovers, which then ran on, and the lock stayed held, until the
/// pipe drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stderr_that_blocks_holds_nothing() {
    use std::os::fd::{AsFd, OwnedFd};
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_blocked_stderr");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A pipe filled to the brim, its reader kept open and never read.
    let (reader, writer): (OwnedFd, OwnedFd) = rustix::pipe::pipe().unwrap();
    let flags = rustix::fs::fcntl_getfl(&writer).unwrap();
    rustix::fs::fcntl_setfl(&writer, flags | rustix::fs::OFlags::NONBLOCK).unwrap();
    while rustix::io::write(writer.as_fd(), &[0u8; 4096]).is_ok() {}
    rustix::fs::fcntl_setfl(&writer, flags).unwrap();
    let script = format!("{TREE_BACKGROUND} exit 3");
    let mut cmd = tokio::process::Command::from(command(&t.url, &ns));
    cmd.args(["lock", "m", "--grace", "1s", "--", "bash", "-c", &script])
        .current_dir(d)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(writer))
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let status = tokio::time::timeout(WITHIN, child.wait())
        .await
        .expect("fencelock ended, its stderr blocked")
        .unwrap();
    assert_eq!(status.code(), Some(3), "{status:?}");
    let pids = [pid_in(&d.join("bg")).await, pid_in(&d.join("daemon")).await];
    all_gone("stderr blocked", &pids, d).await;
    let s = t.session(&ns).await;
    let g = s.mutex("m").unwrap().try_lock().await.unwrap();
    assert!(g.is_some(), "released");
    drop((g, reader));
    s.close().await.unwrap();
}

/// fencelock killed outright (SIGKILL: nothing of it runs to stop anything) takes its
/// command's whole tree with it: its keeper kills what is below it, a background job, a
/// daemon that called `setsid`, a pipeline. Only the command itself was killed before (by the
/// kernel's parent-death signal); what it started ran on, beside the next holder once the TTL
/// had passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_fencelock_takes_its_command_tree() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_killed");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut r = Run::start(
        &t.url,
        &ns,
        d,
        "killed",
        &["lock", "m", "--", "bash", "-c", TREE],
    );
    let pids = tree_pids(d).await;
    let _left = KillOnDrop(pids.clone());
    file_contains(&d.join("out"), "\n").await;
    assert!(r.child.signal(Signal::KILL));
    r.exit(WITHIN).await;
    let start = Instant::now();
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{left:?} of the tree {pids:?} outlived fencelock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    all_gone("killed", &pids, d).await;
}

/// The command stopped, then continued by a SIGCONT to it alone (a debugger's, a `kill -CONT`
/// of its PID): its keeper, stopped with it to stand for it, would stay stopped, and
/// fencelock, waiting for the keeper, held the lock for ever after the command had ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_continued_alone_still_ends_fencelock() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_cont_alone");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The command waits on it until the test writes a line.
    let go = d.join("go");
    rustix::fs::mkfifoat(rustix::fs::CWD, &go, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
    let mut r = Run::start(
        &t.url,
        &ns,
        d,
        "cont_alone",
        &[
            "lock",
            "m",
            "--",
            "sh",
            "-c",
            "echo $PPID > keeper; echo $$ > pid; read line < go; exit 7",
        ],
    );
    let command = pid_in(&d.join("pid")).await;
    let keeper = pid_in(&d.join("keeper")).await;
    let stopped = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            matches!(
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().as_bytes()[0]),
                Some(b'T')
            )
        })
    };
    signal(command, Signal::STOP);
    let start = Instant::now();
    while !stopped(keeper) {
        assert!(
            start.elapsed() < WITHIN,
            "the keeper never stood for the stop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(command, Signal::CONT);
    std::fs::write(&go, "go\n").unwrap();
    let status = r.exit(WITHIN).await;
    assert_eq!(shell_status(status), 7, "{}", r.output());
    let s = t.session(&ns).await;
    assert!(s.list_entries().await.unwrap().is_empty(), "released");
    s.close().await.unwrap();
}

/// A command that signals its own process group (`kill 0`), where its keeper is too, at once
/// as it starts: the keeper ignores it all, the fault and job-control signals too, from before
/// it runs (a SIGABRT ended the keeper, and the command with it; a SIGHUP sent while the
/// keeper's binary started did; a SIGTSTP stopped the keeper, and fencelock waited for it for
/// ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_signalling_its_group_keeps_its_keeper() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_kill_0");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let script = "for s in HUP USR1 ABRT TSTP TTIN; do trap \"echo $s >> got\" $s; done; \
                  for s in HUP USR1 ABRT TSTP TTIN; do kill -s $s 0; done; sleep 0.2; exit 5";
    let mut r = Run::start(
        &t.url,
        &ns,
        d,
        "kill_0",
        &["lock", "m", "--", "bash", "-c", script],
    );
    assert_eq!(r.code(WITHIN).await, 5, "{}", r.output());
    let got = std::fs::read_to_string(d.join("got")).unwrap_or_default();
    for s in ["HUP", "USR1", "ABRT", "TSTP", "TTIN"] {
        assert!(
            got.contains(s),
            "the command's trap for {s} never ran: {got:?}"
        );
    }
    assert!(!d.join("core").exists(), "a core file was left");
}

/// A SIGCONT right after a SIGTSTP (`kill -TSTP`, then `kill -CONT`, before fencelock has
/// stopped its command's tree, which takes up to 600 ms with a `setsid` daemon that ignores
/// SIGTSTP in its orphaned group) continues fencelock as it would any process: the stop is
/// over. fencelock stopped itself after the SIGCONT had come and gone, for good, its
/// heartbeats with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continue_right_after_a_stop_is_not_lost() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_tstp_cont");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut r = Run::start(
        &t.url,
        &ns,
        d,
        "tstp_cont",
        &[
            "lock",
            "m",
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
            "setsid sleep 1000 & echo $! > daemon; echo $$ > pid; \
             while [ ! -e done ]; do sleep 0.05; done; exit 3",
        ],
    );
    let fencelock = r.child.pid().unwrap() as i32;
    let _left = KillOnDrop(vec![pid_in(&d.join("daemon")).await]);
    pid_in(&d.join("pid")).await;
    signal(fencelock, Signal::TSTP);
    tokio::time::sleep(Duration::from_millis(150)).await;
    signal(fencelock, Signal::CONT);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stopped = state(fencelock) == Some('T');
    if stopped {
        // Not left stopped for the test's own end.
        signal(fencelock, Signal::CONT);
    }
    assert!(
        !stopped,
        "fencelock stayed stopped after SIGCONT: {}",
        r.output()
    );
    std::fs::write(d.join("done"), "").unwrap();
    assert_eq!(r.code(WITHIN).await, 3, "{}", r.output());
}

/// Started with SIGTERM blocked (a parent's mask passes across `exec`), fencelock still acts
/// on it: the command gets it and fencelock ends as it did (it used to run on, deaf to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_sigterm_still_ends_fencelock() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_blocked");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut cmd = command(&t.url, &ns);
    cmd.args([
        "lock",
        "m",
        "--",
        "sh",
        "-c",
        "echo $$ > pid; while :; do sleep 0.05; done",
    ]);
    // SAFETY: `sigemptyset`, `sigaddset` and `sigprocmask` are async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut r = Run::spawn(cmd, d, "blocked");
    let pid = pid_in(&d.join("pid")).await;
    assert!(r.child.signal(Signal::TERM));
    assert_eq!(
        r.code(WITHIN).await,
        128 + Signal::TERM.as_raw(),
        "{}",
        r.output()
    );
    assert!(!alive(pid), "the command {pid} outlived its fencelock");
}
