//! Leader election: one leader, FIFO succession, observation, stepping down.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures_util::StreamExt;

use super::{bounded, open, unique_namespace, wait_entries, Factory, TTL, WAIT};
use crate::{Error, LeaderInfo, LostReason, Session};

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
    bounded(WAIT, "lost fires", l.lost()).await;
    assert!(!l.is_leader());
    assert!(matches!(
        l.proclaim(b"v3").await,
        Err(Error::NotHeld(LostReason::EntryDeleted))
    ));
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

/// A [`Supervisor`](crate::Supervisor) keeps leading: when its leadership is lost (its entry
/// deleted), the running `lead` future is dropped and a new term begins with a larger epoch;
/// on shutdown it returns with everything released.
pub async fn supervisor_keeps_leading(f: &dyn Factory) {
    let ns = unique_namespace("supervisor");
    let builder = crate::Session::builder(f.backend()).namespace(&ns).ttl(TTL);
    let supervisor = crate::Supervisor::new(builder);
    let (terms_tx, mut terms) = tokio::sync::mpsc::unbounded_channel();
    let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        supervisor
            .lead(
                "e",
                b"v",
                async move {
                    let _ = stop.await;
                },
                move |leader| {
                    let tx = terms_tx.clone();
                    async move {
                        let _ = tx.send((leader.epoch(), leader.key().to_string()));
                        std::future::pending::<()>().await;
                        drop(leader);
                    }
                },
            )
            .await
    });
    let (first, key) = bounded(WAIT, "first term", terms.recv()).await.unwrap();
    f.delete_as_admin(&key).await.unwrap();
    let (second, _) = bounded(WAIT, "second term", terms.recv()).await.unwrap();
    assert!(second > first, "a new term has a larger epoch");
    let _ = stop_tx.send(());
    bounded(WAIT, "shutdown", run).await.unwrap().unwrap();
    let probe = open(f, &ns, TTL).await;
    wait_entries(&probe, "released on shutdown", |l| l.is_empty()).await;
    probe.close().await.unwrap();
}

/// A supervised future that releases its own grant (`hold` with `release()`, `hold` dropping
/// the guard, `lead` with `resign()`) is not deposed: it runs exactly once, its release
/// completes (`Ok`), the code after it runs, and supervision then ends with `Ok(())` and no
/// entry left, as it does for a future that returns.
pub async fn supervisor_ends_when_the_work_releases(f: &dyn Factory) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for how in ["release", "drop", "resign"] {
        let ns = unique_namespace("supervisor_release");
        let builder = crate::Session::builder(f.backend()).namespace(&ns).ttl(TTL);
        let supervisor = crate::Supervisor::new(builder);
        let runs = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        let released = Arc::new(StdMutex::new(Vec::new()));
        let after_release = {
            let (finished, released) = (finished.clone(), released.clone());
            move |r: crate::Result<()>| {
                let (finished, released) = (finished.clone(), released.clone());
                async move {
                    released.lock().unwrap().push(r.map_err(|e| e.to_string()));
                    // Work after the release: it must not be cut short.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                }
            }
        };
        let never = std::future::pending::<()>();
        let run = {
            let runs = runs.clone();
            async move {
                if how == "resign" {
                    supervisor
                        .lead("e", b"v", never, move |leader| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            let after = after_release.clone();
                            async move { after(leader.resign().await).await }
                        })
                        .await
                } else {
                    supervisor
                        .hold("m", never, move |guard| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            let after = after_release.clone();
                            async move {
                                let r = if how == "drop" {
                                    drop(guard);
                                    Ok(())
                                } else {
                                    guard.release().await
                                };
                                after(r).await
                            }
                        })
                        .await
                }
            }
        };
        let r = bounded(WAIT, "supervision ends after the work released", run).await;
        assert!(r.is_ok(), "{how}: {r:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{how}: ran again");
        assert_eq!(*released.lock().unwrap(), vec![Ok(())], "{how}");
        assert_eq!(finished.load(Ordering::SeqCst), 1, "{how}: cut short");
        let probe = open(f, &ns, TTL).await;
        wait_entries(&probe, "nothing left", |l| l.is_empty()).await;
        probe.close().await.unwrap();
    }
}

