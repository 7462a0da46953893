//! fencelock's metrics (`fencelock::metrics`), recorded through the `metrics` facade, read back
//! from `metrics-util`'s debugging recorder (installed globally: this binary has this one test).

use std::time::Duration;

use fencelock::metrics as m;
use fencelock::{MemoryBackend, Session};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};

/// One reading of every metric (a snapshot drains what it reads: take one).
type Snapshot = Vec<(CompositeKey, DebugValue)>;

/// The counter `name` whose labels include all of `labels`, summed over the others.
fn counter(snap: &Snapshot, name: &str, labels: &[(&str, &str)]) -> u64 {
    snap.iter()
        .filter(|(k, _)| k.kind() == MetricKind::Counter && k.key().name() == name)
        .filter(|(k, _)| {
            labels
                .iter()
                .all(|(n, v)| k.key().labels().any(|l| l.key() == *n && l.value() == *v))
        })
        .map(|(_, v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

/// The longest wait recorded in the series of the wait histogram labelled `label`.
fn longest_wait(snap: &Snapshot, label: (&str, &str)) -> f64 {
    snap.iter()
        .filter(|(k, _)| {
            k.key().name() == m::WAIT_SECONDS
                && k.key()
                    .labels()
                    .any(|l| l.key() == label.0 && l.value() == label.1)
        })
        .flat_map(|(_, v)| match v {
            DebugValue::Histogram(h) => h.iter().map(|f| f.into_inner()).collect(),
            _ => Vec::new(),
        })
        .fold(0.0_f64, f64::max)
}

fn histogram_count(snap: &Snapshot, name: &str) -> usize {
    snap.iter()
        .filter(|(k, _)| k.key().name() == name)
        .map(|(_, v)| match v {
            DebugValue::Histogram(h) => h.len(),
            _ => 0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_metric_is_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    let backend = MemoryBackend::new();
    let start = |ttl| {
        Session::builder(backend.clone())
            .ttl(Duration::from_millis(ttl))
            .metrics_lock_names(true)
            .start()
    };
    let (a, b) = (start(1500).await.unwrap(), start(10_000).await.unwrap());
    // A grant, a handoff, a try that finds it taken, a timeout.
    let g = a.mutex("jobs/x").unwrap().lock().await.unwrap();
    assert!(b
        .mutex("jobs/x")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .is_none());
    let e = b
        .mutex("jobs/x")
        .unwrap()
        .lock_timeout(Duration::from_millis(20))
        .await;
    assert!(e.is_err());
    let waiter = tokio::spawn({
        let m = b.mutex("jobs/x").unwrap();
        async move { m.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    g.release().await.unwrap();
    let gb = waiter.await.unwrap().unwrap();
    // A grant lost to a deletion.
    let lost = gb.lost();
    backend.delete_key(gb.key());
    lost.await;
    // A semaphore's permit: the semaphore's acquisition and hold, not its gate's (a mutex on
    // the cluster) besides.
    let permit = b.semaphore("pool", 2).unwrap().acquire().await.unwrap();
    permit.release().await.unwrap();
    // Acquirers queued behind a permit, one of them at the gate first: each one's wait runs
    // from its call, through the gate (it ran from its lease's request: the gate's time was
    // counted nowhere). The later one waits the holder's 300 ms and the first one's 200 ms.
    let one = |s: &Session| s.semaphore("one", 1).unwrap();
    let (c, d, e) = (
        start(10_000).await.unwrap(),
        start(10_000).await.unwrap(),
        start(10_000).await.unwrap(),
    );
    let first = one(&c).acquire().await.unwrap();
    let queued: Vec<_> = [&d, &e]
        .into_iter()
        .map(|s| {
            let sem = one(s);
            tokio::spawn(async move { sem.acquire().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.release().await.unwrap();
    let mut queued = queued.into_iter();
    let (x, y) = (queued.next().unwrap(), queued.next().unwrap());
    // Whichever is granted first holds 200 ms.
    let (granted, other) = match futures::future::select(x, y).await {
        futures::future::Either::Left(done) | futures::future::Either::Right(done) => done,
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    granted.unwrap().unwrap().release().await.unwrap();
    other.await.unwrap().unwrap().release().await.unwrap();
    for s in [c, d, e] {
        s.close().await.unwrap();
    }
    // Tasks of one session: the second waits in the session's own queue, and its try, its
    // timeout and its wait are counted as another session's are (they were not counted at all).
    let held = b.mutex("local/x").unwrap().lock().await.unwrap();
    let local = b.mutex("local/x").unwrap();
    assert!(local.try_lock().await.unwrap().is_none());
    assert!(local.lock_timeout(Duration::from_millis(20)).await.is_err());
    let waiter = tokio::spawn(async move { local.lock().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    // A session lost at its local deadline.
    let r = a.rwlock("catalog").unwrap().read().await.unwrap();
    a.halt_heartbeats();
    tokio::time::timeout(Duration::from_secs(5), a.lost())
        .await
        .unwrap();
    drop(r);
    // Heartbeats: b beats every ttl/3.
    tokio::time::sleep(Duration::from_millis(3500)).await;

    let snap: Snapshot = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect();
    let mutex = [("primitive", "mutex"), ("name", "jobs/x")];
    let with = |extra: (&'static str, &'static str)| {
        let mut v = mutex.to_vec();
        v.push(extra);
        v
    };
    assert_eq!(
        counter(&snap, m::ACQUISITIONS, &with(("outcome", "granted"))),
        2
    );
    assert_eq!(
        counter(&snap, m::ACQUISITIONS, &with(("outcome", "not_acquired"))),
        1
    );
    assert_eq!(
        counter(&snap, m::ACQUISITIONS, &with(("outcome", "timeout"))),
        1
    );
    assert_eq!(counter(&snap, m::ACQUISITIONS, &[("primitive", "read")]), 1);
    let longest_semaphore_wait = longest_wait(&snap, ("primitive", "semaphore"));
    assert!(
        longest_semaphore_wait >= 0.45,
        "the longest semaphore wait, {longest_semaphore_wait:.3} s, leaves out the gate"
    );
    assert_eq!(
        counter(
            &snap,
            m::ACQUISITIONS,
            &[("primitive", "semaphore"), ("outcome", "granted")]
        ),
        4
    );
    let local = [("primitive", "mutex"), ("name", "local/x")];
    for (outcome, n) in [("granted", 2), ("not_acquired", 1), ("timeout", 1)] {
        let mut labels = local.to_vec();
        labels.push(("outcome", outcome));
        assert_eq!(
            counter(&snap, m::ACQUISITIONS, &labels),
            n,
            "local/x {outcome}"
        );
    }
    assert_eq!(counter(&snap, m::HANDOFFS, &local), 1, "local/x's wait");
    let longest_local_wait = longest_wait(&snap, ("name", "local/x"));
    assert!(
        longest_local_wait >= 0.2,
        "the wait in the session's own queue, {longest_local_wait:.3} s, left out"
    );
    assert_eq!(
        counter(&snap, m::ACQUISITIONS, &[("primitive", "mutex")]),
        8,
        "jobs/x's four, local/x's four, and no semaphore gate's"
    );
    assert_eq!(counter(&snap, m::HANDOFFS, &mutex), 1);
    assert_eq!(counter(&snap, m::LOSSES, &[("reason", "entry_deleted")]), 1);
    assert_eq!(
        counter(&snap, m::LOSSES, &[("reason", "local_deadline")]),
        1
    );
    assert!(histogram_count(&snap, m::WAIT_SECONDS) >= 3);
    assert!(
        histogram_count(&snap, m::HOLD_SECONDS) >= 2,
        "released and lost tenures"
    );
    assert!(histogram_count(&snap, m::HEARTBEAT_SECONDS) >= 1);
    let sessions: Vec<_> = snap
        .iter()
        .filter(|(k, _)| k.key().name() == m::SESSIONS)
        .map(|(k, v)| (k.key().labels().next().map(|l| l.value().to_string()), v))
        .collect();
    assert!(
        sessions.iter().any(|(l, v)| l.as_deref() == Some("live")
            && matches!(v, DebugValue::Gauge(g) if g.into_inner() == 1.0)),
        "b alone is live: {sessions:?}"
    );
    b.close().await.unwrap();
}
