//! The `fencelock` binary end to end, against the real etcd, ZooKeeper and Redis servers the
//! integration harness starts: exclusion between processes, the token in the command's
//! environment, a lost lock stopping the command (deleted on the server; a client cut off by a
//! proxy), signals passed on and a hand-off in milliseconds, exit statuses, the election and
//! inspection commands, and interop with `etcdctl lock` / `etcdctl elect`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fencelock::conformance::unique_namespace;
use fencelock_integration::process::ManagedChild;
use fencelock_integration::proxy::{Mode, Proxy};
use rustix::process::Signal;

#[macro_use]
mod common;
use common::*;

/// Three processes contend: their commands never overlap, each sees its token, key and name,
/// and tokens increase.
async fn exclusion_and_environment(t: Target) {
    let ns = unique_namespace("cli_exclusion");
    let dir = tempfile::tempdir().unwrap();
    let script = r#"echo "start $FENCELOCK_TOKEN $FENCELOCK_NAME" >> log; [ -n "$FENCELOCK_KEY" ] && echo "key $FENCELOCK_KEY" >> keys; sleep 0.2; echo "end $FENCELOCK_TOKEN" >> log"#;
    let mut runs: Vec<Run> = (0..3)
        .map(|i| {
            Run::start(
                &t.url,
                &ns,
                dir.path(),
                &format!("p{i}"),
                &["lock", "jobs/x", "--", "sh", "-c", script],
            )
        })
        .collect();
    for r in &mut runs {
        assert_eq!(r.code(WITHIN).await, 0, "{}", r.output());
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let lines: Vec<Vec<&str>> = log.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 6, "{log}");
    let mut last = 0u64;
    for pair in lines.chunks(2) {
        assert_eq!(pair[0][0], "start", "{log}");
        assert_eq!(pair[1][0], "end", "no overlap: {log}");
        assert_eq!(pair[0][1], pair[1][1], "{log}");
        assert_eq!(pair[0][2], "jobs/x");
        let token: u64 = pair[0][1].parse().unwrap();
        assert!(token > last, "tokens increase: {log}");
        last = token;
    }
    let keys = std::fs::read_to_string(dir.path().join("keys")).unwrap();
    assert_eq!(keys.lines().count(), 3, "{keys}");
}

/// The documented exit statuses.
async fn exit_statuses(t: Target) {
    let ns = unique_namespace("cli_exits");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let s = t.session(&ns).await;
    let held = s.mutex("held").unwrap().lock().await.unwrap();
    let cases: &[(&[&str], i32)] = &[
        (&["lock", "free", "--", "sh", "-c", "exit 3"], 3),
        (&["lock", "free", "--", "sh", "-c", "kill -TERM $$"], 143),
        (&["lock", "free", "--", "/nonexistent/command"], 127),
        (&["lock", "held", "--try", "--", "true"], 75),
        (&["lock", "held", "--timeout", "300ms", "--", "true"], 75),
        (&["lock", "a//b", "--", "true"], 78),
        (&["lock", "x", "--grace", "99999h", "--", "true"], 2),
        (&["lock", "x"], 2),
    ];
    for (args, want) in cases {
        let (code, out) = run(&t.url, &ns, d, args).await;
        assert_eq!(code, *want, "{args:?}: {out}");
    }
    // A zero timeout is a try, and said as one (not "timed out after 0ns").
    let (code, out) = run(
        &t.url,
        &ns,
        d,
        &["lock", "held", "--timeout", "0s", "--", "true"],
    )
    .await;
    assert_eq!(code, 75, "{out}");
    assert!(out.contains("\"held\" is held: not acquired"), "{out}");
    // Nothing of the refused attempts is left: only our holder's entry.
    assert_eq!(
        s.list_entries().await.unwrap(),
        vec![held.key().to_string()]
    );
    let (code, out) = run(
        "memcached://127.0.0.1:1",
        &ns,
        d,
        &["lock", "x", "--", "true"],
    )
    .await;
    assert_eq!(code, 78, "{out}");
    let port = fencelock_integration::free_port();
    let scheme = t.url.split("://").next().unwrap();
    let dead = format!("{scheme}://127.0.0.1:{port}");
    let (code, out) = run(
        &dead,
        &ns,
        d,
        &["--connect-timeout", "2s", "lock", "x", "--", "true"],
    )
    .await;
    assert_eq!(code, 69, "{out}");
    // Said as such on every backend (etcd said "no session within the connect timeout":
    // black-box round 37).
    assert!(out.to_lowercase().contains("refused"), "{out}");
    // Named as typed (ZooKeeper's said `tcp://`, etcd's causes `http://`: rounds 39 and 40).
    assert!(out.contains(&format!("{dead}:")), "{out}");
    assert!(!out.contains("tcp://") && !out.contains("http://"), "{out}");
    // A setting the server refuses as the connection is set up (a Redis database it does not
    // have) is bad configuration, not an unreachable cluster; the message says why.
    if scheme == "redis" {
        let (code, out) = run(
            &format!("{}/99", t.url),
            &ns,
            d,
            &["lock", "x", "--", "true"],
        )
        .await;
        assert_eq!(code, 78, "{out}");
        assert!(out.contains("out of range"), "{out}");
    }
    held.release().await.unwrap();
    s.close().await.unwrap();
}

