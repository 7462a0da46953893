//! An etcd member paused (`SIGSTOP`) after the client connected — a follower, then the leader:
//! a stopped process still accepts connections, and what is sent to it waits. The session must
//! stay live and locks keep being granted through the other members (at most the acquisitions
//! in flight on the paused member fail). (ZooKeeper: `zookeeper_paused_server.rs`.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use fencelock::backend::{Backend, Backoff};
use fencelock::{Session, SessionState};
use fencelock_integration::servers::etcd::EtcdCluster;
use fencelock_integration::servers::{available, Cluster};
use fencelock_integration::stamps::grants_between;
use fencelock_integration::target::Kind;

/// How long each member stays paused.
const PAUSE: Duration = Duration::from_secs(10);

/// Which members are paused, one after the other.
#[derive(Clone, Copy, PartialEq)]
enum Victims {
    FollowerThenLeader,
    Follower,
}

async fn run(cluster: Arc<dyn Cluster>, ttl: Duration, victims: Victims) {
    let s = cluster
        .target()
        .session(&fencelock::conformance::unique_namespace("paused"), ttl)
        .await;
    let mut plan = vec!["follower"];
    if victims == Victims::FollowerThenLeader {
        plan.push("leader");
    }
    for what in plan {
        // Asked before each pause, once the members agree: a resumed member (etcd 3.4 runs
        // without pre-vote) may have forced an election, and a follower picked from an old
        // answer could be the leader now.
        cluster.caught_up().await;
        let leader = cluster.leader().await;
        let victim = match what {
            "leader" => leader,
            _ => (leader + 1) % cluster.size(),
        };
        let m = s.mutex("m").unwrap();
        cluster.pause(victim);
        let start = Instant::now();
        let (mut granted, mut failed) = (0, Vec::new());
        while start.elapsed() < PAUSE {
            match m.lock_timeout(ttl).await {
                Ok(g) => {
                    let _ = g.release().await;
                    granted += 1;
                }
                Err(e) => failed.push(e.to_string()),
            }
            assert!(
                !matches!(s.state(), SessionState::Lost(_)),
                "{:?}, {what} paused: the session was lost ({failed:?})",
                cluster.kind()
            );
        }
        cluster.resume(victim);
        println!(
            "{:?}, {what} paused for {PAUSE:?}: {granted} grants, {} failed ({failed:?})",
            cluster.kind(),
            failed.len()
        );
        assert!(granted >= 50, "{what} paused: only {granted} grants");
        assert!(failed.len() <= 3, "{what} paused: {failed:?}");
    }
    s.close().await.unwrap();
}

/// Each scenario in turn on one cluster (run side by side, two paused 3-member clusters load
/// the 2-core machine enough to cost a session its heartbeat):
/// - a follower, then the leader, paused at TTL 8 s;
/// - a follower paused at a short TTL (2 s: the local deadline is 1 s after a heartbeat's
///   send): no request may wait on it for longer than a third of the TTL, or the session is
///   lost. (A paused *leader* at this TTL costs the session: etcd's election takes about its 1 s
///   election timeout, so nothing can be confirmed before the deadline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gray_etcd_member_paused() {
    if !available(Kind::Etcd) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let cluster: Arc<dyn Cluster> = Arc::new(
        tokio::task::spawn_blocking(|| EtcdCluster::start(3))
            .await
            .unwrap(),
    );
    run(
        cluster.clone(),
        Duration::from_secs(8),
        Victims::FollowerThenLeader,
    )
    .await;
    run(cluster, Duration::from_secs(2), Victims::Follower).await;
}

/// The scenarios of this file one at a time: two paused 3-member clusters side by side load the
/// 2-core machine enough to cost a session its heartbeat.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The short TTL of the contended scenarios: the local deadline is 1 s after a heartbeat's
/// send, so a heartbeat or a request that waits on the paused member for long costs the session.
const SHORT_TTL: Duration = Duration::from_secs(2);

