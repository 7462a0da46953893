//! The conformance suite on the in-memory backend.

fencelock::conformance_tests!(async { Some(fencelock::conformance::MemoryFactory::new()) });

use std::time::Duration;

use fencelock::{MemoryBackend, Session};

/// A multi-lock `try_lock` whose all-or-nothing create committed but whose reply was lost,
/// retried after another session queued behind it, reports "not acquired" — and leaves no
/// entry behind: the other session gets the lock at once, not when the first session ends.
/// (The clock is paused: the retry waits its backoff while the other session queues.)
#[tokio::test(start_paused = true)]
async fn multi_lock_retry_after_a_lost_reply_leaves_nothing() {
    let backend = MemoryBackend::new();
    let a = Session::builder(backend.clone()).start().await.unwrap();
    let b = Session::builder(backend.clone()).start().await.unwrap();
    backend.lose_create_replies(1);
    let waiter = tokio::spawn({
        let (backend, b) = (backend.clone(), b.clone());
        async move {
            backend.reply_lost().await;
            b.mutex("y").unwrap().lock().await.unwrap()
        }
    });
    let got = a.multi_lock(["x", "y"]).unwrap().try_lock().await.unwrap();
    assert!(got.is_none(), "y had a waiter ahead of the retry");
    let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("b is granted y once a's retry gave up")
        .unwrap();
    let entries = a.list_entries().await.unwrap();
    assert_eq!(entries.len(), 1, "only b's entry is left: {entries:?}");
    guard.release().await.unwrap();
}

/// A release whose delete was carried out but whose reply was lost (a member that hung, a
/// leader that died with the reply): the retry finds the entry gone, and the release still
/// succeeds — our own delete, not someone else's, removed it.
#[tokio::test(start_paused = true)]
async fn release_after_a_lost_reply_succeeds() {
    let backend = MemoryBackend::new();
    let s = Session::builder(backend.clone()).start().await.unwrap();
    let guard = s.mutex("x").unwrap().lock().await.unwrap();
    backend.lose_remove_replies(1);
    guard
        .release()
        .await
        .expect("our own delete removed the entry");
    assert!(s.list_entries().await.unwrap().is_empty());
    // Without a lost reply, a second release is told it was released already.
    let again = s.mutex("x").unwrap().lock().await.unwrap();
    again.release().await.unwrap();
    assert!(matches!(
        again.release().await,
        Err(fencelock::Error::NotHeld(fencelock::LostReason::Released))
    ));
}

