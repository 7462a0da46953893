//! Leader election: one leader, FIFO succession, observation, stepping down.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures_util::StreamExt;

use super::{bounded, open, unique_namespace, wait_entries, Factory, TTL, WAIT};
use crate::{Error, LeaderInfo, LostReason};

/// Of five candidates exactly one leads; `leader()` names it.
pub async fn single_leader_among_five(f: &dyn Factory) {
    let ns = unique_namespace("single_leader");
    let mut sessions = Vec::new();
    for _ in 0..5 {
        sessions.push(open(f, &ns, TTL).await);
    }
    let leaders = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        let (s, leaders) = (s.clone(), leaders.clone());
        tasks.push(tokio::spawn(async move {
            let l = s
                .election("e")
                .unwrap()
                .campaign(format!("c{i}"))
                .await
                .unwrap();
            leaders.lock().unwrap().push((i, l.epoch()));
            std::future::pending::<()>().await;
            drop(l);
        }));
    }
    wait_entries(&sessions[0], "five candidates", |l| l.len() == 5).await;
    bounded(WAIT, "a leader", async {
        loop {
            if leaders.lock().unwrap().len() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // Give any second (wrong) leader a chance to appear.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = leaders.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "exactly one leader: {got:?}");
    let li = sessions[0]
        .election("e")
        .unwrap()
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(li.value, format!("c{}", got[0].0).into_bytes());
    assert_eq!(li.epoch, got[0].1);
    for t in tasks {
        t.abort();
    }
    for s in sessions {
        s.close().await.unwrap();
    }
}

/// Resigning promotes the next candidate in FIFO order with a larger epoch; after the last
/// resigns, there is no leader.
pub async fn resign_promotes_in_fifo_order(f: &dyn Factory) {
    let ns = unique_namespace("resign_fifo");
    let first = open(f, &ns, TTL).await;
    let e = first.election("e").unwrap();
    let l0 = e.campaign(b"0").await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut sessions = Vec::new();
    for i in 1..5 {
        let s = open(f, &ns, TTL).await;
        sessions.push(s.clone());
        let tx = tx.clone();
        tokio::spawn(async move {
            let l = s
                .election("e")
                .unwrap()
                .campaign(format!("{i}"))
                .await
                .unwrap();
            let _ = tx.send((i, l));
        });
        wait_entries(&first, "candidate queued", |l| l.len() == i + 1).await;
    }
    let mut epoch = l0.epoch();
    l0.resign().await.unwrap();
    for i in 1..5 {
        let (j, l) = bounded(WAIT, "next leader", rx.recv()).await.unwrap();
        assert_eq!(j, i, "FIFO succession");
        assert!(l.epoch() > epoch);
        epoch = l.epoch();
        let info = e.leader().await.unwrap().unwrap();
        assert_eq!(
            (info.value, info.epoch),
            (format!("{i}").into_bytes(), l.epoch())
        );
        l.resign().await.unwrap();
    }
    assert_eq!(
        e.leader().await.unwrap(),
        None,
        "no leader after the last resigns"
    );
    first.close().await.unwrap();
    for s in sessions {
        s.close().await.unwrap();
    }
}

/// `observe()` reports the current state first, then every change: a new leader, a proclaimed
/// value, a successor, and `None` when the last candidate leaves.
pub async fn observe_reports_every_change(f: &dyn Factory) {
    let ns = unique_namespace("observe");
    let watcher = open(f, &ns, TTL).await;
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let stream = watcher.election("e").unwrap().observe();
    tokio::pin!(stream);
    assert_eq!(next(&mut stream).await, None);
    let la = a.election("e").unwrap().campaign(b"a1").await.unwrap();
    assert_eq!(
        next(&mut stream).await,
        Some(LeaderInfo {
            value: b"a1".to_vec(),
            epoch: la.epoch()
        })
    );
    la.proclaim(b"a2").await.unwrap();
    assert_eq!(
        next(&mut stream).await,
        Some(LeaderInfo {
            value: b"a2".to_vec(),
            epoch: la.epoch()
        })
    );
    let cb = tokio::spawn({
        let b = b.clone();
        async move { b.election("e").unwrap().campaign(b"b1").await }
    });
    wait_entries(&a, "b queued", |l| l.len() == 2).await;
    la.resign().await.unwrap();
    let lb = bounded(WAIT, "b leads", cb).await.unwrap().unwrap();
    assert_eq!(
        next(&mut stream).await,
        Some(LeaderInfo {
            value: b"b1".to_vec(),
            epoch: lb.epoch()
        })
    );
    lb.resign().await.unwrap();
    assert_eq!(next(&mut stream).await, None, "no leader is reported");
    for s in [watcher, a, b] {
        s.close().await.unwrap();
    }
}

async fn next<S>(stream: &mut std::pin::Pin<&mut S>) -> Option<LeaderInfo>
where
    S: futures_core::Stream<Item = crate::Result<Option<LeaderInfo>>>,
{
    bounded(WAIT, "observe", stream.next())
        .await
        .expect("stream goes on")
        .expect("no error")
}

/// A leader that resigned, or whose entry was deleted, cannot proclaim.
pub async fn deposed_leader_cannot_proclaim(f: &dyn Factory) {
    let ns = unique_namespace("deposed_proclaim");
    let a = open(f, &ns, TTL).await;
    let e = a.election("e").unwrap();
    let l = e.campaign(b"v1").await.unwrap();
    l.proclaim(b"v2").await.unwrap();
    assert_eq!(e.leader().await.unwrap().unwrap().value, b"v2");
    f.delete_as_admin(l.key()).await.unwrap();
    // Found out by the refused write alone (no `lost()` asked): `is_leader()` says so too.
    assert!(matches!(
        l.proclaim(b"v3").await,
        Err(Error::NotHeld(LostReason::EntryDeleted))
    ));
    assert!(!l.is_leader(), "still leader after a refused proclaim");
    assert_eq!(
        bounded(WAIT, "lost fires", l.lost()).await,
        LostReason::EntryDeleted
    );
    // Resigning a lost leadership reports it (and frees the local slot).
    assert!(matches!(l.resign().await, Err(Error::NotHeld(_))));
    let l2 = e.campaign(b"w1").await.unwrap();
    l2.resign().await.unwrap();
    assert!(matches!(l2.proclaim(b"w2").await, Err(Error::NotHeld(_))));
    assert_eq!(e.leader().await.unwrap(), None);
    a.close().await.unwrap();
}

/// A leader whose heartbeats stop (cut off, paused) fires `lost()` before the successor's
/// `campaign()` returns.
pub async fn leader_steps_down_before_successor(f: &dyn Factory) {
    let ns = unique_namespace("step_down");
    let ttl = f.short_ttl();
    let a = open(f, &ns, ttl).await;
    let b = open(f, &ns, TTL).await;
    let la = a.election("e").unwrap().campaign(b"a").await.unwrap();
    let lost = tokio::spawn({
        let lost = la.lost();
        async move {
            lost.await;
            tokio::time::Instant::now()
        }
    });
    a.halt_heartbeats();
    let lb = bounded(
        ttl * 4 + WAIT,
        "successor",
        b.election("e").unwrap().campaign(b"b"),
    )
    .await
    .unwrap();
    let b_at = tokio::time::Instant::now();
    let a_at = bounded(WAIT, "a lost", lost).await.unwrap();
    assert!(a_at <= b_at, "the old leader stepped down first");
    assert!(lb.epoch() > la.epoch());
    lb.resign().await.unwrap();
    b.close().await.unwrap();
}

/// Dropping a `campaign()` future leaves no entry.
pub async fn cancelled_campaign_leaves_no_entry(f: &dyn Factory) {
    let ns = unique_namespace("cancelled_campaign");
    let a = open(f, &ns, TTL).await;
    let b = open(f, &ns, TTL).await;
    let la = a.election("e").unwrap().campaign(b"a").await.unwrap();
    let eb = b.election("e").unwrap();
    for i in 0..8u64 {
        let _ = tokio::time::timeout(Duration::from_micros(i * i * 400), eb.campaign(b"b")).await;
    }
    bounded(WAIT, "flush", b.flush()).await;
    {
        let fut = eb.campaign(b"b");
        tokio::pin!(fut);
        assert!(tokio::time::timeout(Duration::from_millis(1), &mut fut)
            .await
            .is_err());
        wait_entries(&a, "b queued", |l| l.len() == 2).await;
    }
    bounded(WAIT, "flush", b.flush()).await;
    assert_eq!(a.list_entries().await.unwrap().len(), 1);
    la.resign().await.unwrap();
    assert!(a.list_entries().await.unwrap().is_empty());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Several candidates in one session queue locally: one leads, the next leads after it
/// resigns, with a larger epoch.
pub async fn candidates_in_one_session(f: &dyn Factory) {
    let ns = unique_namespace("local_candidates");
    let s = open(f, &ns, TTL).await;
    let e = Arc::new(s.election("e").unwrap());
    let l1 = e.campaign(b"one").await.unwrap();
    let second = tokio::spawn({
        let e = e.clone();
        async move { e.campaign(b"two").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!second.is_finished(), "one leader at a time");
    assert_eq!(s.list_entries().await.unwrap().len(), 1);
    l1.resign().await.unwrap();
    let l2 = bounded(WAIT, "second leads", second)
        .await
        .unwrap()
        .unwrap();
    assert!(l2.epoch() > l1.epoch());
    assert_eq!(e.leader().await.unwrap().unwrap().value, b"two");
    l2.resign().await.unwrap();
    s.close().await.unwrap();
}

/// `observe()` ends once its session is closed: one [`Error::SessionLost`], then the end of the
/// stream (no error loop).
pub async fn observe_ends_when_session_ends(f: &dyn Factory) {
    let ns = unique_namespace("observe_ends");
    let s = open(f, &ns, TTL).await;
    let stream = s.election("e").unwrap().observe();
    tokio::pin!(stream);
    assert_eq!(next(&mut stream).await, None, "no leader yet");
    s.close().await.unwrap();
    let item = bounded(WAIT, "the stream reports the loss", stream.next()).await;
    assert!(matches!(item, Some(Err(Error::SessionLost(_)))), "{item:?}");
    let end = bounded(WAIT, "the stream ends", stream.next()).await;
    assert!(end.is_none(), "{end:?}");
}