/// How many sessions contend on the one mutex.
const CONTENDERS: usize = 3;

/// How long a bounded wait of the contended scenarios may take (a noisy 2-core machine).
const PATIENCE: Duration = Duration::from_secs(30);

/// A backend on every member of `cluster`.
async fn backend(cluster: &dyn Cluster) -> Arc<dyn Backend> {
    let endpoints = cluster.endpoints().join(",");
    cluster.target().backend_at(&endpoints).await
}

/// Starts a session on `backend`, retrying (bounded) while the cluster elects a leader.
async fn start_session(backend: &Arc<dyn Backend>, namespace: &str, ttl: Duration) -> Session {
    let give_up = Instant::now() + PATIENCE;
    let mut backoff = Backoff::new();
    loop {
        match Session::builder(backend.clone())
            .namespace(namespace)
            .ttl(ttl)
            .start()
            .await
        {
            Ok(s) => return s,
            Err(e) if e.is_temporary() && Instant::now() < give_up => backoff.pause().await,
            Err(e) => panic!("cannot start a session: {e:?}"),
        }
    }
}

/// What the contending sessions record.
#[derive(Default)]
struct Record {
    grants: Vec<Instant>,
    /// When a session was found lost, and why.
    lost: Vec<(Instant, String)>,
    failed: Vec<String>,
}

/// One contender: lock_timeout/release in a loop until `stop`; a lost session is recorded and
/// replaced (a user would do the same), so that grants can go on.
async fn contend(
    cluster: Arc<dyn Cluster>,
    namespace: String,
    record: Arc<StdMutex<Record>>,
    count: Arc<tokio::sync::watch::Sender<usize>>,
    stop: Arc<AtomicBool>,
) {
    let backend = backend(&*cluster).await;
    let mut s = start_session(&backend, &namespace, SHORT_TTL).await;
    while !stop.load(Ordering::SeqCst) {
        let m = s.mutex("m").unwrap();
        match m.lock_timeout(SHORT_TTL).await {
            Ok(g) => {
                record.lock().unwrap().grants.push(Instant::now());
                count.send_modify(|n| *n += 1);
                let _ = g.release().await;
            }
            Err(e) => record.lock().unwrap().failed.push(e.to_string()),
        }
        if let SessionState::Lost(reason) = s.state() {
            record
                .lock()
                .unwrap()
                .lost
                .push((Instant::now(), format!("{reason:?}")));
            s = start_session(&backend, &namespace, SHORT_TTL).await;
        }
    }
    let _ = s.close().await;
}