/// The last handle dropped while a heartbeat is in flight (a cluster slow to answer): the
/// session is ended on the cluster at once, without waiting for the heartbeat. (The heartbeat
/// task used to find the session's state gone once the heartbeat returned and end without
/// closing it: its locks and candidacies stayed until the cluster expired it, a TTL later;
/// then it closed it, but only once the heartbeat returned.) Its state is `Lost(Closed)` at
/// once.
#[tokio::test(start_paused = true)]
async fn dropped_during_a_heartbeat_the_session_is_still_closed() {
    let backend = MemoryBackend::new();
    let ttl = Duration::from_secs(60);
    let a = Session::builder(backend.clone())
        .ttl(ttl)
        .start()
        .await
        .unwrap();
    let id = a.id().to_string();
    let state = a.state_changes();
    backend.hold_keep_alives();
    tokio::time::timeout(ttl / 2, backend.keep_alive_held())
        .await
        .expect("a heartbeat within a period");
    drop(a);
    // The state stream reports the end at once.
    use futures::StreamExt;
    let seen: Vec<_> = tokio::time::timeout(Duration::from_secs(1), state.collect::<Vec<_>>())
        .await
        .expect("the state stream ends with the session");
    assert_eq!(
        seen.last(),
        Some(&fencelock::SessionState::Lost(
            fencelock::SessionEnd::Closed
        )),
        "{seen:?}"
    );
    // Closed on the cluster at once, the heartbeat still unanswered (it waited for the
    // heartbeat to return first, up to a third of the TTL).
    tokio::time::timeout(Duration::from_secs(5), async {
        while backend.session_alive(&id) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("closed on the cluster without waiting for the heartbeat in flight");
    backend.release_keep_alives();
}

/// Connection breaks reported faster than the heartbeat's retry pause (a link or member that
/// keeps resetting streams) while every keep-alive is answered: the beats still go out and the
/// session lives. (Each break put the next beat off by a fresh pause, so that none went out
/// and the session was lost at its deadline with the cluster answering.)
#[tokio::test(start_paused = true)]
async fn a_stream_of_connection_breaks_does_not_put_the_heartbeat_off() {
    let backend = MemoryBackend::new();
    let ttl = Duration::from_millis(600);
    let s = Session::builder(backend.clone())
        .ttl(ttl)
        .start()
        .await
        .unwrap();
    let beats_before = s.deadline();
    let mut reported = 0;
    let until = tokio::time::Instant::now() + ttl * 4;
    while tokio::time::Instant::now() < until {
        backend.report_disconnect();
        reported += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !matches!(s.state(), fencelock::SessionState::Lost(_)),
            "lost after {reported} breaks reported: {:?}",
            s.state()
        );
    }
    assert!(reported >= 200, "{reported}");
    assert!(
        s.deadline() > beats_before + ttl * 3,
        "no heartbeat went out"
    );
    s.close().await.unwrap();
}

/// On shutdown the Supervisor drops the term's future (and what it holds) before it closes the
/// session, as its docs say: no work of the old term runs on while a successor takes over.
/// (It closed the session first, with the future still alive.)
#[tokio::test(start_paused = true)]
async fn supervisor_drops_the_term_before_closing_its_session() {
    use std::sync::{Arc, Mutex};

    /// Notes, when dropped, whether its session was still alive on the cluster.
    struct Probe {
        backend: MemoryBackend,
        id: String,
        alive_at_drop: Arc<Mutex<Option<bool>>>,
    }
    impl Drop for Probe {
        fn drop(&mut self) {
            *self.alive_at_drop.lock().unwrap() = Some(self.backend.session_alive(&self.id));
        }
    }

    let backend = MemoryBackend::new();
    let supervisor = fencelock::Supervisor::new(Session::builder(backend.clone()));
    let alive_at_drop = Arc::new(Mutex::new(None));
    let (leading_tx, leading_rx) = tokio::sync::oneshot::channel::<()>();
    let mut leading_tx = Some(leading_tx);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let (backend, alive_at_drop) = (backend.clone(), alive_at_drop.clone());
        async move {
            supervisor
                .lead(
                    "e",
                    b"v",
                    async move {
                        let _ = stop_rx.await;
                    },
                    move |leader| {
                        // The key's last segment is the session's id.
                        let id = leader.key().rsplit('/').next().unwrap().to_string();
                        let probe = Probe {
                            backend: backend.clone(),
                            id,
                            alive_at_drop: alive_at_drop.clone(),
                        };
                        if let Some(tx) = leading_tx.take() {
                            let _ = tx.send(());
                        }
                        async move {
                            let (_leader, _probe) = (leader, probe);
                            std::future::pending::<()>().await;
                        }
                    },
                )
                .await
        }
    });
    tokio::time::timeout(Duration::from_secs(10), leading_rx)
        .await
        .expect("leading")
        .unwrap();
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("shut down")
        .unwrap()
        .unwrap();
    assert_eq!(
        *alive_at_drop.lock().unwrap(),
        Some(true),
        "the term's future was dropped while its session was still open"
    );
}

/// A re-entered guard's `lost()` resolves with `Released` when that guard is released (or
/// dropped), though the outer guard holds on; the outer guard's `lost()` stays pending until
/// its own release. (A re-entered guard's `lost()` used to wait for the last share.)
#[tokio::test(start_paused = true)]
async fn a_reentered_guards_lost_ends_with_its_own_release() {
    use fencelock::LostReason;
    let session = Session::builder(MemoryBackend::new())
        .start()
        .await
        .unwrap();
    let outer = session.mutex("a").unwrap().lock().await.unwrap();
    let inner = outer.reenter().unwrap();
    let inner_lost = inner.lost();
    let outer_lost = outer.lost();
    inner.release().await.unwrap();
    let within = Duration::from_secs(1);
    assert_eq!(
        tokio::time::timeout(within, inner_lost).await,
        Ok(LostReason::Released)
    );
    let dropped = outer.reenter().unwrap();
    let dropped_lost = dropped.lost();
    drop(dropped);
    assert_eq!(
        tokio::time::timeout(within, dropped_lost).await,
        Ok(LostReason::Released)
    );
    assert!(outer.is_held());
    let mut outer_lost = std::pin::pin!(outer_lost);
    assert!(
        tokio::time::timeout(within, outer_lost.as_mut())
            .await
            .is_err(),
        "the outer guard still holds"
    );
    outer.release().await.unwrap();
    assert_eq!(
        tokio::time::timeout(within, outer_lost).await,
        Ok(LostReason::Released)
    );
    session.close().await.unwrap();
}

