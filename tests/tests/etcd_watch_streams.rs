//! The etcd watch stream replaced under load: sessions mix `lock_timeout` waits of 1–50 ms
//! (whose dropped registrations cancel their watches) with plain `lock()` waiters, while a proxy
//! breaks every connection again and again (each break replaces the session's watch stream, whose
//! watch ids start from 0 again). A cancel that reached the wrong watch would leave a plain
//! waiter asleep for ever: every one of them must be granted in bounded time. And waits given
//! up at every moment leave no watch behind on the server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock::conformance::unique_namespace;
use fencelock::{Error, Session};
use fencelock_etcd::EtcdBackend;
use fencelock_integration::notifications::etcd_counter;
use fencelock_integration::proxy::{Mode, Proxy};
use fencelock_integration::servers::etcd::{self as etcd_harness, EtcdCluster, EtcdFactory};
use fencelock_integration::servers::{available, Cluster};
use fencelock_integration::target::Kind;
use tokio::time::Instant;

/// How long the faults go on.
const RUN: Duration = Duration::from_secs(10);
/// A plain waiter must be granted within this (far beyond any fair turn in this workload).
const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wake_across_watch_stream_replacements() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let proxy = Arc::new(Proxy::start(&f.cluster.endpoint(0)).await);
    let ns = unique_namespace("watch_streams");
    let mut sessions = Vec::new();
    for _ in 0..4 {
        let backend = EtcdBackend::connect([proxy.addr()]).await.unwrap();
        let s = Session::builder(backend)
            .namespace(&ns)
            .ttl(Duration::from_secs(10))
            .start()
            .await
            .unwrap();
        sessions.push(s);
    }
    let granted = Arc::new(AtomicUsize::new(0));
    let timed_out = Arc::new(AtomicUsize::new(0));
    let breaks = Arc::new(AtomicUsize::new(0));
    let stop_at = Instant::now() + RUN;
    let mut tasks = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        for j in 0..3 {
            let (s, granted, timed_out) = (s.clone(), granted.clone(), timed_out.clone());
            tasks.push(tokio::spawn(async move {
                let mut n: u64 = (i * 7 + j) as u64;
                while Instant::now() < stop_at {
                    n = n
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let name = format!("k{}", n % 3);
                    let m = s.mutex(&name).unwrap();
                    if j == 0 {
                        // The plain waiter: must always be granted.
                        let g = match tokio::time::timeout(PATIENCE, m.lock()).await {
                            Ok(Ok(g)) => g,
                            // A broken connection may surface as a temporary error: retry.
                            Ok(Err(e)) if e.is_temporary() => continue,
                            Ok(Err(e)) => panic!("session {i}: lock() failed: {e}"),
                            Err(_) => panic!("session {i}: a plain waiter on {name} never woke"),
                        };
                        granted.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        let _ = g.release().await;
                    } else {
                        let wait = Duration::from_millis(1 + n % 50);
                        match m.lock_timeout(wait).await {
                            Ok(g) => {
                                granted.fetch_add(1, Ordering::Relaxed);
                                let _ = g.release().await;
                            }
                            Err(Error::Timeout { .. }) => {
                                timed_out.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) if e.is_temporary() => {}
                            Err(e) => panic!("session {i}: lock_timeout failed: {e}"),
                        }
                    }
                }
            }));
        }
    }
    // Break every connection every 400 ms, briefly: watch streams are replaced each time.
    let faults = tokio::spawn({
        let (proxy, breaks) = (proxy.clone(), breaks.clone());
        async move {
            while Instant::now() < stop_at {
                tokio::time::sleep(Duration::from_millis(400)).await;
                proxy.set(Mode::Reset);
                tokio::time::sleep(Duration::from_millis(20)).await;
                proxy.set(Mode::Pass);
                breaks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    for t in tasks {
        tokio::time::timeout(RUN + PATIENCE * 2, t)
            .await
            .expect("a worker hung")
            .unwrap();
    }
    faults.await.unwrap();
    let (granted, timed_out, breaks) = (
        granted.load(Ordering::Relaxed),
        timed_out.load(Ordering::Relaxed),
        breaks.load(Ordering::Relaxed),
    );
    println!("{granted} grants, {timed_out} timeouts, {breaks} connection breaks");
    // The workload ran: many grants and many cancelled waits across many stream replacements.
    assert!(breaks >= 10, "{breaks} breaks");
    assert!(granted >= 100, "{granted} grants");
    assert!(timed_out >= 50, "{timed_out} timeouts");
    for s in sessions {
        let _ = s.close().await;
    }
}

/// A one-member etcd cluster of the test's own, so that no other test's watches and streams
/// are counted (`None` where etcd is not available).
async fn own_server() -> Option<EtcdCluster> {
    if !available(Kind::Etcd) {
        return None;
    }
    Some(
        tokio::task::spawn_blocking(|| EtcdCluster::start(1))
            .await
            .unwrap(),
    )
}

/// Waits given up at every moment behind a holder that stays leave no watch on the server: one
/// dropped while its watch was being created left the watch there until the holder's key was
/// deleted (for an election's leader, hours), and the stream asked for progress all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_given_up_while_their_watch_is_created_leave_no_watch() {
    let Some(cluster) = own_server().await else {
        return;
    };
    let ep = cluster.endpoint(0);
    let watchers = || etcd_counter(&ep, "etcd_debugging_mvcc_watcher_total", "");
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let b = etcd_harness::connect(std::slice::from_ref(&ep)).await;
        sessions.push(
            Session::builder(b)
                .namespace("given_up")
                .start()
                .await
                .unwrap(),
        );
    }
    // A holder of many locks, each waited on once (a wait on a key waited on before may find
    // its watch there, and take it over).
    const LOCKS: u64 = 300;
    let mut held = Vec::new();
    for i in 0..LOCKS {
        held.push(
            sessions[0]
                .mutex(&format!("held{i}"))
                .unwrap()
                .lock()
                .await
                .unwrap(),
        );
    }
    let before = watchers().await.expect("the server's watcher count");
    let mut given_up = 0;
    for i in 0..LOCKS {
        // From before the enqueue is answered to well after the watch is made.
        let wait = Duration::from_micros(i * 53 % 12_000);
        let waiter = sessions[1].mutex(&format!("held{i}")).unwrap();
        match tokio::time::timeout(wait, waiter.lock()).await {
            Err(_) => given_up += 1,
            Ok(r) => panic!("a wait behind a holder ended: {:?}", r.map(|_| ())),
        }
    }
    assert_eq!(given_up, LOCKS);
    // Nothing waits now: the watches go (cancels are sent from tasks, at once).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = watchers().await.expect("the server's watcher count");
        if now <= before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} watches left on the server by {given_up} waits given up ({before} before)",
            now - before
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The waiters still wake at a release.
    let waiter = sessions[1].mutex("held0").unwrap();
    let next = tokio::spawn(async move { waiter.lock().await.map(|_| ()) });
    held.swap_remove(0).release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the next waiter woke")
        .unwrap()
        .unwrap();
    for s in sessions {
        let _ = s.close().await;
    }
}