/// Several sessions contending on one mutex at TTL 2 s (so that waiters wait on watches) while
/// a follower, then the leader, is paused for 3× the TTL: locks keep being granted through the
/// other members and no session is lost — with the leader paused, unless the cluster elected no
/// new leader before the sessions' deadlines (etcd's election takes its 1 s election timeout or
/// more, and the deadline is 1 s after a heartbeat's send: nothing can be confirmed in between).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gray_etcd_member_paused_contended() {
    if !available(Kind::Etcd) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let cluster: Arc<dyn Cluster> = Arc::new(
        tokio::task::spawn_blocking(|| EtcdCluster::start(3))
            .await
            .unwrap(),
    );
    let namespace = fencelock::conformance::unique_namespace("paused-contended");
    let record = Arc::new(StdMutex::new(Record::default()));
    let (count, mut counted) = tokio::sync::watch::channel(0usize);
    let count = Arc::new(count);
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..CONTENDERS)
        .map(|_| {
            tokio::spawn(contend(
                cluster.clone(),
                namespace.clone(),
                record.clone(),
                count.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let pause = SHORT_TTL * 3;
    let leader = cluster.leader().await;
    let plan = [
        ("follower", (leader + 1) % cluster.size()),
        ("leader", leader),
    ];
    for (what, victim) in plan {
        // Healthy first: the contenders are granted locks before the pause.
        let before = *counted.borrow();
        tokio::time::timeout(PATIENCE, counted.wait_for(|n| *n >= before + 20))
            .await
            .unwrap_or_else(|_| panic!("fewer than 20 grants before the {what} was paused"))
            .unwrap();
        let lost_before = record.lock().unwrap().lost.len();
        let from = Instant::now();
        cluster.pause(victim);
        // With the leader paused: how long the others take to elect a new one.
        let election = (what == "leader").then(|| {
            let cluster = cluster.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                cluster.leader().await;
                start.elapsed()
            })
        });
        tokio::time::sleep(pause).await; // the fault's duration
        let to = Instant::now();
        cluster.resume(victim);
        let election = match election {
            Some(e) => Some(tokio::time::timeout(PATIENCE, e).await.unwrap().unwrap()),
            None => None,
        };
        let (granted, gap, lost, failed) = {
            let r = record.lock().unwrap();
            let (granted, gap) = grants_between(&r.grants, from, to);
            let lost: Vec<String> = r.lost[lost_before..]
                .iter()
                .map(|(at, why)| format!("{why} at +{:?}", at.saturating_duration_since(from)))
                .collect();
            (granted, gap, lost, r.failed.len())
        };
        println!(
            "etcd, {CONTENDERS} sessions at TTL {SHORT_TTL:?}, {what} paused for {pause:?}: \
             {granted} grants, longest gap {gap:?}, sessions lost {} {lost:?}, \
             failed acquisitions so far {failed}{}",
            lost.len(),
            election.map_or(String::new(), |e| format!(", new leader after {e:?}")),
        );
        assert!(granted >= 20, "{what} paused: only {granted} grants");
        match election {
            None => assert!(lost.is_empty(), "{what} paused: sessions lost: {lost:?}"),
            // The cluster confirms nothing without a leader: a session may be lost only when
            // the election took longer than what is left of its deadline after a heartbeat.
            Some(e) => assert!(
                lost.is_empty() || e >= Duration::from_millis(500),
                "leader paused, new leader after {e:?}: sessions lost: {lost:?}"
            ),
        }
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        tokio::time::timeout(PATIENCE, w)
            .await
            .expect("a contender did not stop")
            .unwrap();
    }
}

/// A waiter whose watch stream sits on a member that hangs: the holder releases through another
/// member during the pause, and the waiter is granted well before HTTP/2 keep-alive would give
/// up on the hung member (about 8 s): its watch moved to a stream on a member that answers,
/// from the revision the old stream had reached, and missed no deletion. The waiter's client
/// knows only the two followers, each paused in turn, so one of the rounds pauses the member
/// its watch stream is on. (A new waiter each round: a client of two endpoints whose one was
/// just resumed — not yet back in its rotation — and whose other is paused has no member left.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gray_etcd_watch_moves_off_paused_member() {
    if !available(Kind::Etcd) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let cluster: Arc<dyn Cluster> = Arc::new(
        tokio::task::spawn_blocking(|| EtcdCluster::start(3))
            .await
            .unwrap(),
    );
    let namespace = fencelock::conformance::unique_namespace("paused-watch");
    let leader = cluster.leader().await;
    let followers: Vec<usize> = (0..cluster.size()).filter(|i| *i != leader).collect();
    let holder = start_session(&backend(&*cluster).await, &namespace, SHORT_TTL).await;
    let waiter_at: Vec<String> = followers.iter().map(|i| cluster.endpoint(*i)).collect();
    for victim in followers {
        let waiter_backend = cluster.target().backend_at(&waiter_at.join(",")).await;
        let waiter = start_session(&waiter_backend, &namespace, SHORT_TTL).await;
        let held = holder.mutex("m").unwrap().lock().await.unwrap();
        let m = waiter.mutex("m").unwrap();
        let waiting = tokio::spawn(async move { m.lock().await.map(|g| (g, Instant::now())) });
        // Queued behind the holder (its watch is registered right after its enqueue).
        let queued = Instant::now();
        while holder
            .mutex("m")
            .unwrap()
            .waiters()
            .await
            .unwrap()
            .is_empty()
        {
            assert!(queued.elapsed() < PATIENCE, "the waiter never queued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cluster.pause(victim);
        // Past the point where the rotation has dropped the member: only a stream left on it
        // still goes there.
        tokio::time::sleep(SHORT_TTL).await;
        held.release().await.unwrap();
        let released = Instant::now();
        let (guard, granted) = tokio::time::timeout(PATIENCE, waiting)
            .await
            .expect("the waiter was never granted")
            .unwrap()
            .unwrap();
        let after = granted.saturating_duration_since(released);
        cluster.resume(victim);
        println!(
            "etcd, member {victim} paused: the waiter was granted {after:?} after the release"
        );
        assert!(
            after < Duration::from_secs(4),
            "granted only {after:?} after the release"
        );
        assert!(
            !matches!(waiter.state(), SessionState::Lost(_)),
            "the waiter's session was lost"
        );
        guard.release().await.unwrap();
        waiter.close().await.unwrap();
    }
    holder.close().await.unwrap();
}

/// An election's observer whose watch stream sits on a member that hangs: the leader resigns
/// through another member during the pause, and the observer reports the change well before
/// HTTP/2 keep-alive would give up on the hung member (about 8 s): a quiet watch is asked for
/// progress, and one that stays silent is given up and made again elsewhere. As for the waiter
/// above, the observer's client knows only the two followers, each paused in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gray_etcd_observer_moves_off_paused_member() {
    use futures::StreamExt;
    if !available(Kind::Etcd) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let cluster: Arc<dyn Cluster> = Arc::new(
        tokio::task::spawn_blocking(|| EtcdCluster::start(3))
            .await
            .unwrap(),
    );
    let namespace = fencelock::conformance::unique_namespace("paused-observer");
    let leader = cluster.leader().await;
    let followers: Vec<usize> = (0..cluster.size()).filter(|i| *i != leader).collect();
    let candidate = start_session(&backend(&*cluster).await, &namespace, SHORT_TTL).await;
    let observer_at: Vec<String> = followers.iter().map(|i| cluster.endpoint(*i)).collect();
    for (round, victim) in followers.into_iter().enumerate() {
        let observer_backend = cluster.target().backend_at(&observer_at.join(",")).await;
        let observer = start_session(&observer_backend, &namespace, SHORT_TTL).await;
        let value = format!("round {round}");
        let led = candidate
            .election("e")
            .unwrap()
            .campaign(value.as_bytes())
            .await
            .unwrap();
        let stream = observer.election("e").unwrap().observe();
        let mut stream = std::pin::pin!(stream);
        // The leader of this round first (errors of a paused member are yielded, and skipped).
        let first = tokio::time::timeout(PATIENCE, async {
            while let Some(item) = stream.next().await {
                if let Ok(Some(l)) = item {
                    return l.value;
                }
            }
            panic!("the observation ended")
        })
        .await
        .expect("the observer reports the leader");
        assert_eq!(first, value.as_bytes());
        cluster.pause(victim);
        tokio::time::sleep(SHORT_TTL).await;
        led.resign().await.unwrap();
        let resigned = Instant::now();
        tokio::time::timeout(PATIENCE, async {
            while let Some(item) = stream.next().await {
                if let Ok(None) = item {
                    return;
                }
            }
            panic!("the observation ended")
        })
        .await
        .expect("the observer never reported the resignation");
        let after = resigned.elapsed();
        cluster.resume(victim);
        println!(
            "etcd, member {victim} paused: the observer was told {after:?} after the resignation"
        );
        assert!(
            after < Duration::from_secs(4),
            "told only {after:?} after the resignation"
        );
        observer.close().await.unwrap();
    }
    candidate.close().await.unwrap();
}