/// A wait that gives up (`try_lock` on a held lock, `lock_timeout` past its bound) whose queue
/// entry the cluster refuses to remove (a permanent error): that error is returned, not
/// "not acquired" or the timeout, which promise that no entry is left.
#[tokio::test(start_paused = true)]
async fn a_refused_cleanup_is_reported_not_hidden() {
    use fencelock::Error;
    let backend = MemoryBackend::new();
    let a = Session::builder(backend.clone()).start().await.unwrap();
    let b = Session::builder(backend.clone()).start().await.unwrap();
    let held = a.mutex("x").unwrap().lock().await.unwrap();
    backend.refuse_removes(1);
    let tried = b.mutex("x").unwrap().try_lock().await;
    assert!(
        matches!(tried, Err(Error::PermissionDenied { .. })),
        "{tried:?}"
    );
    // The entry went to the background task, whose own try removes it.
    b.flush().await;
    backend.refuse_removes(1);
    let timed = b
        .mutex("x")
        .unwrap()
        .lock_timeout(Duration::from_millis(100))
        .await;
    assert!(
        matches!(timed, Err(Error::PermissionDenied { .. })),
        "{timed:?}"
    );
    b.flush().await;
    // Without the fault: "not acquired", and nothing of b's left behind.
    assert!(b.mutex("x").unwrap().try_lock().await.unwrap().is_none());
    assert_eq!(
        b.list_entries().await.unwrap(),
        vec![held.key().to_string()]
    );
    held.release().await.unwrap();
    b.close().await.unwrap();
    a.close().await.unwrap();
}

/// A waiter whose entry someone deletes while it waits (an operator's tool) fails at once with
/// `EntryVanished`, instead of waiting until the holder ahead of it goes.
#[tokio::test]
async fn a_waiter_whose_entry_is_deleted_fails_at_once() {
    let backend = MemoryBackend::new();
    let a = Session::builder(backend.clone()).start().await.unwrap();
    let b = Session::builder(backend.clone()).start().await.unwrap();
    let held = a.mutex("m").unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("m").unwrap().lock().await }
    });
    let key = loop {
        let entries = a.list_entries().await.unwrap();
        if let Some(k) = entries.into_iter().find(|k| k != held.key()) {
            break k;
        }
        tokio::task::yield_now().await;
    };
    assert!(backend.delete_key(&key));
    let r = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter still waits for the holder")
        .unwrap();
    assert!(
        matches!(r, Err(fencelock::Error::EntryVanished { .. })),
        "{r:?}"
    );
    held.release().await.unwrap();
}

