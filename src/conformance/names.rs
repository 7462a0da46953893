//! One name, several primitives: a mutex and an election of the same name, and every
//! primitive on one name, in one session.

use std::time::Duration;

use super::{bounded, open, unique_namespace, Factory, TTL, WAIT};
use crate::Session;

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