/// A supervised candidate whose waiting entry an operator deletes campaigns again instead of
/// failing: it leads once the leader resigns, and the election is not left without a leader.
pub async fn supervisor_campaigns_again_when_its_entry_is_deleted(f: &dyn Factory) {
    let ns = unique_namespace("supervisor_entry_deleted");
    let a = open(f, &ns, TTL).await;
    let leader = a.election("e").unwrap().campaign(b"a").await.unwrap();
    let builder = crate::Session::builder(f.backend()).namespace(&ns).ttl(TTL);
    let supervisor = crate::Supervisor::new(builder);
    let (terms_tx, mut terms) = tokio::sync::mpsc::unbounded_channel();
    let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
    let mut run = tokio::spawn(async move {
        supervisor
            .lead(
                "e",
                b"b",
                async move {
                    let _ = stop.await;
                },
                move |l| {
                    let _ = terms_tx.send(l.epoch());
                    async move {
                        std::future::pending::<()>().await;
                        drop(l);
                    }
                },
            )
            .await
    });
    let list = wait_entries(&a, "the supervised candidate waits", |l| l.len() == 2).await;
    let waiting = list.into_iter().find(|k| k != leader.key()).unwrap();
    f.delete_as_admin(&waiting).await.unwrap();
    leader.resign().await.unwrap();
    let term = crate::race::race(
        bounded(WAIT, "the supervised candidate leads", terms.recv()),
        &mut run,
    )
    .await;
    let epoch = match term {
        crate::race::First::Left(Some(epoch)) => epoch,
        crate::race::First::Left(None) => {
            let ended = bounded(WAIT, "supervision's end", run).await;
            panic!("supervision gave up: {ended:?}")
        }
        crate::race::First::Right(ended) => panic!("supervision gave up: {ended:?}"),
    };
    let info = a.election("e").unwrap().leader().await.unwrap();
    assert_eq!(info.map(|i| i.epoch), Some(epoch), "it leads");
    let _ = stop_tx.send(());
    bounded(WAIT, "shutdown", run).await.unwrap().unwrap();
    a.close().await.unwrap();
}