/// A Supervisor never polls its term's future once the grant is lost by the clock, even when
/// the heartbeat task has not run yet to say so (the process was stopped past its deadline: all
/// timers come due at once). The term's code, finding `is_held()` false and dropping its guard,
/// was taken for a voluntary release, and supervision ended; now the next term starts.
#[tokio::test(start_paused = true)]
async fn a_supervised_term_never_runs_past_its_deadline() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let backend = MemoryBackend::new();
    let supervisor =
        fencelock::Supervisor::new(Session::builder(backend).ttl(Duration::from_millis(600)));
    let (terms, past) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let supervised = tokio::spawn({
        let (terms, past) = (terms.clone(), past.clone());
        async move {
            supervisor
                .hold(
                    "m",
                    async {
                        let _ = stopped.await;
                    },
                    |guard| {
                        terms.fetch_add(1, Ordering::SeqCst);
                        let past = past.clone();
                        async move {
                            while guard.is_held() {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            // Polled once the grant was lost.
                            past.fetch_add(1, Ordering::SeqCst);
                            drop(guard);
                            std::future::pending::<()>().await
                        }
                    },
                )
                .await
        }
    });
    while terms.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every task stopped past the deadline, as by SIGSTOP: the time jumps.
    tokio::time::advance(Duration::from_secs(2)).await;
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    while terms.load(Ordering::SeqCst) < 2 {
        assert!(
            tokio::time::Instant::now() < until,
            "no second term; supervision ended: {}",
            supervised.is_finished()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        past.load(Ordering::SeqCst),
        0,
        "the term ran past its deadline"
    );
    let _ = stop.send(());
    supervised.await.unwrap().unwrap();
}

/// A term that keeps its leadership beyond the term (moved into a spawned task), deposed by an
/// operator deleting its entry: the next term campaigns in a new session and leads (it waited
/// for ever behind the kept leadership's local slot).
#[tokio::test]
async fn a_leadership_kept_past_its_term_does_not_hold_up_the_next() {
    use std::sync::{Arc, Mutex};
    let backend = MemoryBackend::new();
    let supervisor = fencelock::Supervisor::new(Session::builder(backend.clone()));
    let keys = Arc::new(Mutex::new(Vec::<String>::new()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let supervised = tokio::spawn({
        let keys = keys.clone();
        async move {
            supervisor
                .lead(
                    "e",
                    b"v",
                    async {
                        let _ = stopped.await;
                    },
                    |leader| {
                        keys.lock().unwrap().push(leader.key().to_string());
                        // Kept alive past the term.
                        tokio::spawn(async move {
                            let _kept = leader;
                            std::future::pending::<()>().await;
                        });
                        std::future::pending::<()>()
                    },
                )
                .await
        }
    });
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(k) = keys.lock().unwrap().first().cloned() {
                return k;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("no first term");
    assert!(backend.delete_key(&first));
    tokio::time::timeout(Duration::from_secs(10), async {
        while keys.lock().unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the next term never began");
    let _ = stop.send(());
    supervised.await.unwrap().unwrap();
}

/// A loss keeps its reason: a closed session's guards say `Closed` also once the session's
/// local deadline has passed (a `lost()` asked for then said `LocalDeadline`), and a reentered
/// share released before the session was lost says `Released`.
#[tokio::test(start_paused = true)]
async fn a_loss_keeps_its_reason() {
    use fencelock::{LostReason, SessionEnd};
    use futures::FutureExt;
    let backend = MemoryBackend::new();
    let s = Session::builder(backend.clone())
        .ttl(Duration::from_secs(2))
        .start()
        .await
        .unwrap();
    let outer = s.mutex("m").unwrap().lock().await.unwrap();
    let inner = outer.reenter().unwrap();
    inner.release().await.unwrap();
    s.close().await.unwrap();
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        outer.lost().now_or_never(),
        Some(LostReason::Session(SessionEnd::Closed))
    );
    assert_eq!(inner.lost().now_or_never(), Some(LostReason::Released));
}

/// No grant is reported past the local deadline, whichever request's reply is read past it: a
/// multi-lock's all-or-nothing create, or a semaphore's read of its leases after the grant (the
/// process stopped with the reply on its way). The reply, ready at the first poll after the
/// stop, won the race against the session's loss: `Ok`, with a guard no longer held, while
/// the session was lost and its locks free for others. A mutex's create is the control.
#[tokio::test(flavor = "current_thread")]
async fn no_grant_is_reported_past_the_local_deadline() {
    use fencelock::Error;
    const TTL: Duration = Duration::from_secs(1);
    let pause = TTL + Duration::from_millis(500);
    let backend = MemoryBackend::new();
    let start = || Session::builder(backend.clone()).ttl(TTL).start();
    let s = start().await.unwrap();
    backend.stop_before_next_reply(fencelock::MemoryRequest::Create, pause);
    let got = s.mutex("m").unwrap().try_lock().await;
    assert!(matches!(got, Err(Error::SessionLost(_))), "mutex: {got:?}");
    let s = start().await.unwrap();
    backend.stop_before_next_reply(fencelock::MemoryRequest::Create, pause);
    let got = s.multi_lock(["a", "b"]).unwrap().try_lock().await;
    assert!(
        matches!(got, Err(Error::SessionLost(_))),
        "multi-lock: {got:?}"
    );
    let s = start().await.unwrap();
    backend.stop_before_next_reply(fencelock::MemoryRequest::Inspect, pause);
    let got = s.semaphore("pool", 2).unwrap().acquire().await;
    assert!(
        matches!(got, Err(Error::SessionLost(_))),
        "semaphore: {got:?}"
    );
    // The lost sessions' entries go with them.
    let probe = Session::builder(backend.clone())
        .ttl(Duration::from_secs(10))
        .start()
        .await
        .unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let left = probe.list_entries().await.unwrap();
        if left.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < until, "left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    probe.close().await.unwrap();
}

/// A session whose open took a while (a slow link: here the process stops with the reply on
/// its way) sends its first heartbeat a period after the open was sent, not a period after it
/// came back: the first beat came after the deadline, and the session was lost at once
/// without a heartbeat (any open past a sixth of the TTL at the default margin).
#[tokio::test(flavor = "current_thread")]
async fn a_slow_open_is_followed_by_a_heartbeat_in_time() {
    const TTL: Duration = Duration::from_secs(2);
    let backend = MemoryBackend::new();
    backend.stop_before_next_reply(fencelock::MemoryRequest::Open, Duration::from_millis(400));
    let s = Session::builder(backend.clone())
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    // Past the deadline of the open's send (TTL - 1 s margin), and a beat more.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(s.state(), fencelock::SessionState::Live);
    s.close().await.unwrap();
}

/// A read that keeps failing with a temporary error while the session lives (a Redis Cluster
/// shard that stays away, under a session that holds nothing and so sends no heartbeat) gives
/// up with that error after about a TTL: `leader()`, `holder()`, `list_entries()` retried it
/// for as long as the session lived, for ever (`fencelock leader` and `list` never ended).
#[tokio::test(start_paused = true)]
async fn a_read_failing_for_a_ttl_gives_up() {
    use fencelock::Error;
    const TTL: Duration = Duration::from_secs(2);
    let backend = MemoryBackend::new();
    let s = Session::builder(backend.clone())
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    backend.fail_reads(true);
    let start = tokio::time::Instant::now();
    let leader = tokio::time::timeout(4 * TTL, s.election("e").unwrap().leader())
        .await
        .expect("leader() gave up");
    assert!(
        matches!(&leader, Err(e @ Error::Backend { .. }) if e.is_temporary()),
        "{leader:?}"
    );
    assert!(start.elapsed() >= TTL * 9 / 10, "{:?}", start.elapsed());
    let holder = tokio::time::timeout(4 * TTL, s.mutex("m").unwrap().holder())
        .await
        .expect("holder() gave up");
    assert!(holder.is_err(), "{holder:?}");
    let listed = tokio::time::timeout(4 * TTL, s.list_entries())
        .await
        .expect("list_entries() gave up");
    assert!(listed.is_err(), "{listed:?}");
    assert_eq!(s.state(), fencelock::SessionState::Live);
    backend.fail_reads(false);
    assert_eq!(s.election("e").unwrap().leader().await.unwrap(), None);
    s.close().await.unwrap();
}

/// A session expired on the "cluster" (`expire_session`, as an operator revoking a lease) is
/// told at once, as etcd's keep-alive stream tells it: it learnt it only at its next
/// heartbeat, up to a third of the TTL later, `Live` and holding meanwhile.
#[tokio::test]
async fn an_expired_session_is_told_at_once() {
    use fencelock::{SessionEnd, SessionState};
    let backend = MemoryBackend::new();
    let s = Session::builder(backend.clone()).start().await.unwrap();
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    assert!(backend.expire_session(&s.id()));
    let end = tokio::time::timeout(Duration::from_secs(1), s.lost())
        .await
        .expect("told within a second (the TTL is 10 s)");
    assert_eq!(end, SessionEnd::Expired);
    assert_eq!(s.state(), SessionState::Lost(SessionEnd::Expired));
    assert!(!g.is_held());
}

/// On paused time (`start_paused`) a memory session's local deadline follows Tokio's clock,
/// as the memory cluster's expiry does: real time that passes while virtual time does not (a
/// test busy computing, a blocking call) does not end it. It was measured on the machine's
/// clock too, and a session at a short TTL was lost while the test's clock stood still.
#[tokio::test(start_paused = true)]
async fn paused_time_rules_a_memory_sessions_deadline() {
    use fencelock::SessionState;
    let backend = MemoryBackend::new();
    let s = Session::builder(backend.clone())
        .ttl(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    // Real time passes, virtual time does not.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.state(), SessionState::Live);
    assert!(g.is_held());
    // Virtual time passes, with heartbeats.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(s.state(), SessionState::Live);
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// A session whose runtime shut down (a test's, the session kept elsewhere) is no longer live:
/// nothing heartbeats it. It said `Live` until its deadline passed, seconds later.
#[test]
fn a_session_whose_runtime_shut_down_is_not_live() {
    use fencelock::{SessionEnd, SessionState};
    let backend = MemoryBackend::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt
        .block_on(Session::builder(backend.clone()).start())
        .unwrap();
    let held = rt.block_on(async { s.mutex("m").unwrap().lock().await.unwrap() });
    assert_eq!(s.state(), SessionState::Live);
    drop(rt);
    assert_eq!(s.state(), SessionState::Lost(SessionEnd::Closed));
    assert!(!held.is_held());
    // Closed on the cluster all the same by a close from another runtime: its lock is free at
    // once, not at its TTL.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        s.close().await.unwrap();
        let other = Session::builder(backend.clone()).start().await.unwrap();
        assert!(other
            .mutex("m")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_some());
        other.close().await.unwrap();
    });
    drop(held);
}

/// A session of TTL `ttl` on `backend` holding the lock `m` (see `close_at_deadline`), and its id.
async fn holding(
    backend: &MemoryBackend,
    ttl: Duration,
    close_at_deadline: bool,
) -> (Session, String, fencelock::Guard) {
    let a = Session::builder(backend.clone())
        .ttl(ttl)
        .close_at_deadline(close_at_deadline)
        .start()
        .await
        .unwrap();
    let id = a.id().to_string();
    let held = a.mutex("m").unwrap().lock().await.unwrap();
    (a, id, held)
}

/// `close_at_deadline(false)`: a session lost by its local deadline keeps its locks on the
/// cluster until its owner closes it (a TTL at most: the cluster's expiry), so that the owner
/// stops what they guard before the next holder is granted; its close then frees them at once.
/// By default the heartbeat task closes the session at the deadline.
#[tokio::test(start_paused = true)]
async fn a_session_left_open_at_its_deadline_holds_until_closed() {
    use fencelock::{LostReason, SessionEnd};
    for close_at_deadline in [true, false] {
        let backend = MemoryBackend::new();
        let ttl = Duration::from_secs(10);
        let (a, id, held) = holding(&backend, ttl, close_at_deadline).await;
        backend.hold_keep_alives();
        let lost = tokio::time::timeout(ttl, held.lost())
            .await
            .expect("lost by the local deadline");
        assert_eq!(lost, LostReason::Session(SessionEnd::LocalDeadline));
        // Half the margin (2 s) later: the cluster's expiry is a margin after the deadline.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            backend.session_alive(&id),
            !close_at_deadline,
            "close_at_deadline({close_at_deadline}): alive on the cluster after the loss"
        );
        a.close().await.unwrap();
        assert!(!backend.session_alive(&id), "closed on the cluster");
        backend.release_keep_alives();
        // The lock is free at once.
        let c = Session::builder(backend.clone()).start().await.unwrap();
        let g = c.mutex("m").unwrap().try_lock().await.unwrap();
        assert!(
            g.is_some(),
            "close_at_deadline({close_at_deadline}): still held"
        );
        c.close().await.unwrap();
    }
}

/// `close_at_deadline(false)`: a session closed as soon as its clock is past the deadline,
/// before its heartbeat task has said so (a process resumed from a stop, a machine from a
/// suspend), is closed on the cluster by that close. (The close found the session lost by the
/// clock and did nothing; the heartbeat task then left it for a close that had come already:
/// its locks stayed until the cluster expired it.)
#[tokio::test(start_paused = true)]
async fn a_close_just_past_the_deadline_still_closes() {
    let backend = MemoryBackend::new();
    let ttl = Duration::from_secs(10);
    let (a, id, _held) = holding(&backend, ttl, false).await;
    a.simulate_suspend(ttl);
    assert!(matches!(a.state(), fencelock::SessionState::Lost(_)));
    a.close().await.unwrap();
    assert!(!backend.session_alive(&id), "closed on the cluster");
    // Nor does the heartbeat task, which comes next, leave it for another close.
    tokio::time::sleep(ttl).await;
    assert!(!backend.session_alive(&id));
}

/// `close_at_deadline(false)`: a session lost by its deadline and then dropped without a
/// close is closed on the cluster all the same, as a dropped session is (the heartbeat task
/// had ended at the deadline: nothing closed it).
#[tokio::test(start_paused = true)]
async fn a_session_left_open_at_its_deadline_is_closed_when_dropped() {
    let backend = MemoryBackend::new();
    let ttl = Duration::from_secs(10);
    let (a, id, held) = holding(&backend, ttl, false).await;
    backend.hold_keep_alives();
    tokio::time::timeout(ttl, held.lost())
        .await
        .expect("lost by the local deadline");
    backend.release_keep_alives();
    drop(held);
    drop(a);
    tokio::time::timeout(Duration::from_secs(1), async {
        while backend.session_alive(&id) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("closed on the cluster once dropped, not at its expiry");
}

/// A supervisor's term ends (its future dropped) before its session frees the grant: a session
/// lost by its local deadline closed itself at once, on its heartbeat task, while the
/// supervisor dropped the term's future later, on its own task, so a second supervisor could
/// begin its term while the first one's future was still being dropped (black-box round 32: 11
/// of 59 hand-overs, by 11–36 µs). Here dropping a term takes 200 ms, and keep-alives go
/// unanswered past the leader's deadline: the next term begins only once the last one is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_supervised_term_is_dropped_before_its_successor_begins() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts the terms running; dropping one takes a while (a service stopping its work).
    struct Running(Arc<AtomicUsize>);
    impl Drop for Running {
        fn drop(&mut self) {
            std::thread::sleep(Duration::from_millis(200));
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    let backend = MemoryBackend::new();
    let (running, overlaps, terms) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut supervisors = Vec::new();
    for _ in 0..2 {
        let supervisor = fencelock::Supervisor::new(
            Session::builder(backend.clone()).ttl(Duration::from_secs(2)),
        );
        let (running, overlaps, terms) = (running.clone(), overlaps.clone(), terms.clone());
        let mut stopped = stopped.clone();
        supervisors.push(tokio::spawn(async move {
            supervisor
                .lead(
                    "e",
                    b"v",
                    async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    },
                    move |leader| {
                        if running.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        terms.fetch_add(1, Ordering::SeqCst);
                        let term = Running(running.clone());
                        async move {
                            let _held = (leader, term);
                            std::future::pending::<()>().await
                        }
                    },
                )
                .await
        }));
    }
    for cycle in 1..=3 {
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        while terms.load(Ordering::SeqCst) < cycle {
            assert!(
                tokio::time::Instant::now() < until,
                "cycle {cycle}: no term"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Past the leader's local deadline (1 s after its last confirmed heartbeat), short
        // of the cluster's expiry of its grant.
        backend.hold_keep_alives();
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        while terms.load(Ordering::SeqCst) < cycle + 1 {
            assert!(
                tokio::time::Instant::now() < until,
                "cycle {cycle}: no next term"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        backend.release_keep_alives();
    }
    let _ = stop.send(true);
    for s in supervisors {
        tokio::time::timeout(Duration::from_secs(30), s)
            .await
            .expect("supervision ends on shutdown")
            .unwrap()
            .unwrap();
    }
    assert!(terms.load(Ordering::SeqCst) >= 4, "the workload barely ran");
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "a term began while another one's future was still there"
    );
}

/// A term whose grant is lost before its future first runs (its entry deleted at once by an
/// operator's script, or its session lost by a suspend while the closure ran) is a loss as any
/// other: the next term begins. The check for a closure that drops its grant polled the term's
/// `lost()` to its end there, and the loop then polled it again: a panic.
#[tokio::test]
async fn a_grant_lost_before_its_term_ran_is_a_loss() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    for how in ["entry deleted", "session suspended"] {
        let backend = MemoryBackend::new();
        let supervisor = fencelock::Supervisor::new(Session::builder(backend.clone()));
        let terms = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let supervised = tokio::spawn({
            let (terms, backend) = (terms.clone(), backend.clone());
            async move {
                supervisor
                    .lead(
                        "e",
                        b"v",
                        async {
                            let _ = stopped.await;
                        },
                        move |leader| {
                            if terms.fetch_add(1, Ordering::SeqCst) == 0 {
                                if how == "entry deleted" {
                                    assert!(backend.delete_key(leader.key()));
                                } else {
                                    leader.session().simulate_suspend(Duration::from_secs(60));
                                }
                            }
                            async move {
                                let _leader = leader;
                                std::future::pending::<()>().await
                            }
                        },
                    )
                    .await
            }
        });
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        while terms.load(Ordering::SeqCst) < 2 {
            assert!(
                !supervised.is_finished(),
                "{how}: supervision ended: {:?}",
                supervised.await
            );
            assert!(tokio::time::Instant::now() < until, "{how}: no second term");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = stop.send(());
        supervised.await.unwrap().unwrap();
    }
}

/// A term's code that released its grant runs on to its end; its session, lost meanwhile by
/// the local deadline (a release the cluster refused, then keep-alives unanswered), is closed
/// at once, so what the failed release left goes then and not at the cluster's expiry (the
/// supervisor's sessions are not closed by their heartbeat task at the deadline).
#[tokio::test(start_paused = true)]
async fn a_session_lost_after_the_work_released_is_closed_at_once() {
    let backend = MemoryBackend::new();
    let (ttl, margin) = (DEADLINE_TTL, DEADLINE_MARGIN);
    let supervisor = deadline_supervisor(&backend);
    let (released_tx, released) = tokio::sync::oneshot::channel::<tokio::time::Instant>();
    let mut released_tx = Some(released_tx);
    let supervised = tokio::spawn({
        let backend = backend.clone();
        async move {
            supervisor
                .hold("m", std::future::pending::<()>(), move |guard| {
                    let (tx, backend) = (released_tx.take(), backend.clone());
                    async move {
                        backend.refuse_removes(1);
                        assert!(guard.release().await.is_err(), "the removal was refused");
                        backend.hold_keep_alives();
                        let _ = tx.expect("one term").send(tokio::time::Instant::now());
                        std::future::pending::<()>().await
                    }
                })
                .await
        }
    });
    let other = Session::builder(backend.clone())
        .ttl(Duration::from_secs(600))
        .start()
        .await
        .unwrap();
    let since = released.await.unwrap();
    let granted = granted_since(&other, "m", since).await;
    // The local deadline comes `ttl - margin` after the last heartbeat; the cluster's expiry
    // `ttl` after it.
    assert!(
        granted < ttl - margin / 2,
        "granted {granted:?} after the release failed: at the cluster's expiry, not the deadline"
    );
    supervised.abort();
}

/// A term's code that moved its grant into a task of its own, then panicked: supervision ends
/// with the panic, and the grant the task keeps lives on with its session; lost later by its
/// local deadline, that session is closed then, as any session by default, not left to the
/// cluster's expiry (the supervisor's sessions are not closed by their heartbeat task at the
/// deadline while a term's future may still run).
#[tokio::test(start_paused = true)]
async fn a_grant_kept_past_a_panicked_term_goes_at_the_deadline() {
    let backend = MemoryBackend::new();
    let (ttl, margin) = (DEADLINE_TTL, DEADLINE_MARGIN);
    let supervisor = deadline_supervisor(&backend);
    let supervised = tokio::spawn({
        let backend = backend.clone();
        async move {
            supervisor
                .hold("m", std::future::pending::<()>(), move |guard| {
                    let backend = backend.clone();
                    async move {
                        tokio::spawn(async move {
                            let _kept = guard;
                            std::future::pending::<()>().await
                        });
                        backend.hold_keep_alives();
                        panic!("the term's code panicked");
                    }
                })
                .await
        }
    });
    assert!(supervised.await.unwrap_err().is_panic());
    let since = tokio::time::Instant::now();
    let other = Session::builder(backend.clone())
        .ttl(Duration::from_secs(600))
        .start()
        .await
        .unwrap();
    let granted = granted_since(&other, "m", since).await;
    assert!(
        granted < ttl - margin / 2,
        "granted {granted:?} after the panic: at the cluster's expiry, not the deadline"
    );
}

/// The TTL and safety margin of the deadline tests above: the local deadline comes 5 s after
/// the last heartbeat, the cluster's expiry 10 s after it, so a grant before 7.5 s was freed by
/// the deadline's close, not by the expiry.
const DEADLINE_TTL: Duration = Duration::from_secs(10);
const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// A supervisor on `backend` whose sessions have [`DEADLINE_TTL`] and [`DEADLINE_MARGIN`].
fn deadline_supervisor(backend: &MemoryBackend) -> fencelock::Supervisor {
    fencelock::Supervisor::new(
        Session::builder(backend.clone())
            .ttl(DEADLINE_TTL)
            .safety_margin(DEADLINE_MARGIN),
    )
}

/// How long after `since` session `other` is first granted the mutex `name` (tried every
/// 50 ms, for at most a minute).
async fn granted_since(other: &Session, name: &str, since: tokio::time::Instant) -> Duration {
    loop {
        if other
            .mutex(name)
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_some()
        {
            return since.elapsed();
        }
        assert!(since.elapsed() < Duration::from_secs(60), "never granted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