/// The holder's entry deleted on the server: the lock may be the next holder's at once, so the
/// command is SIGKILLed at once (its SIGTERM trap does not run, whatever `--grace`), and
/// fencelock exits 76. (So is a grant lost by the local deadline: `lost_by_cut_off`.)
async fn lost_by_deletion(t: Target) {
    let ns = unique_namespace("cli_lost");
    let dir = tempfile::tempdir().unwrap();
    let s = t.session(&ns).await;
    for (label, script, grace) in [
        (
            "polite",
            r#"trap 'echo TERM > term; exit 0' TERM; echo $$ > pid; while :; do sleep 0.05; done"#,
            "10s",
        ),
        (
            "stubborn",
            r#"trap '' TERM; echo $$ > pid; while :; do sleep 0.05; done"#,
            "300ms",
        ),
    ] {
        let _ = std::fs::remove_file(dir.path().join("pid"));
        let mut r = Run::start(
            &t.url,
            &ns,
            dir.path(),
            label,
            &["lock", "m", "--grace", grace, "--", "sh", "-c", script],
        );
        file_contains(&dir.path().join("pid"), "\n").await;
        let holder = s.mutex("m").unwrap().holder().await.unwrap().expect("held");
        t.factory.delete_as_admin(&holder.key).await.unwrap();
        let started = Instant::now();
        assert_eq!(r.code(WITHIN).await, 76, "{}", r.output());
        assert!(r.output().contains("lost"), "{}", r.output());
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "{label}: stopped after {took:?}"
        );
        assert!(
            !dir.path().join("term").exists(),
            "{label}: the command ran its SIGTERM trap beside the next holder"
        );
        let pid: i32 = std::fs::read_to_string(dir.path().join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid),
            "{label}: the command was stopped"
        );
    }
    s.close().await.unwrap();
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// A holder cut off from the cluster loses the lock at its local deadline: its command is
/// killed (its SIGTERM trap does not run), and the next holder is granted only after the
/// command's last sign of life. Cut off by a proxy that forwards nothing (`BlackHole`), the
/// lock goes when the cluster expires the session. Cut off one way (`BlackHoleReplies`: the
/// heartbeats reach the cluster, which keeps the session, but no reply comes back), fencelock
/// closes the session once the command is dead, and the next holder is granted then, not when
/// the cluster expires it (at the local deadline, the session used to be closed at once, in a
/// race with the command's kill).
async fn lost_by_cut_off(t: Target, upstream: &str, mode: Mode) {
    let ns = unique_namespace("cli_cut_off");
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(upstream).await;
    let scheme = t.url.split("://").next().unwrap();
    let url = format!("{scheme}://{}", proxy.addr());
    // Its signs of life: wall-clock nanoseconds, every 10 ms.
    let script = r#"trap 'echo TERM > term; exit 0' TERM; echo started > started; while :; do date +%s%N >> alive; sleep 0.01; done"#;
    let mut r = Run::start(
        &url,
        &ns,
        dir.path(),
        "cut",
        &["lock", "m", "--", "sh", "-c", script],
    );
    file_contains(&dir.path().join("started"), "started").await;
    let s = t.session(&ns).await;
    let next = tokio::spawn({
        let m = s.mutex("m").unwrap();
        async move { (m.lock().await, Instant::now()) }
    });
    proxy.set(mode);
    assert_eq!(r.code(WITHIN).await, 76, "{}", r.output());
    assert!(
        !dir.path().join("term").exists(),
        "the command ran its SIGTERM trap after the grant was lost"
    );
    let (g, granted) = tokio::time::timeout(WITHIN, next).await.unwrap().unwrap();
    let granted = std::time::SystemTime::now() - granted.elapsed();
    let g = g.unwrap();
    let granted = granted
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let alive = std::fs::read_to_string(dir.path().join("alive")).unwrap();
    let stamps: Vec<u128> = alive.lines().filter_map(|l| l.parse().ok()).collect();
    assert!(stamps.len() > 20, "the command barely ran: {alive}");
    let last = *stamps.last().unwrap();
    assert!(
        last < granted,
        "the cut-off command ran {} µs after the next grant",
        (last - granted) / 1000
    );
    // A ZooKeeper client sends its close only on a connection whose handshake was answered:
    // the server expires the session.
    if mode == Mode::BlackHoleReplies && scheme != "zk" {
        // Closed by fencelock: the cluster would have kept the session a margin longer.
        let after = Duration::from_nanos((granted - last) as u64);
        assert!(
            after < Duration::from_millis(1500),
            "granted {after:?} after the command's end: left to the cluster's expiry? {}",
            r.output()
        );
    }
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// A cluster that stops answering once the session is up (a server that hangs, a partition
/// without resets) does not hold a `--timeout` wait past its bound: fencelock gives up once the
/// wait has run out and the cluster has not answered for the connect timeout more, and exits
/// 69, after a second more to close the session. It waited for the session's local deadline,
/// 48 s at a TTL of 60 s, and later, for another connect timeout to close the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_cluster_does_not_hold_a_timed_wait() {
    let Some(t) = Target::redis().await else {
        return;
    };
    let ns = unique_namespace("cli_hung_wait");
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(t.url.trim_start_matches("redis://")).await;
    let s = t.session(&ns).await;
    let held = s.mutex("m").unwrap().lock().await.unwrap();
    let mut cmd = command(&format!("redis://{}", proxy.addr()), &ns);
    cmd.args(["--ttl", "60s", "--connect-timeout", "4s"]).args([
        "lock",
        "m",
        "--timeout",
        "2s",
        "--",
        "true",
    ]);
    let started = Instant::now();
    let mut r = Run::spawn(cmd, dir.path(), "hung");
    // Queued behind the holder, then cut off.
    let queued = Instant::now();
    while s.mutex("m").unwrap().waiters().await.unwrap().is_empty() {
        assert!(queued.elapsed() < WITHIN, "never queued: {}", r.output());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.set(Mode::BlackHole);
    let cut = Instant::now();
    assert_eq!(r.code(Duration::from_secs(40)).await, 69, "{}", r.output());
    let after = started.elapsed();
    // 2 s of wait, 4 s of connect timeout, 1 s to close: 7 s (with another connect timeout to
    // close, 10 s).
    assert!(
        after < Duration::from_millis(8500),
        "ended {after:?} after its start, {:?} after the cut: {}",
        cut.elapsed(),
        r.output()
    );
    held.release().await.unwrap();
    s.close().await.unwrap();
}

/// Output that cannot be written (a full disk) is an error, said, not a silent success:
/// `list`, `leader` and `--help` exited 0 with nothing written. Nobody reading any more
/// (`| head -1`) still ends quietly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_that_cannot_be_written_fails() {
    let Some(t) = Target::redis().await else {
        return;
    };
    let ns = unique_namespace("cli_full");
    let s = t.session(&ns).await;
    let led = s.election("e").unwrap().campaign(b"v").await.unwrap();
    let runs_nothing = [&["--help"][..], &["lock", "--help"][..], &["--version"][..]];
    for args in [&["list"][..], &["leader", "e"][..]]
        .into_iter()
        .chain(runs_nothing)
    {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = tokio::task::spawn_blocking({
            let mut cmd = command(&t.url, &ns);
            cmd.args(args).stdout(full);
            move || cmd.output().unwrap()
        })
        .await
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(70), "{args:?}: {err}");
        assert!(err.contains("cannot write"), "{args:?}: {err}");
    }
    led.resign().await.unwrap();
    s.close().await.unwrap();
}

