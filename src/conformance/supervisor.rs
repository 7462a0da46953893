//! The Supervisor: leading and holding kept up across lost terms, shutdown, and the end of
//! the work.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::{bounded, open, unique_namespace, wait_entries, Factory, TTL, WAIT};

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

/// Terms lost as soon as they begin (an operator deleting each new entry) are spaced by
/// growing pauses: seven terms take at least the six shortest pauses of the retry policy
/// (20 + 40 + … + 640 ms). Without them the supervisor looped at the speed of the cluster's
/// replies.
pub async fn supervisor_spaces_quick_losses(f: &dyn Factory) {
    let ns = unique_namespace("supervisor_quick");
    let builder = crate::Session::builder(f.backend()).namespace(&ns).ttl(TTL);
    let supervisor = crate::Supervisor::new(builder);
    let (terms_tx, mut terms) = tokio::sync::mpsc::unbounded_channel();
    let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        supervisor
            .hold(
                "m",
                async move {
                    let _ = stop.await;
                },
                move |guard| {
                    let tx = terms_tx.clone();
                    async move {
                        let _ = tx.send(guard.key().to_string());
                        std::future::pending::<()>().await;
                        drop(guard);
                    }
                },
            )
            .await
    });
    let mut first = None;
    for n in 0..7 {
        let key = bounded(WAIT, "next term", terms.recv()).await.unwrap();
        first.get_or_insert_with(tokio::time::Instant::now);
        if n < 6 {
            f.delete_as_admin(&key).await.unwrap();
        }
    }
    let took = first.unwrap().elapsed();
    assert!(
        took >= Duration::from_millis(1_260),
        "seven quickly lost terms within {took:?}: no pause between them"
    );
    let _ = stop_tx.send(());
    bounded(WAIT, "shutdown", run).await.unwrap().unwrap();
    let probe = open(f, &ns, TTL).await;
    wait_entries(&probe, "released on shutdown", |l| l.is_empty()).await;
    probe.close().await.unwrap();
}

/// A closure that drops its grant instead of moving it into the future it returns
/// (`|_leader| async { serve().await }`) would leave that future serving without the grant,
/// beside the next holder: supervision ends with `InvalidConfig` before the future is ever
/// polled, for `lead` and for `hold`, and nothing is left on the cluster.
pub async fn supervisor_refuses_a_grant_dropped_by_its_closure(f: &dyn Factory) {
    use std::sync::atomic::{AtomicBool, Ordering};
    for how in ["lead", "hold"] {
        let ns = unique_namespace("supervisor_dropped");
        let builder = crate::Session::builder(f.backend()).namespace(&ns).ttl(TTL);
        let supervisor = crate::Supervisor::new(builder);
        let polled = Arc::new(AtomicBool::new(false));
        let serve = {
            let polled = polled.clone();
            move || {
                let polled = polled.clone();
                async move {
                    polled.store(true, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                }
            }
        };
        let never = std::future::pending::<()>();
        let run = async {
            if how == "lead" {
                supervisor.lead("e", b"v", never, |_leader| serve()).await
            } else {
                supervisor.hold("m", never, |_guard| serve()).await
            }
        };
        let r = bounded(WAIT, "supervision ends at once", run).await;
        assert!(
            matches!(r, Err(crate::Error::InvalidConfig(_))),
            "{how}: {r:?}"
        );
        assert!(
            !polled.load(Ordering::SeqCst),
            "{how}: the future ran without its grant"
        );
        let probe = open(f, &ns, TTL).await;
        wait_entries(&probe, "nothing left", |l| l.is_empty()).await;
        probe.close().await.unwrap();
    }
}

/// A supervised future that releases its own grant (`hold` with `release()`, `hold` dropping
/// the guard, `hold` closing its session, `lead` with `resign()`) is not deposed: it runs exactly once, its release
/// completes (`Ok`), the code after it runs, and supervision then ends with `Ok(())` and no
/// entry left, as it does for a future that returns.
pub async fn supervisor_ends_when_the_work_releases(f: &dyn Factory) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for how in ["release", "drop", "close", "resign"] {
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
                                let r = match how {
                                    "drop" => {
                                        drop(guard);
                                        Ok(())
                                    }
                                    "close" => guard.session().close().await,
                                    _ => guard.release().await,
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

/// A term whose work holds the lock through a reentered guard, the first one dropped, is still
/// deposed when the lock is lost (an operator deletes its entry): its work is dropped and the
/// next term starts. (The first guard's release was taken for the work's own, and the term ran
/// on, holding nothing.)
pub async fn supervisor_deposes_a_term_held_through_a_reentered_guard(f: &dyn Factory) {
    let ns = unique_namespace("supervisor_reentered");
    let probe = open(f, &ns, TTL).await;
    let builder = crate::Session::builder(f.backend()).namespace(&ns).ttl(TTL);
    let supervisor = crate::Supervisor::new(builder);
    let (terms_tx, mut terms) = tokio::sync::mpsc::unbounded_channel();
    let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        supervisor
            .hold(
                "m",
                async move {
                    let _ = stop.await;
                },
                move |guard| {
                    let terms_tx = terms_tx.clone();
                    async move {
                        let inner = guard.reenter().unwrap();
                        drop(guard);
                        let _ = terms_tx.send(inner.key().to_string());
                        std::future::pending::<()>().await;
                        drop(inner);
                    }
                },
            )
            .await
    });
    let first = bounded(WAIT, "the first term", terms.recv()).await.unwrap();
    f.delete_as_admin(&first).await.unwrap();
    let second = bounded(WAIT, "a second term after the loss", terms.recv()).await;
    assert!(second.is_some(), "supervision ended");
    let _ = stop_tx.send(());
    bounded(WAIT, "shutdown", run).await.unwrap().unwrap();
    probe.close().await.unwrap();
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