/// A session that waited, then ended (closed, or dropped), leaves no watch stream, and no
/// watch, on the server: its stream's reader held a sender of the stream, which kept its
/// request side open, and the reader waited on it for ever (a task and a server stream per
/// ended session, for the life of the process: a worker opening a session per job, a
/// Supervisor replacing lost sessions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_session_leaves_no_watch_stream() {
    let Some(cluster) = own_server().await else {
        return;
    };
    let ep = cluster.endpoint(0);
    let streams = || etcd_counter(&ep, "etcd_debugging_mvcc_watch_stream_total", "");
    let watchers = || etcd_counter(&ep, "etcd_debugging_mvcc_watcher_total", "");
    let session = || async {
        let b = etcd_harness::connect(std::slice::from_ref(&ep)).await;
        Session::builder(b)
            .namespace("ended")
            .start()
            .await
            .unwrap()
    };
    let holder = session().await;
    let (streams_before, watchers_before) = (
        streams().await.expect("the server's stream count"),
        watchers().await.expect("the server's watcher count"),
    );
    const ROUNDS: usize = 5;
    for round in 0..ROUNDS {
        let g = holder.mutex("m").unwrap().lock().await.unwrap();
        let waiter = session().await;
        let m = waiter.mutex("m").unwrap();
        let wait = tokio::spawn(async move { m.lock().await.map(|g| g.token()) });
        // Its watch on the holder's key made: the server counts a watcher more.
        let until = Instant::now() + Duration::from_secs(10);
        while watchers().await.unwrap_or(0.0) <= watchers_before {
            assert!(
                Instant::now() < until,
                "round {round}: the waiter never watched"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        g.release().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("the waiter was granted")
            .unwrap()
            .unwrap();
        // Closed in even rounds, dropped in odd ones.
        if round % 2 == 0 {
            waiter.close().await.unwrap();
        } else {
            drop(waiter);
        }
    }
    holder.close().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, w) = (streams().await.unwrap(), watchers().await.unwrap());
        if s <= streams_before && w <= watchers_before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {ROUNDS} sessions that waited and ended: {s} watch streams ({streams_before} \
             before), {w} watches ({watchers_before} before)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