/// SIGTERM to fencelock reaches the command; once it exits the lock goes to the next process at
/// once (milliseconds, not a TTL); the exit status is the command's.
async fn signals_are_passed_on(t: Target) {
    let ns = unique_namespace("cli_signals");
    let dir = tempfile::tempdir().unwrap();
    let a = Run::start(
        &t.url,
        &ns,
        dir.path(),
        "a",
        &[
            "lock",
            "m",
            "--",
            "sh",
            "-c",
            r#"trap 'echo TERM > a-term; exit 0' TERM; echo a > a-started; while :; do sleep 0.05; done"#,
        ],
    );
    file_contains(&dir.path().join("a-started"), "a").await;
    let mut b = Run::start(
        &t.url,
        &ns,
        dir.path(),
        "b",
        &["lock", "m", "--", "sh", "-c", "echo b > b-started"],
    );
    let s = t.session(&ns).await;
    let start = Instant::now();
    while s.list_entries().await.unwrap().len() < 2 {
        assert!(start.elapsed() < WITHIN, "b never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut a = a;
    let sent = Instant::now();
    assert!(a.child.signal(Signal::TERM));
    file_contains(&dir.path().join("b-started"), "b").await;
    let handover = sent.elapsed();
    assert_eq!(a.code(WITHIN).await, 0, "{}", a.output());
    assert!(std::fs::read_to_string(dir.path().join("a-term"))
        .unwrap()
        .contains("TERM"));
    assert_eq!(b.code(WITHIN).await, 0, "{}", b.output());
    println!("{}: hand-off after SIGTERM {handover:?}", t.url);
    assert!(
        handover < Duration::from_secs(2),
        "hand-off took {handover:?}"
    );
    // A signal while still waiting for the lock: no entry left behind.
    let held = s.mutex("m").unwrap().lock().await.unwrap();
    let mut w = Run::start(&t.url, &ns, dir.path(), "w", &["lock", "m", "--", "true"]);
    while s.list_entries().await.unwrap().len() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(w.child.signal(Signal::INT));
    assert_eq!(w.code(WITHIN).await, 130, "{}", w.output());
    assert_eq!(
        s.list_entries().await.unwrap(),
        vec![held.key().to_string()]
    );
    held.release().await.unwrap();
    s.close().await.unwrap();
}

/// `elect`, `leader` (text and JSON), `observe` (one JSON line per change, no leader included)
/// and `list`.
async fn elections_and_listing(t: Target) {
    let ns = unique_namespace("cli_elect");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (code, out) = run(&t.url, &ns, d, &["leader", "primary"]).await;
    assert_eq!(code, 75, "{out}");
    assert!(out.contains("no leader"), "{out}");
    let mut observe = Run::start(
        &t.url,
        &ns,
        d,
        "observe",
        &["-o", "json", "observe", "primary"],
    );
    file_contains(&observe.log, r#""leader":null"#).await;
    let mut leader = Run::start(
        &t.url,
        &ns,
        d,
        "leader",
        &[
            "elect",
            "primary",
            "--value",
            "node-a:8080",
            "--",
            "sh",
            "-c",
            r#"echo "$FENCELOCK_TOKEN" > epoch; while :; do sleep 0.05; done"#,
        ],
    );
    let epoch = file_contains(&d.join("epoch"), "\n").await;
    let epoch: u64 = epoch.trim().parse().unwrap();
    let (code, out) = run(&t.url, &ns, d, &["-o", "json", "leader", "primary"]).await;
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(v["leader"]["value"], "node-a:8080");
    assert_eq!(v["leader"]["epoch"], epoch);
    let (code, out) = run(&t.url, &ns, d, &["elect", "primary", "--try", "--", "true"]).await;
    assert_eq!(code, 75, "{out}");
    // A waiting lock and its holder, as `list` shows them.
    let s = t.session(&ns).await;
    let g = s.mutex("jobs/a").unwrap().lock().await.unwrap();
    let mut waiter = Run::start(&t.url, &ns, d, "waiter", &["lock", "jobs/a", "--", "true"]);
    while s.list_entries().await.unwrap().len() < 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (code, out) = run(&t.url, &ns, d, &["-o", "json", "list", "jobs/"]).await;
    assert_eq!(code, 0, "{out}");
    let q: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(q["name"], "jobs/a");
    // As the text says it: a lock and an election are kept alike on etcd and Redis.
    let kind = match t.url.starts_with("zk") {
        true => "lock",
        false => "lock or election",
    };
    assert_eq!(q["kind"], kind, "{out}");
    assert_eq!(q["entries"][0]["role"], "holder");
    assert_eq!(q["entries"][0]["token"], g.token().get());
    assert_eq!(q["entries"][0]["session"], s.id());
    assert_eq!(q["entries"][1]["role"], "waiter");
    // Another tool's keys under the namespace are skipped, and counted, not fatal.
    let foreign = t.factory.write_foreign_keys(&ns, &s.id()).await.unwrap();
    let (code, out) = run(&t.url, &ns, d, &["list"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("primary") && out.contains("node-a:8080") && out.contains("jobs/a"),
        "{out}"
    );
    // An election is not called a lock where the layout cannot tell them apart.
    let label = match t.url.starts_with("zk") {
        true => "primary (election)",
        false => "primary (lock or election)",
    };
    assert!(out.contains(label), "{out}");
    if foreign > 0 {
        assert!(out.contains(&format!("skipped {foreign} key")), "{out}");
    }
    // A prefix no name could start with is bad input, not an empty listing.
    let long = "n".repeat(10_000);
    let (code, out) = run(&t.url, &ns, d, &["list", &long]).await;
    assert_eq!(code, 78, "{out}");
    g.release().await.unwrap();
    assert_eq!(waiter.code(WITHIN).await, 0);
    // The leader steps down: observe prints no leader.
    assert!(leader.child.signal(Signal::TERM));
    leader.exit(WITHIN).await;
    let seen = file_contains(&observe.log, "node-a:8080").await;
    assert!(seen.contains(&format!(r#""epoch":{epoch}"#)), "{seen}");
    let start = Instant::now();
    while observe.output().matches(r#""leader":null"#).count() < 2 {
        assert!(start.elapsed() < WITHIN, "{}", observe.output());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(observe.child.signal(Signal::INT));
    assert_eq!(observe.code(WITHIN).await, 0);
    s.close().await.unwrap();
}

on_each!(
    exclusion_and_environment,
    exit_statuses,
    lost_by_deletion,
    signals_are_passed_on,
    elections_and_listing,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cut_off_holder_is_stopped() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let upstream = t.url.trim_start_matches("etcd://").to_string();
    lost_by_cut_off(t.clone(), &upstream, Mode::BlackHole).await;
    lost_by_cut_off(t, &upstream, Mode::BlackHoleReplies).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_cut_off_holder_is_stopped() {
    let Some(t) = Target::zookeeper().await else {
        return;
    };
    let upstream = t.url.trim_start_matches("zk://").to_string();
    lost_by_cut_off(t.clone(), &upstream, Mode::BlackHole).await;
    lost_by_cut_off(t, &upstream, Mode::BlackHoleReplies).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cut_off_holder_is_stopped() {
    let Some(t) = Target::redis().await else {
        return;
    };
    let upstream = t.url.trim_start_matches("redis://").to_string();
    lost_by_cut_off(t.clone(), &upstream, Mode::BlackHole).await;
    lost_by_cut_off(t, &upstream, Mode::BlackHoleReplies).await;
}

/// A connection whose answers are lost (a middlebox that drops one direction of a stream) is
/// not waited on for the whole connect timeout: a new one is opened beside it after a second
/// (then two, four, …), and once the path heals the command runs. fencelock waited on its
/// first connection and exited 69 at the connect timeout, and so did `observe` replacing a
/// lost session (black-box round 16).
async fn connects_past_lost_answers(t: Target, upstream: &str) {
    let ns = unique_namespace("cli_lost_answers");
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(upstream).await;
    proxy.set(Mode::DropReplies);
    let scheme = t.url.split("://").next().unwrap();
    let mut cmd = command(&format!("{scheme}://{}", proxy.addr()), &ns);
    // The default connect timeout, and a TTL whose ZooKeeper connection timeout (0.6 of it)
    // is longer: the client library gives up on no connection of its own meanwhile.
    cmd.args([
        "--connect-timeout",
        "5s",
        "--ttl",
        "10s",
        "lock",
        "m",
        "--",
        "true",
    ]);
    let started = Instant::now();
    let mut r = Run::spawn(cmd, dir.path(), "lost_answers");
    // The fault's length, not a synchronisation: the first two connections (at 0 s and 1 s)
    // are opened during it, and lose their answers for good.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.set(Mode::Pass);
    assert_eq!(r.code(WITHIN).await, 0, "{scheme}: {}", r.output());
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "{scheme}: granted {took:?} after the start: a connection opened after the heal was not tried at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_connects_past_lost_answers() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let upstream = t.url.trim_start_matches("etcd://").to_string();
    connects_past_lost_answers(t, &upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_connects_past_lost_answers() {
    let Some(t) = Target::zookeeper().await else {
        return;
    };
    let upstream = t.url.trim_start_matches("zk://").to_string();
    connects_past_lost_answers(t, &upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_connects_past_lost_answers() {
    let Some(t) = Target::redis().await else {
        return;
    };
    let upstream = t.url.trim_start_matches("redis://").to_string();
    connects_past_lost_answers(t, &upstream).await;
}

/// `etcdctl` (Debian's `etcd-client`), the etcd Go `concurrency` recipes' own command: the same
/// lock and election keys. `fencelock lock X` in namespace `N` is `etcdctl lock N/X`.
mod etcdctl {
    use super::*;

    fn etcdctl(endpoint: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=http://{endpoint}"))
            .args(args);
        cmd
    }

    fn installed() -> bool {
        let ok = Command::new("etcdctl").arg("version").output().is_ok();
        if !ok {
            assert!(
                !fencelock_integration::in_ci(),
                "etcdctl (Debian's etcd-client) is required in CI"
            );
            eprintln!("skipped: etcdctl is not installed (Debian's etcd-client)");
        }
        ok
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn locks_exclude_each_other_both_ways() {
        let Some(t) = Target::etcd().await else {
            return;
        };
        if !installed() {
            return;
        }
        let ep = t.url.trim_start_matches("etcd://").to_string();
        let ns = unique_namespace("cli_etcdctl");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // etcdctl holds: ours waits, then runs after etcdctl's command ended.
        let log = d.join("log");
        let mut cmd = etcdctl(
            &ep,
            &[
                "lock",
                &format!("{ns}/x"),
                "--",
                "sh",
                "-c",
                "echo etcdctl-start >> log; sleep 1; echo etcdctl-end >> log",
            ],
        );
        cmd.current_dir(d);
        let mut theirs = ManagedChild::spawn("etcdctl", cmd, &d.join("etcdctl.log")).unwrap();
        file_contains(&log, "etcdctl-start").await;
        let (code, out) = run(&t.url, &ns, d, &["lock", "x", "--try", "--", "true"]).await;
        assert_eq!(code, 75, "etcdctl holds: {out}");
        let (code, out) = run(
            &t.url,
            &ns,
            d,
            &["lock", "x", "--", "sh", "-c", "echo ours >> log"],
        )
        .await;
        assert_eq!(code, 0, "{out}");
        let order = std::fs::read_to_string(&log).unwrap();
        assert_eq!(order, "etcdctl-start\netcdctl-end\nours\n");
        let start = Instant::now();
        while theirs.try_wait().is_none() {
            assert!(start.elapsed() < WITHIN);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Ours holds: etcdctl's command runs after ours ended.
        std::fs::remove_file(&log).unwrap();
        let mut ours = Run::start(
            &t.url,
            &ns,
            d,
            "ours",
            &[
                "lock",
                "x",
                "--",
                "sh",
                "-c",
                "echo ours-start >> log; sleep 1; echo ours-end >> log",
            ],
        );
        file_contains(&log, "ours-start").await;
        let mut cmd = etcdctl(
            &ep,
            &[
                "lock",
                &format!("{ns}/x"),
                "--",
                "sh",
                "-c",
                "echo etcdctl >> log",
            ],
        );
        cmd.current_dir(d);
        let mut theirs = ManagedChild::spawn("etcdctl", cmd, &d.join("etcdctl2.log")).unwrap();
        assert_eq!(ours.code(WITHIN).await, 0);
        file_contains(&log, "etcdctl").await;
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "ours-start\nours-end\netcdctl\n"
        );
        let start = Instant::now();
        while theirs.try_wait().is_none() {
            assert!(start.elapsed() < WITHIN);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn elections_are_shared() {
        let Some(t) = Target::etcd().await else {
            return;
        };
        if !installed() {
            return;
        }
        let ep = t.url.trim_start_matches("etcd://").to_string();
        let ns = unique_namespace("cli_etcdctl_elect");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let theirs = ManagedChild::spawn(
            "etcdctl elect",
            etcdctl(&ep, &["elect", &format!("{ns}/primary"), "etcdctl-node"]),
            &d.join("elect.log"),
        )
        .unwrap();
        let start = Instant::now();
        let (code, out) = loop {
            let (code, out) = run(&t.url, &ns, d, &["leader", "primary"]).await;
            if code == 0 || start.elapsed() > WITHIN {
                break (code, out);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("etcdctl-node"), "{out}");
        let (code, _) = run(&t.url, &ns, d, &["elect", "primary", "--try", "--", "true"]).await;
        assert_eq!(code, 75, "etcdctl leads");
        let mut ours = Run::start(
            &t.url,
            &ns,
            d,
            "ours",
            &[
                "elect",
                "primary",
                "--value",
                "ours",
                "--",
                "sh",
                "-c",
                "echo led > led",
            ],
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!d.join("led").exists(), "we wait while etcdctl leads");
        // etcdctl resigns on SIGINT.
        assert!(theirs.signal(Signal::INT));
        assert_eq!(ours.code(WITHIN).await, 0, "{}", ours.output());
        file_contains(&d.join("led"), "led").await;
    }
}

/// `completions` prints a script for each shell, without a cluster.
#[test]
fn completion_scripts() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(env!("CARGO_BIN_EXE_fencelock"))
            .env_remove("FENCELOCK_ENDPOINTS")
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("fencelock") && script.contains("observe"),
            "{shell}"
        );
    }
}

/// An option given on the command line overrides its variable, even one whose value is
/// malformed: clap checked the variable of a global option given after the subcommand, and
/// `FENCELOCK_TTL=bogus fencelock lock x --ttl 5s ...` was a usage error. A malformed variable
/// that is not overridden still is one.
#[test]
fn an_option_overrides_a_malformed_variable() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_fencelock"))
            .env_remove("FENCELOCK_ENDPOINTS")
            .env("FENCELOCK_TTL", "bogus")
            .env("FENCELOCK_OUTPUT", "bogus")
            .args(args)
            .output()
            .unwrap()
    };
    for args in [
        &["--ttl", "5s", "-o", "json", "completions", "bash"][..],
        &["completions", "bash", "--ttl", "5s", "--output", "json"][..],
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
    }
    for args in [
        &["completions", "bash", "--ttl", "5s"][..],
        &["-o", "text", "completions", "bash"][..],
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("bogus"), "{args:?}: {err}");
    }
}

/// Inputs refused before anything connects, each named (black-box round 14): a negative
/// duration (clap said "unexpected argument '-1'"), a variable that is not UTF-8 (clap named
/// none), an etcd namespace in the URL ending in '/' (read as another namespace), an etcd
/// endpoint without its port (the message echoed `http://HOST`). Port 1 on loopback: nothing
/// is connected to, and the usage errors come before any attempt.
#[test]
fn bad_inputs_are_named_before_connecting() {
    use std::os::unix::ffi::OsStrExt;
    let run = |args: &[&str], var: Option<&std::ffi::OsStr>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencelock"));
        cmd.env_remove("FENCELOCK_ENDPOINTS")
            .env_remove("FENCELOCK_NAMESPACE")
            .args(args);
        if let Some(v) = var {
            cmd.env("FENCELOCK_NAMESPACE", v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let etcd = [
        "--endpoints",
        "etcd://127.0.0.1:1",
        "--connect-timeout",
        "1s",
    ];
    for (option, value) in [
        ("--ttl", "-1s"),
        ("--connect-timeout", "-2s"),
        ("--timeout", "-3s"),
        ("--grace", "-4s"),
    ] {
        let args = [&etcd[..], &["lock", option, value, "x", "--", "true"]].concat();
        let (code, err) = run(&args, None);
        assert_eq!(code, Some(2), "{option} {value}: {err}");
        assert!(
            err.contains(&format!("{value} is negative")),
            "{option}: {err}"
        );
    }
    let (code, err) = run(
        &[&etcd[..], &["list"]].concat(),
        Some(std::ffi::OsStr::from_bytes(b"a\xff")),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("FENCELOCK_NAMESPACE is not valid UTF-8"),
        "{err}"
    );
    // Names, values and ZooKeeper's reserved namespace too (they were checked once connected:
    // with the cluster away, 69 after the connect timeout: black-box round 15).
    for (url, args, says) in [
        (
            "etcd://127.0.0.1:1",
            &["lock", "", "--", "true"][..],
            "empty",
        ),
        (
            "redis://127.0.0.1:1",
            &["lock", "a/./b", "--", "true"],
            "'.'",
        ),
        (
            "etcd://127.0.0.1:1",
            &["-n", "a", "leader", "read"],
            "read-write",
        ),
        (
            "zk://127.0.0.1:1",
            &["elect", "--value", "__REVOKE__", "e", "--", "true"],
            "revocation",
        ),
        (
            "zk://127.0.0.1:1",
            &["-n", "zookeeper", "observe", "e"],
            "reserved by ZooKeeper",
        ),
    ] {
        let all = [&["--endpoints", url, "--connect-timeout", "5s"][..], args].concat();
        // (Nothing listens on port 1: had it connected first, it would say so, and exit 69.)
        let (code, err) = run(&all, None);
        assert_eq!(code, Some(78), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    for (url, says) in [
        ("etcd://127.0.0.1:1/a/", "ends with '/'"),
        ("etcd://127.0.0.1:1//", "use the empty namespace"),
        ("etcd://127.0.0.1", "needs its port"),
        // A client library's URL inside ours: its port was masked as a password.
        ("etcd://https://127.0.0.1:1", "second scheme"),
        ("redis://redis://127.0.0.1:1", "second scheme"),
        // An empty password is refused, not dropped (the default user ran: round 37).
        ("redis://:@127.0.0.1:1", "password is empty"),
        ("redis://u:@127.0.0.1:1", "password is empty"),
        ("unix:///run/redis.sock", "unknown scheme"),
    ] {
        let (code, err) = run(&["--endpoints", url, "list"], None);
        assert_eq!(code, Some(78), "{url}: {err}");
        assert!(
            err.contains(says) && !err.contains("http://"),
            "{url}: {err}"
        );
    }
}

/// A TTL the cluster lowers (a ZooKeeper server's maxSessionTimeout, 60 s here) is said, not
/// taken silently (black-box round 7: `--ttl 1h` held sessions of 40 s). (One it raises, to
/// a minSessionTimeout above the 2 s the backend asks at least, is said the same way: the test
/// servers' least is 1 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_ttl_is_said() {
    let Some(t) = Target::zookeeper().await else {
        return;
    };
    let ns = unique_namespace("cli_lowered_ttl");
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = run(&t.url, &ns, dir.path(), &["--ttl", "2m", "leader", "x"]).await;
    assert_eq!(code, 75, "{out}");
    assert!(
        out.contains("granted a TTL of 60s, less than the 120s asked"),
        "{out}"
    );
    let (code, out) = run(&t.url, &ns, dir.path(), &["--ttl", "20s", "leader", "x"]).await;
    assert_eq!(code, 75, "{out}");
    assert!(!out.contains("granted a TTL"), "{out}");
}

/// Every duration out of its range is a usage error (2) naming the option, before anything
/// connects: `--ttl 0` was refused once connected (78, "0ns"), `--connect-timeout 2h` by the
/// backend's configuration (78, "at most one hour"), while `--ttl 25h` was 2 already;
/// `--connect-timeout 1ns` was taken, and then said the cluster could not be reached (69).
#[test]
fn durations_out_of_range_are_usage_errors() {
    for args in [
        &["--ttl", "0"][..],
        &["--ttl", "0ms"][..],
        &["--ttl", "25h"][..],
        &["--connect-timeout", "0s"][..],
        &["--connect-timeout", "2h"][..],
        &["--connect-timeout", "1ns"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_fencelock"))
            .args(["--endpoints", "etcd://127.0.0.1:1"])
            .args(args)
            .args(["lock", "x", "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(args[args.len() - 2]), "{args:?}: {err}");
    }
}

/// Two `fencelock lock` processes on the cluster at `url` run their commands one after the
/// other (each logs its start and end into `dir`'s log).
async fn two_processes_exclude(url: &str, ns: &str, dir: &Path) {
    let script =
        r#"echo "start $FENCELOCK_TOKEN" >> log; sleep 0.2; echo "end $FENCELOCK_TOKEN" >> log"#;
    let mut runs: Vec<Run> = (0..2)
        .map(|i| {
            Run::start(
                url,
                ns,
                dir,
                &format!("p{i}"),
                &["lock", "x", "--", "sh", "-c", script],
            )
        })
        .collect();
    for r in &mut runs {
        assert_eq!(r.code(WITHIN).await, 0, "{}", r.output());
    }
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 4, "{log}");
    for pair in lines.chunks(2) {
        assert!(
            pair[0].starts_with("start") && pair[1].starts_with("end"),
            "{log}"
        );
    }
}

/// Redis behind Sentinel (`redis+sentinel://…/MASTER`): processes exclude each other on the
/// primary the sentinels name, and a master name no sentinel knows is a configuration error
/// (78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_url() {
    use fencelock_integration::servers::redis as harness;
    use fencelock_integration::servers::redis_sentinel::{Failover, SentinelGroup};
    if !harness::available() {
        return;
    }
    let group = tokio::task::block_in_place(|| SentinelGroup::start(Failover::Command, 1));
    let url = group.url();
    let ns = unique_namespace("cli_sentinel");
    let dir = tempfile::tempdir().unwrap();
    two_processes_exclude(&url, &ns, dir.path()).await;

    let unknown = url.replace("/fl", "/nosuch");
    let mut r = Run::start(
        &unknown,
        &ns,
        dir.path(),
        "unknown",
        &["lock", "x", "--", "true"],
    );
    assert_eq!(r.code(WITHIN).await, 78, "{}", r.output());
}

/// A `redis+cluster://` URL: two processes exclude each other on a real cluster, and a
/// cluster URL with a database is a configuration error (78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_url() {
    use fencelock_integration::servers::redis as harness;
    use fencelock_integration::servers::redis_cluster::RedisCluster;
    if !harness::available() {
        return;
    }
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let url = cluster.url();
    let ns = unique_namespace("cli_cluster");
    let dir = tempfile::tempdir().unwrap();
    two_processes_exclude(&url, &ns, dir.path()).await;
    let mut r = Run::start(
        &format!("{url}/3"),
        &ns,
        dir.path(),
        "db",
        &["lock", "x", "--", "true"],
    );
    assert_eq!(r.code(WITHIN).await, 78, "{}", r.output());

    // `observe` of a cluster that goes away for good ends with 69 (its session holds nothing:
    // on a cluster it sends no heartbeat, and is never lost by the cluster's absence).
    let mut cmd = command(&url, &ns);
    cmd.env("FENCELOCK_TTL", "2s")
        .env("FENCELOCK_CONNECT_TIMEOUT", "2s")
        .args(["observe", "e"]);
    let mut r = Run::spawn(cmd, dir.path(), "observe");
    file_contains(&r.log, "no leader").await;
    tokio::task::block_in_place(|| {
        use fencelock_integration::servers::Cluster;
        for i in 0..cluster.endpoints().len() {
            cluster.node(i).kill();
        }
    });
    assert_eq!(r.code(WITHIN).await, 69, "{}", r.output());
}

/// Sentinels with a password of their own: FENCELOCK_SENTINEL_PASSWORD, removed from the
/// command's environment; without it a configuration error (78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_password() {
    use fencelock_integration::servers::redis as harness;
    use fencelock_integration::servers::redis_sentinel::SentinelGroup;
    if !harness::available() {
        return;
    }
    let group = tokio::task::block_in_place(|| SentinelGroup::start_protected("sentinel-pw"));
    let url = group.url();
    let ns = unique_namespace("cli_sentinel_pw");
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(&url, &ns);
    cmd.env("FENCELOCK_SENTINEL_PASSWORD", "sentinel-pw").args([
        "lock",
        "x",
        "--",
        "sh",
        "-c",
        "echo \"pw=[$FENCELOCK_SENTINEL_PASSWORD]\"",
    ]);
    let mut r = Run::spawn(cmd, dir.path(), "pw");
    assert_eq!(r.code(WITHIN).await, 0, "{}", r.output());
    assert!(r.output().contains("pw=[]"), "{}", r.output());
    let mut r = Run::start(&url, &ns, dir.path(), "nopw", &["lock", "x", "--", "true"]);
    assert_eq!(r.code(WITHIN).await, 78, "{}", r.output());
}

/// `observe` outlives a Redis server's restart shorter than `--connect-timeout`: its session
/// is lost while the server is down, and a new one is started once the server is back. The
/// server refused connections meanwhile, which failed the new session's connect at once: 69,
/// a second after the session was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_outlives_a_server_restart() {
    use fencelock_integration::servers::redis::{self as harness, Durability, RedisServer};
    if !harness::available() {
        return;
    }
    let server = tokio::task::block_in_place(|| RedisServer::start(Durability::None));
    let ns = unique_namespace("cli_observe_restart");
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(&server.url(), &ns);
    cmd.env("FENCELOCK_TTL", "2s")
        .env("FENCELOCK_CONNECT_TIMEOUT", "15s")
        .args(["observe", "e"]);
    let mut r = Run::spawn(cmd, dir.path(), "observe");
    file_contains(&r.log, "no leader").await;
    tokio::task::block_in_place(|| server.kill());
    file_contains(&r.log, "starting a new session").await;
    // Refused for a while (past the old code's give-up), then back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(r.child.try_wait().is_none(), "{}", r.output());
    tokio::task::block_in_place(|| server.restart());
    let s = fencelock::Session::builder(server.backend().await)
        .namespace(ns.as_str())
        .start()
        .await
        .unwrap();
    let leader = s
        .election("e")
        .unwrap()
        .campaign(b"node-b".to_vec())
        .await
        .unwrap();
    file_contains(&r.log, "node-b").await;
    assert!(r.child.signal(Signal::INT));
    assert_eq!(r.code(WITHIN).await, 0, "{}", r.output());
    leader.resign().await.unwrap();
    s.close().await.unwrap();
}

/// An empty `FENCELOCK_NAMESPACE=` (from `NS=$UNSET`, an EnvironmentFile line without a value)
/// counts as unset: the default namespace (and so does every other variable set empty). It switched to the empty namespace, and the locks of
/// processes that meant to share one stopped excluding each other. The empty namespace stays
/// reachable from the command line; an empty `FENCELOCK_USER=` is no user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_namespace_variable_counts_as_unset() {
    let Some(t) = Target::redis().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let key_of = |extra: &[&str], env: &[(&str, &str)]| {
        let mut cmd = command(&t.url, "");
        cmd.envs(env.iter().copied());
        cmd.args(extra).args([
            "lock",
            &format!("k-{}", uuid()),
            "--",
            "sh",
            "-c",
            "echo key=$FENCELOCK_KEY",
        ]);
        let mut r = Run::spawn(cmd, dir.path(), &format!("ns-{}", uuid()));
        async move {
            let code = r.code(WITHIN).await;
            (code, r.output())
        }
    };
    let (code, out) = key_of(&[], &[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("key=fencelock/"), "{out}");
    let (code, out) = key_of(&["--namespace", ""], &[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("key=/"), "{out}");
    let (code, out) = key_of(&[], &[("FENCELOCK_USER", "")]).await;
    assert_eq!(code, 0, "{out}");
    // Every variable: set but empty, it counts as unset (FENCELOCK_TTL= was a usage error,
    // FENCELOCK_PASSWORD= a password of nothing).
    let empty: Vec<(&str, &str)> = [
        "FENCELOCK_TTL",
        "FENCELOCK_CONNECT_TIMEOUT",
        "FENCELOCK_OUTPUT",
        "FENCELOCK_TLS_CA",
        "FENCELOCK_TLS_CERT",
        "FENCELOCK_TLS_KEY",
        "FENCELOCK_TLS_SERVER_NAME",
        "FENCELOCK_PASSWORD",
        "FENCELOCK_SENTINEL_PASSWORD",
    ]
    .into_iter()
    .map(|v| (v, ""))
    .collect();
    let (code, out) = key_of(&[], &empty).await;
    assert_eq!(code, 0, "{out}");
}

/// `--wait-for-replicas`: with a replica that follows, a lock is granted and its command run;
/// with the replica paused (nothing acknowledges), no session starts (69), rather than a grant
/// that a failover could lose, while `list` still works (it creates nothing). Given for etcd,
/// it is a configuration error (78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_needs_acknowledgements() {
    use fencelock_integration::servers::redis::{self as harness, Durability, RedisServer};
    if !harness::available() {
        return;
    }
    let (primary, replica) = tokio::task::block_in_place(|| {
        let primary = RedisServer::start(Durability::None);
        let replica = RedisServer::replica_of(&primary);
        replica.wait_in_sync();
        (primary, replica)
    });
    let ns = unique_namespace("cli_replicas");
    let dir = tempfile::tempdir().unwrap();
    let run = |label: &str| {
        let mut cmd = command(&primary.url(), &ns);
        cmd.args(["--wait-for-replicas", "1", "--connect-timeout", "2s"])
            .args(["lock", "m", "--", "sh", "-c", "echo ran > ran"]);
        Run::spawn(cmd, dir.path(), label)
    };
    let mut r = run("acknowledged");
    assert_eq!(r.code(WITHIN).await, 0, "{}", r.output());
    assert!(dir.path().join("ran").exists());
    std::fs::remove_file(dir.path().join("ran")).unwrap();
    tokio::task::block_in_place(|| replica.pause());
    let mut r = run("unacknowledged");
    let code = r.code(WITHIN).await;
    // The message says replicas are short, whether the library's own error came in time
    // ("fewer replicas than required acknowledged") or the try was cut off at the connect
    // timeout (it said only "no session within the connect timeout").
    assert_eq!(code, 69, "{}", r.output());
    assert!(r.output().contains("replicas"), "{}", r.output());
    assert!(!dir.path().join("ran").exists(), "the command ran");
    // Looking needs no acknowledgement: `list` works while the replicas are short.
    let mut cmd = command(&primary.url(), &ns);
    cmd.args([
        "--wait-for-replicas",
        "1",
        "--connect-timeout",
        "2s",
        "list",
    ]);
    let mut r = Run::spawn(cmd, dir.path(), "list");
    let listed = r.code(WITHIN).await;
    tokio::task::block_in_place(|| replica.resume());
    assert_eq!(listed, 0, "{}", r.output());
    let Some(t) = Target::etcd().await else {
        return;
    };
    let mut cmd = command(&t.url, &ns);
    cmd.args(["--wait-for-replicas", "1", "list"]);
    let mut r = Run::spawn(cmd, dir.path(), "etcd");
    assert_eq!(r.code(WITHIN).await, 78, "{}", r.output());
}

/// The command is told the cluster its lock is on: `--endpoints`' over an inherited
/// `FENCELOCK_ENDPOINTS` that names another (it was told that other one), and the variable's
/// when it is the one used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_is_told_the_cluster_used() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_told");
    let dir = tempfile::tempdir().unwrap();
    let echo = [
        "lock",
        "m",
        "--",
        "sh",
        "-c",
        "echo env=[$FENCELOCK_ENDPOINTS]",
    ];
    let mut cmd = command("etcd://127.0.0.1:1", &ns);
    cmd.args(["-e", &t.url]).args(echo);
    let mut r = Run::spawn(cmd, dir.path(), "flag");
    assert_eq!(r.code(WITHIN).await, 0, "{}", r.output());
    assert!(
        r.output().contains(&format!("env=[{}]", t.url)),
        "{}",
        r.output()
    );
    let (code, out) = run(&t.url, &ns, dir.path(), &echo).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("env=[{}]", t.url)), "{out}");
}

/// Started with its standard output closed (`>&-`), `list` cannot write what it reads (70),
/// nor can `--help`, `--version` and `completions`, and the command finds its output closed,
/// as it would without fencelock: all went to `/dev/null`, which Rust's runtime opens there,
/// and ended 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_stays_closed() {
    let Some(t) = Target::etcd().await else {
        return;
    };
    let ns = unique_namespace("cli_closed_out");
    let dir = tempfile::tempdir().unwrap();
    // Something to list.
    let s = t.session(&ns).await;
    let held = s.mutex("held").unwrap().lock().await.unwrap();
    for (label, args, expected) in [
        ("list", &["list", ""][..], 70),
        ("echo", &["lock", "m", "--", "/bin/echo", "hi"][..], 1),
        // (These printed into nothing, and exited 0: black-box round 15.)
        ("help", &["--help"][..], 70),
        ("version", &["--version"][..], 70),
        ("completions", &["completions", "bash"][..], 70),
    ] {
        let mut cmd = command(&t.url, &ns);
        cmd.args(args);
        // SAFETY: `close` is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::close(1);
                Ok(())
            });
        }
        let mut r = Run::spawn(cmd, dir.path(), label);
        assert_eq!(r.code(WITHIN).await, expected, "{label}: {}", r.output());
    }
    held.release().await.unwrap();
    s.close().await.unwrap();
}

/// A Redis server at `maxmemory` (no eviction) refuses a new session: the command says the
/// cluster is out of space and exits 69, as for a cluster that cannot serve (it exited 70, an
/// internal failure). One that may evict keys is warned of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_memory_is_unavailable_and_one_that_evicts_is_warned_of() {
    use fencelock_integration::servers::redis::{self as harness, Durability, RedisServer};
    if !harness::available() {
        return;
    }
    let server = tokio::task::block_in_place(|| RedisServer::start(Durability::None));
    let limit = server.cli(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    assert_eq!(limit.trim(), "OK");
    let ns = unique_namespace("cli_oom");
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = run(&server.url(), &ns, dir.path(), &["lock", "x", "--", "true"]).await;
    assert_eq!(code, 69, "{out}");
    assert!(out.contains("out of space"), "{out}");
    // A server that may evict keys instead is warned of (the library's warning is a log line,
    // which the command does not show: black-box round 15).
    for setting in [["maxmemory", "0"], ["maxmemory-policy", "allkeys-lru"]] {
        let set = server
            .cli(&["CONFIG", "SET", setting[0], setting[1]])
            .unwrap();
        assert_eq!(set.trim(), "OK");
    }
    let (code, out) = run(&server.url(), &ns, dir.path(), &["lock", "x", "--", "true"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("may evict keys (maxmemory-policy allkeys-lru)"),
        "{out}"
    );
}