/// A mutex and an election of the same name in one session queue behind each other where
/// they are one queue (on etcd, in memory and on Redis both make the same entry key): the
/// campaign waits for the mutex guard instead of adopting its entry, and resigning never
/// deletes the mutex's entry. Where they are independent (ZooKeeper), the campaign is granted
/// at once, and resigning leaves the mutex held.
pub async fn mutex_and_election_of_one_name(f: &dyn Factory) {
    let ns = unique_namespace("mutex_and_election");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    if !f.backend().mutex_and_election_share_queue() {
        let guard = a.mutex("x").unwrap().lock().await.unwrap();
        let leader = bounded(
            WAIT,
            "independent campaign",
            a.election("x").unwrap().campaign(b"v"),
        )
        .await
        .unwrap();
        leader.resign().await.unwrap();
        assert!(guard.is_held());
        assert!(b.mutex("x").unwrap().try_lock().await.unwrap().is_none());
        guard.release().await.unwrap();
        assert!(b.mutex("x").unwrap().try_lock().await.unwrap().is_some());
        a.close().await.unwrap();
        b.close().await.unwrap();
        return;
    }
    let guard = a.mutex("x").unwrap().lock().await.unwrap();
    let election = a.election("x").unwrap();
    let early = tokio::time::timeout(Duration::from_millis(300), election.campaign(b"v")).await;
    assert!(
        early.is_err(),
        "the campaign did not wait for the mutex guard"
    );
    assert!(guard.is_held());
    assert!(b.mutex("x").unwrap().try_lock().await.unwrap().is_none());
    guard.release().await.unwrap();
    let leader = bounded(
        WAIT,
        "the campaign after the release",
        election.campaign(b"v"),
    )
    .await
    .unwrap();
    leader.resign().await.unwrap();
    let g = b.mutex("x").unwrap().try_lock().await.unwrap();
    assert!(g.is_some(), "nothing of a's is left on x");
    drop(g);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A primitive of the matrix in [`one_name_several_primitives`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prim {
    Mutex,
    Election,
    Read,
    Write,
    Semaphore,
}

impl Prim {
    /// Takes `self` on `name` without waiting: the held guard (dropped to release), or `None`
    /// if it is taken.
    async fn take(self, s: &Session, name: &str) -> Option<Box<dyn Send>> {
        fn boxed<T: Send + 'static>(g: Option<T>) -> Option<Box<dyn Send>> {
            g.map(|g| Box::new(g) as Box<dyn Send>)
        }
        let r = match self {
            Prim::Mutex => boxed(s.mutex(name).unwrap().try_lock().await.unwrap()),
            Prim::Election => boxed(s.election(name).unwrap().try_campaign(b"v").await.unwrap()),
            Prim::Read => boxed(s.rwlock(name).unwrap().try_read().await.unwrap()),
            Prim::Write => boxed(s.rwlock(name).unwrap().try_write().await.unwrap()),
            Prim::Semaphore => boxed(s.semaphore(name, 1).unwrap().try_acquire().await.unwrap()),
        };
        r
    }

    fn family(self) -> &'static str {
        match self {
            Prim::Mutex => "mutex",
            Prim::Election => "election",
            Prim::Read | Prim::Write => "rwlock",
            Prim::Semaphore => "semaphore",
        }
    }
}

/// One name, several primitives: what each pair does, across two sessions and in one. A
/// mutex and an election of one name are one queue where the backend says so
/// ([`Backend::mutex_and_election_share_queue`](crate::backend::Backend::mutex_and_election_share_queue):
/// etcd, memory, Redis) and independent where it does not (ZooKeeper); every other pair
/// (mutex/rwlock, mutex/semaphore, rwlock/election, rwlock/semaphore, election/semaphore) is
/// independent on every backend. The README's table "One name, several primitives" says the
/// same.
pub async fn one_name_several_primitives(f: &dyn Factory) {
    use Prim::*;
    let ns = unique_namespace("one_name");
    let (a, b) = (open(f, &ns, TTL).await, open(f, &ns, TTL).await);
    let shared = f.backend().mutex_and_election_share_queue();
    let pairs = [
        (Mutex, Election),
        (Election, Mutex),
        (Mutex, Write),
        (Read, Mutex),
        (Mutex, Semaphore),
        (Semaphore, Mutex),
        (Write, Election),
        (Election, Read),
        (Write, Semaphore),
        (Election, Semaphore),
    ];
    let mut wrong = Vec::new();
    for (i, (first, second)) in pairs.into_iter().enumerate() {
        let mut families = [first.family(), second.family()];
        families.sort_unstable();
        let one_queue = shared && families == ["election", "mutex"];
        for (where_, other) in [("two sessions", &b), ("one session", &a)] {
            let name = format!("n{i}-{}", where_.len());
            let held = bounded(WAIT, "first", first.take(&a, &name))
                .await
                .unwrap_or_else(|| panic!("{first:?} {name} is free"));
            let got = bounded(WAIT, "second", second.take(other, &name)).await;
            if got.is_some() == one_queue {
                wrong.push(format!(
                    "{first:?} held, {second:?} in {where_}: {}",
                    if got.is_some() { "granted" } else { "refused" }
                ));
            }
            drop((got, held));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} (mutex and election one queue: {shared}): {wrong:#?}",
        f.backend().name()
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
}
