//! A ZooKeeper server paused (`SIGSTOP`) under a session that is connected to it: a stopped
//! process still accepts connections and answers nothing. The session must move to another
//! server before its deadline (see `backends/zookeeper/src/link.rs`): no session lost, locks
//! granted all through the pause, no gap between grants longer than the TTL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock::{Session, SessionState};
use fencelock_integration::servers::fourlw;
use fencelock_integration::servers::zookeeper::ZkEnsemble;
use fencelock_integration::servers::{available, Cluster};
use fencelock_integration::stamps::longest_gap_from;
use fencelock_integration::target::Kind;
use tokio::task::JoinSet;

/// How many sessions connected to the paused server contend for the lock (with one connected
/// elsewhere): each one that the client would send back to the silent server is lost.
const ON_VICTIM: usize = 3;

/// The server that `session` is connected to, from each server's `cons` (bounded wait).
async fn server_of(ensemble: &ZkEnsemble, session: &Session) -> usize {
    let sid = format!("sid=0x{}", session.id());
    let start = Instant::now();
    loop {
        for i in 0..ensemble.size() {
            let cons = fourlw::ask_async(ensemble.port(i), "cons")
                .await
                .unwrap_or_default();
            if cons.contains(&sid) {
                return i;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no server lists session {}",
            session.id()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Which server is paused.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Victim {
    /// A follower that sessions are connected to.
    Follower,
    /// The leader, with sessions connected to it.
    Leader,
}

/// Pauses a server that [`ON_VICTIM`] sessions are connected to for 3 × `ttl` while they and
/// one session connected elsewhere take turns on one mutex; checks them all live, the grants
/// during the pause, and the longest gap between two grants.
async fn pause_connected_server(ensemble: &Arc<ZkEnsemble>, ttl: Duration, which: Victim) {
    let ns = fencelock::conformance::unique_namespace("paused-zk");
    let target = ensemble.target();
    let leader = ensemble.leader().await;
    // Sessions connect to a server at random: open some until one is on the victim's kind of
    // server, then until ON_VICTIM are on that server and one is elsewhere.
    let (first, victim) = loop {
        let s = target.session(&ns, ttl).await;
        let i = server_of(ensemble, &s).await;
        if (i == leader) == (which == Victim::Leader) {
            break (s, i);
        }
        s.close().await.unwrap();
    };
    let (mut sessions, mut elsewhere) = (vec![first], None);
    for _ in 0..40 {
        if sessions.len() == ON_VICTIM && elsewhere.is_some() {
            break;
        }
        let s = target.session(&ns, ttl).await;
        if server_of(ensemble, &s).await == victim {
            if sessions.len() < ON_VICTIM {
                sessions.push(s);
                continue;
            }
        } else if elsewhere.is_none() {
            elsewhere = Some(s);
            continue;
        }
        s.close().await.unwrap();
    }
    assert_eq!(sessions.len(), ON_VICTIM, "sessions on server {victim}");
    sessions.extend(elsewhere);
    let grants: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = JoinSet::new();
    for s in &sessions {
        let (m, grants, stop) = (s.mutex("m").unwrap(), grants.clone(), stop.clone());
        workers.spawn(async move {
            let mut failed = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let e = match tokio::time::timeout(ttl * 2, m.lock_timeout(ttl)).await {
                    Ok(Ok(g)) => {
                        grants.lock().unwrap().push(Instant::now());
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        let _ = g.release().await;
                        continue;
                    }
                    Ok(Err(e)) => e,
                    Err(_) => {
                        failed.push("lock_timeout did not return".into());
                        continue;
                    }
                };
                failed.push(e.to_string());
                if matches!(e, fencelock::Error::SessionLost(_)) {
                    break; // reported by the session's state
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            failed
        });
    }
    // A workload that runs before the fault.
    let warm = Instant::now();
    while grants.lock().unwrap().len() < 50 {
        assert!(
            warm.elapsed() < Duration::from_secs(30),
            "no grants before the pause"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pause = ttl * 3;
    let paused_at = Instant::now();
    ensemble.pause(victim);
    let mut moved = None;
    while paused_at.elapsed() < pause {
        if moved.is_none() {
            // The first session shows up on another server (the paused one answers nothing).
            for i in (0..ensemble.size()).filter(|i| *i != victim) {
                let cons = fourlw::ask_async(ensemble.port(i), "cons").await;
                if cons.is_some_and(|c| c.contains(&format!("sid=0x{}", sessions[0].id()))) {
                    moved = Some((i, paused_at.elapsed()));
                }
            }
        }
        for s in &sessions {
            assert!(
                !matches!(s.state(), SessionState::Lost(_)),
                "TTL {ttl:?}: session {} lost with its server paused",
                s.id()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resumed_at = Instant::now();
    ensemble.resume(victim);
    // The workload after healing.
    let healed = grants.lock().unwrap().len();
    while grants.lock().unwrap().len() < healed + 50 {
        assert!(
            resumed_at.elapsed() < Duration::from_secs(30),
            "no grants after the pause"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut failed = Vec::new();
    while let Some(f) = workers.join_next().await {
        failed.extend(f.unwrap());
    }
    let lost: Vec<_> = sessions
        .iter()
        .filter(|s| matches!(s.state(), SessionState::Lost(_)))
        .map(|s| s.id())
        .collect();
    let grants = grants.lock().unwrap().clone();
    let during = grants
        .iter()
        .filter(|t| **t >= paused_at && **t < resumed_at)
        .count();
    let longest = longest_gap_from(&grants, paused_at);
    println!(
        "ZooKeeper TTL {ttl:?}: the {which:?} (server {victim}) paused {pause:?} under {ON_VICTIM} of {} sessions; \
         the first moved (to server, after) {moved:?}; {during} grants during the pause, \
         longest gap {longest:?}; sessions lost {}; {} acquisitions failed ({failed:?})",
        sessions.len(),
        lost.len(),
        failed.len()
    );
    assert!(lost.is_empty(), "sessions lost: {lost:?}");
    assert!(during >= 20, "only {during} grants during the pause");
    assert!(
        longest <= ttl,
        "a gap of {longest:?} between grants (TTL {ttl:?})"
    );
    assert!(moved.is_some(), "the first session never moved");
    for s in sessions {
        s.close().await.unwrap();
    }
}

/// A follower at the short TTL (4 s: the local deadline is 3 s after a heartbeat, the TTL less a margin of at least 1 s) and at
/// 10 s; the leader at 10 s (its followers notice after syncLimit × tickTime, 2.5 s here, and
/// elect another: the cluster confirms nothing meanwhile, so at the short TTL the sessions may
/// be lost, rightly). Each on an ensemble of its own, so that they can run side by side.
async fn paused(ttl: Duration, which: Victim) {
    if !available(Kind::ZooKeeper) {
        return;
    }
    let ensemble = Arc::new(
        tokio::task::spawn_blocking(|| ZkEnsemble::start(3))
            .await
            .unwrap(),
    );
    pause_connected_server(&ensemble, ttl, which).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gray_zookeeper_connected_follower_paused_short_ttl() {
    paused(Duration::from_secs(4), Victim::Follower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gray_zookeeper_connected_follower_paused() {
    paused(Duration::from_secs(10), Victim::Follower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gray_zookeeper_leader_paused() {
    paused(Duration::from_secs(10), Victim::Leader).await;
}

/// A session closed at a long TTL (30 s) while the server its close tries first (the one after
/// its own) is paused: the close reaches a server that answers within its bound, and the lock
/// the session held is free at once, while that server is still paused. Each server's try was a
/// share of the TTL (6 s here) in a close bounded at 5 s: every try went to the paused server,
/// and the lock stayed taken until the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gray_zookeeper_close_passes_a_paused_server() {
    if !available(Kind::ZooKeeper) {
        return;
    }
    let ensemble = Arc::new(
        tokio::task::spawn_blocking(|| ZkEnsemble::start(3))
            .await
            .unwrap(),
    );
    let ns = fencelock::conformance::unique_namespace("zk-close-paused");
    let target = ensemble.target();
    let ttl = Duration::from_secs(30);
    let s = target.session(&ns, ttl).await;
    let next = (server_of(&ensemble, &s).await + 1) % ensemble.size();
    // Another session, on a server that stays up, to look at the lock.
    let mut other = None;
    for _ in 0..40 {
        let o = target.session(&ns, ttl).await;
        if server_of(&ensemble, &o).await != next {
            other = Some(o);
            break;
        }
        o.close().await.unwrap();
    }
    let other = other.expect("a session on another server");
    let guard = s.mutex("m").unwrap().lock().await.unwrap();
    ensemble.pause(next);
    let start = Instant::now();
    let closed = s.close().await;
    let took = start.elapsed();
    let free = other.mutex("m").unwrap().try_lock().await.unwrap();
    ensemble.resume(next);
    assert!(
        free.is_some(),
        "the lock is still taken after the close ({closed:?} after {took:?})"
    );
    drop(guard);
    other.close().await.unwrap();
}

/// A session that moves to a server granting it a shorter timeout (its `maxSessionTimeout` is
/// lower: an ensemble configured unevenly) ends there: the server revalidates the session at
/// the leader with its own timeout, and the cluster then expires it sooner than the session's
/// local deadline, which rests on the TTL it started with. It moved and stayed Live, its locks
/// held by its own account up to 6 s after the cluster could have expired them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gray_zookeeper_a_move_to_a_shorter_timeout_ends_the_session() {
    use fencelock::SessionEnd;
    use fencelock_integration::servers::zookeeper::ZkOptions;
    if !available(Kind::ZooKeeper) {
        return;
    }
    // Both other servers grant less than the session's TTL: wherever it moves.
    let victim = 1;
    let options = ZkOptions {
        max_session_timeouts: vec![(0, Duration::from_secs(4)), (2, Duration::from_secs(4))],
        ..ZkOptions::default()
    };
    let ensemble = Arc::new(
        tokio::task::spawn_blocking(move || ZkEnsemble::start_with(3, options))
            .await
            .unwrap(),
    );
    let ns = fencelock::conformance::unique_namespace("zk-shorter");
    let target = ensemble.target();
    let ttl = Duration::from_secs(10);
    let mut on_victim = None;
    for _ in 0..40 {
        let s = target.session(&ns, ttl).await;
        if server_of(&ensemble, &s).await == victim {
            on_victim = Some(s);
            break;
        }
        s.close().await.unwrap();
    }
    let s = on_victim.expect("a session on the victim");
    assert_eq!(s.ttl(), ttl);
    let guard = s.mutex("m").unwrap().lock().await.unwrap();
    ensemble.pause(victim);
    let paused_at = Instant::now();
    while !matches!(s.state(), SessionState::Lost(_)) {
        assert!(
            paused_at.elapsed() < Duration::from_secs(15),
            "still {:?} 15 s after its server paused (moved to one with a 4 s timeout)",
            s.state()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.state(), SessionState::Lost(SessionEnd::Expired));
    assert!(!guard.is_held());
    ensemble.resume(victim);
}
