//! Redis behind Sentinel (three real sentinels, a primary and two replicas on loopback): the
//! backend finds the primary through the sentinels, follows a failover (a killed primary,
//! `SENTINEL FAILOVER`) with its sessions and held locks when grants wait for a replica, and
//! reports every wrong setting as a typed error within its timeout.

use std::time::{Duration, Instant};

use fencelock::{Error, Session, SessionState};
use fencelock_integration::proxy::{Mode, Proxy};
use fencelock_integration::servers::redis;
use fencelock_integration::servers::redis_sentinel::{Failover, SentinelGroup, MASTER};
use fencelock_redis::{RedisBackend, RedisConfig};
use futures::StreamExt;

const TTL: Duration = Duration::from_secs(6);

/// The TTL of the sessions across a failover. Through `SENTINEL FAILOVER` the old primary
/// takes writes until the sentinels reconfigure the other replica, which then needs a full
/// resynchronisation from the new primary, and no write is acknowledged by a replica
/// meanwhile: heartbeats fail for that long. A killed primary costs the failover (about 4 s)
/// and the other replica's move to the new primary, which a loaded machine stretched past a
/// TTL of 6 s (CI run 63), and past 15 s once and 20 s twice (clean-clone CI runs of
/// 2026-12-05, the second time with the test servers' `repl-diskless-sync-delay` at 0, the
/// failover done in 2.2 s; alone, the session is live again 2.8–4.4 s after the kill): the
/// holder's last heartbeat comes up to a third of the TTL before the kill and its deadline a
/// fifth before the TTL's end. A failure prints each server's replication state.
const FAILOVER_TTL: Duration = Duration::from_secs(30);
const WITHIN: Duration = Duration::from_secs(30);

async fn group(failover: Failover) -> Option<SentinelGroup> {
    if !redis::available() {
        return None;
    }
    Some(
        tokio::task::spawn_blocking(move || SentinelGroup::start(failover, 1))
            .await
            .unwrap(),
    )
}

async fn replicated(url: &str) -> RedisBackend {
    RedisConfig::new(url)
        .wait_for_replicas(1, Duration::from_millis(300))
        .connect()
        .await
        .unwrap()
}

async fn session(backend: &RedisBackend) -> Session {
    session_with(backend, TTL).await
}

async fn session_with(backend: &RedisBackend, ttl: Duration) -> Session {
    Session::builder(backend.clone())
        .namespace("/sentinel")
        .ttl(ttl)
        .start()
        .await
        .unwrap()
}

/// Whether the server at `i` holds the session key of `s`.
fn has_session(g: &SentinelGroup, i: usize, s: &Session) -> bool {
    g.server(i)
        .cli(&["EXISTS", &format!("fencelock:s:{}", s.id())])
        .unwrap_or_default()
        .trim()
        == "1"
}

/// Each server's replication state (role, replicas, link to its primary), for a failure's
/// message.
fn replication(g: &SentinelGroup) -> String {
    (0..3)
        .map(|i| {
            let info = g
                .server(i)
                .cli(&["INFO", "replication"])
                .unwrap_or_default();
            let wanted = [
                "role:",
                "connected_slaves:",
                "master_port:",
                "master_link_status:",
            ];
            let lines: Vec<&str> = info
                .lines()
                .map(str::trim)
                .filter(|l| wanted.iter().any(|w| l.starts_with(w)))
                .collect();
            format!(
                "server {i}: {}",
                if lines.is_empty() {
                    "down".into()
                } else {
                    lines.join(" ")
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Releases `held`, and returns the grant `waiter` gets then, with a larger token.
async fn hands_over(
    held: fencelock::Guard,
    waiter: tokio::task::JoinHandle<fencelock::Result<fencelock::Guard>>,
) -> fencelock::Guard {
    let token = held.token();
    held.release().await.unwrap();
    let next = tokio::time::timeout(WITHIN, waiter)
        .await
        .expect("the waiter was not granted after the release")
        .unwrap()
        .unwrap();
    assert!(next.token() > token, "{:?} after {:?}", next.token(), token);
    next
}

/// Fails the primary over as `how` says while a session holds a lock and another waits for
/// it (TTL [`FAILOVER_TTL`]): the holder keeps its lock, its session is Live again on the new primary, the waiter is
/// granted after the release with a larger token, and new sessions open there.
async fn follows(how: Failover) {
    let Some(g) = group(how).await else { return };
    let ttl = FAILOVER_TTL;
    let backend = match how {
        // Requests to a hung primary wait as long as the heartbeat's patience allows (a third
        // of the TTL), not the default 5 s, whose timeouts would have the sentinels asked.
        Failover::Pause => RedisConfig::new(g.url())
            .timeout(ttl)
            .wait_for_replicas(1, Duration::from_millis(300))
            .connect()
            .await
            .unwrap(),
        _ => replicated(&g.url()).await,
    };
    let (a, b) = (
        session_with(&backend, ttl).await,
        session_with(&backend, ttl).await,
    );
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let collector = tokio::spawn({
        let (seen, states) = (seen.clone(), a.state_changes());
        async move {
            let mut states = std::pin::pin!(states);
            while let Some(s) = states.next().await {
                seen.lock().unwrap().push(s);
            }
        }
    });
    let held = a.mutex("job").unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let m = b.mutex("job").unwrap();
        async move { m.lock().await }
    });
    let old = tokio::task::block_in_place(|| g.primary_index());
    assert!(has_session(&g, old, &a));

    if how != Failover::Command {
        // Killed half a second before a heartbeat is due, so that it meets the dead primary
        // (the session is seen Suspended below, however long the TTL): a heartbeat's reply
        // moves the deadline, and the next is sent a period (a third of the TTL) after it.
        let before = a.deadline();
        tokio::time::timeout(WITHIN, async {
            while a.deadline() <= before {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("no heartbeat");
        tokio::time::sleep(ttl / 3 - Duration::from_millis(500)).await;
    }
    tokio::task::block_in_place(|| match how {
        Failover::Kill => {
            g.server(old).kill();
        }
        Failover::Pause => g.server(old).pause(),
        Failover::Command => g.command_failover(),
    });
    let took = tokio::task::block_in_place(|| g.wait_failed_over(old));
    let new = tokio::task::block_in_place(|| g.primary_index());
    assert_ne!(new, old);
    println!("{how:?}: failed over from {old} to {new} in {took:.2?}");

    // The holder's session goes on, on the new primary: a heartbeat confirmed there.
    let live_on_new = tokio::time::timeout(WITHIN, async {
        loop {
            if a.state() == SessionState::Live
                && tokio::task::block_in_place(|| has_session(&g, new, &a))
            {
                // A heartbeat after the move: the deadline moves forward.
                let before = a.deadline();
                loop {
                    if a.deadline() > before {
                        return;
                    }
                    assert!(
                        !matches!(a.state(), SessionState::Lost(_)),
                        "lost: {:?}",
                        a.state()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            assert!(
                !matches!(a.state(), SessionState::Lost(_)),
                "the holder's session was lost: {:?} (states {:?}, failover {took:.2?}; {})\n{}",
                a.state(),
                seen.lock().unwrap(),
                tokio::task::block_in_place(|| replication(&g)),
                g.sentinel_logs(40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(live_on_new.is_ok(), "the session never came back Live");
    collector.abort();
    let seen = seen.lock().unwrap().clone();
    println!("{how:?}: the holder's session went {seen:?}");
    if how == Failover::Pause {
        // Back, it is demoted by the sentinels; the session stays on the new primary.
        tokio::task::block_in_place(|| g.server(old).resume());
    }
    if how != Failover::Command {
        // Its heartbeats failed while the primary was down, and then succeeded again.
        let suspended = seen.iter().position(|s| *s == SessionState::Suspended);
        assert!(suspended.is_some(), "never Suspended: {seen:?}");
        assert!(
            seen[suspended.unwrap()..].contains(&SessionState::Live),
            "{seen:?}"
        );
    }
    if waiter.is_finished() {
        let got = waiter.await.unwrap().map(|g| g.token());
        panic!(
            "the waiter was granted a held lock (token {:?}, the holder's {}; states {seen:?}; \
             {})\n{}",
            got,
            held.token(),
            tokio::task::block_in_place(|| replication(&g)),
            g.sentinel_logs(60)
        );
    }
    let next = hands_over(held, waiter).await;
    next.release().await.unwrap();

    // New sessions open on the new primary.
    let c = session_with(&backend, ttl).await;
    assert!(tokio::task::block_in_place(|| has_session(&g, new, &c)));
    let g2 = c.mutex("other").unwrap().lock().await.unwrap();
    assert!(g2.token() > next.token());
    g2.release().await.unwrap();
    for s in [a, b, c] {
        s.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_killed_primary_keeps_sessions_and_locks() {
    follows(Failover::Kill).await;
}

/// A primary that hangs (paused, as a suspended host) rather than dies: its heartbeats are
/// never refused, only unanswered. The session was lost: each heartbeat waited out its
/// patience on the hung primary, and its retry went there again, while the sentinels had
/// named another primary seconds before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_paused_primary_keeps_sessions_and_locks() {
    follows(Failover::Pause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_command_keeps_sessions_and_locks() {
    follows(Failover::Command).await;
}

/// Every wrong setting, typed and bounded: a master name no sentinel monitors (permanent), a
/// Redis server named as a sentinel (permanent),
/// no sentinel listening (temporary), every sentinel hung (temporary, after the timeout), a
/// master name only a minority says it does not know, the others silent (temporary); and one
/// hung sentinel of three does not hold up the others' answer, nor one of two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_settings_fail_typed_and_bounded() {
    let Some(g) = group(Failover::Command).await else {
        return;
    };
    let ports = g.sentinel_ports();
    let timeout = Duration::from_secs(2);
    let connect = |url: String| async move {
        let t = Instant::now();
        let r = RedisConfig::new(url).timeout(timeout).connect().await;
        (r, t.elapsed())
    };

    let (r, took) = connect(format!("redis+sentinel://127.0.0.1:{}/nosuch", ports[0])).await;
    match r {
        Err(Error::InvalidConfig(_)) => {}
        other => panic!("unknown master: {other:?}"),
    }
    assert!(took < timeout, "{took:?}");

    // A Redis server named as a sentinel: a setting to fix, said at once (it was a temporary
    // error after the whole timeout).
    let server = g.server(g.primary_index()).addr();
    let (r, took) = connect(format!("redis+sentinel://{server}/{MASTER}")).await;
    match r {
        Err(Error::InvalidConfig(e)) => assert!(e.to_string().contains("not a sentinel"), "{e}"),
        other => panic!("a server named as a sentinel: {other:?}"),
    }
    assert!(took < timeout, "{took:?}");

    // The other way round: a sentinel named as a server (Redis's own words were "Only HELLO
    // messages are accepted by Sentinel instances").
    let sentinel = format!("127.0.0.1:{}", ports[0]);
    let (r, took) = connect(format!("redis://{sentinel}")).await;
    match r {
        Err(Error::InvalidConfig(e)) => assert!(e.to_string().contains("a sentinel"), "{e}"),
        other => panic!("a sentinel named as a server: {other:?}"),
    }
    assert!(took < timeout, "{took:?}");

    // A port nothing listens on.
    let free = fencelock_integration::free_port();
    let (r, took) = connect(format!("redis+sentinel://127.0.0.1:{free}/{MASTER}")).await;
    match r {
        Err(e @ Error::Connect { .. }) => assert!(e.is_temporary(), "{e:?}"),
        other => panic!("no sentinel: {other:?}"),
    }
    assert!(took < timeout + Duration::from_secs(1), "{took:?}");

    // A sentinel that accepts connections and never answers (a paused host).
    let hung = Proxy::start(&format!("127.0.0.1:{}", ports[0])).await;
    hung.set(Mode::BlackHole);
    let (r, took) = connect(format!("redis+sentinel://{}/{MASTER}", hung.addr())).await;
    match r {
        Err(e @ Error::Connect { .. }) => assert!(e.is_temporary(), "{e:?}"),
        other => panic!("hung sentinel: {other:?}"),
    }
    assert!(took < timeout * 2 + Duration::from_secs(1), "{took:?}");

    // Listed first, the hung one does not delay the answer of the two others.
    let url = format!(
        "redis+sentinel://{},127.0.0.1:{},127.0.0.1:{}/{MASTER}",
        hung.addr(),
        ports[1],
        ports[2]
    );
    let (r, took) = connect(url).await;
    assert!(r.is_ok(), "{r:?}");
    assert!(took < timeout, "{took:?}");
    // One hung of two, where a majority needs both: the other's answer is taken a moment after
    // it came (the connect waited out the whole timeout: `fencelock leader` took 5 s).
    let url = format!(
        "redis+sentinel://{},127.0.0.1:{}/{MASTER}",
        hung.addr(),
        ports[1]
    );
    let (r, took) = connect(url).await;
    assert!(r.is_ok(), "{r:?}");
    assert!(took < timeout / 2, "{took:?}");

    // One sentinel of three that knows no such master, the two others silent (a sentinel
    // restarted without its configuration, say): not a setting to fix on a minority's word,
    // but a temporary error (it was InvalidConfig, which ends every retry).
    let hung2 = Proxy::start(&format!("127.0.0.1:{}", ports[1])).await;
    hung2.set(Mode::BlackHole);
    let url = format!(
        "redis+sentinel://127.0.0.1:{},{},{}/nosuch",
        ports[0],
        hung.addr(),
        hung2.addr()
    );
    let (r, took) = connect(url).await;
    match r {
        Err(e @ Error::Connect { .. }) => assert!(e.is_temporary(), "{e:?}"),
        other => panic!("a minority knows no such master: {other:?}"),
    }
    assert!(took < timeout * 2 + Duration::from_secs(1), "{took:?}");

    // TLS settings against plaintext sentinels: a setting to fix, said without waiting out the
    // timeout (the first sentinel was probed only once every one had timed out).
    let pki = fencelock_integration::pki::TestPki::generate();
    let start = Instant::now();
    let e = RedisConfig::new(format!(
        "rediss+sentinel://127.0.0.1:{},127.0.0.1:{}/{MASTER}",
        ports[0], ports[1]
    ))
    .tls(fencelock_redis::TlsConfig::from_ca_file(pki.ca()).unwrap())
    .timeout(Duration::from_secs(20))
    .connect()
    .await
    .unwrap_err();
    assert!(!e.is_temporary(), "{e:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );

    // The password never shows, and TLS settings go with rediss+sentinel only.
    let e = RedisConfig::new(format!(
        "redis+sentinel://app:s3cret@127.0.0.1:{}/",
        ports[0]
    ))
    .connect()
    .await
    .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)));
    assert!(!format!("{e} {e:?}").contains("s3cret"));
}

/// Sentinel as secured deployments run it: sentinels and servers TLS-only (replication and
/// Sentinel's own connections too), an ACL user on the servers. A held lock follows
/// `SENTINEL FAILOVER`; every wrong setting (a foreign CA, plaintext, a wrong password) is a
/// typed, permanent error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_as_an_acl_user() {
    use fencelock_integration::pki::TestPki;
    use fencelock_redis::TlsConfig;
    if !redis::available() {
        return;
    }
    let pki = TestPki::generate();
    let g = tokio::task::block_in_place(|| SentinelGroup::start_tls(&pki, Failover::Command, 1));
    let url = g
        .url()
        .replacen("rediss+sentinel://", "rediss+sentinel://app:app-pw@", 1);
    let tls = || TlsConfig::from_ca_file(pki.ca()).unwrap();
    // Without replica acknowledgements (their path is the plaintext tests'): the session key,
    // written long before the failover, is on every replica.
    let backend = RedisConfig::new(url.clone())
        .tls(tls())
        .connect()
        .await
        .unwrap();
    let a = session(&backend).await;
    let held = a.mutex("job").unwrap().lock().await.unwrap();
    let old = tokio::task::block_in_place(|| g.primary_index());
    tokio::task::block_in_place(|| {
        g.command_failover();
        g.wait_failed_over(old);
    });
    let new = tokio::task::block_in_place(|| g.primary_index());
    let moved = tokio::time::timeout(WITHIN, async {
        loop {
            assert!(!matches!(a.state(), SessionState::Lost(_)), "lost");
            if a.state() == SessionState::Live {
                // A new session lands on the new primary once the backend moved (until then,
                // opening one may fail with a temporary error: the failover is under way).
                let opened = Session::builder(backend.clone())
                    .namespace("/sentinel")
                    .ttl(TTL)
                    .start()
                    .await;
                match opened {
                    Ok(c) => {
                        let there = tokio::task::block_in_place(|| has_session(&g, new, &c));
                        let _ = c.close().await;
                        if there {
                            return;
                        }
                    }
                    Err(e) => assert!(e.is_temporary(), "{e:?}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(moved.is_ok(), "the backend never moved to the new primary");
    let token = held.token();
    held.release().await.unwrap();
    let next = a.mutex("job").unwrap().lock().await.unwrap();
    assert!(next.token() > token);
    next.release().await.unwrap();
    a.close().await.unwrap();

    let timeout = Duration::from_secs(2);
    let fails = |config: RedisConfig| async move {
        let t = Instant::now();
        let e = config.timeout(timeout).connect().await.unwrap_err();
        assert!(t.elapsed() < timeout * 2, "{:?}: {e:?}", t.elapsed());
        e
    };
    // A CA that did not sign the sentinels' certificates.
    let other = TestPki::generate();
    let foreign = TlsConfig::from_ca_file(other.ca()).unwrap();
    let e = fails(RedisConfig::new(url.clone()).tls(foreign)).await;
    assert!(!e.is_temporary(), "{e:?}");
    // Plaintext to TLS sentinels.
    let plain = url.replacen("rediss+", "redis+", 1);
    let e = fails(RedisConfig::new(plain)).await;
    assert!(!e.is_temporary(), "{e:?}");
    // A wrong password: refused by the primary, never shown.
    let wrong = url.replacen("app-pw", "not-the-pw", 1);
    let e = fails(RedisConfig::new(wrong).tls(tls())).await;
    assert!(matches!(e, Error::Unauthenticated { .. }), "{e:?}");
    assert!(!format!("{e} {e:?}").contains("not-the-pw"));
}

/// Sentinels that ask for a password of their own: found with `sentinel_credentials`; without
/// them, or with a wrong one, the connect fails with `Unauthenticated`, saying it is the
/// sentinel's (the password never shown); `sentinel_credentials` without a Sentinel URL is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_a_password() {
    if !redis::available() {
        return;
    }
    let g = tokio::task::block_in_place(|| SentinelGroup::start_protected("sentinel-pw"));
    let backend = RedisConfig::new(g.url())
        .sentinel_credentials("", "sentinel-pw")
        .connect()
        .await
        .unwrap();
    let s = session(&backend).await;
    s.mutex("m")
        .unwrap()
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    s.close().await.unwrap();
    for config in [
        RedisConfig::new(g.url()),
        RedisConfig::new(g.url()).sentinel_credentials("", "not-the-pw"),
    ] {
        let e = config
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unauthenticated { .. }), "{e:?}");
        assert!(!format!("{e} {e:?}").contains("not-the-pw"));
        // Which password: the sentinel's, not the servers'.
        let why = std::error::Error::source(&e).map(ToString::to_string);
        assert!(
            why.as_deref().unwrap_or_default().contains("sentinel"),
            "{e:?}"
        );
    }
    let e = RedisConfig::new(g.server(0).url())
        .sentinel_credentials("", "x")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e:?}");
}

/// Without `wait_for_replicas`, `SENTINEL FAILOVER` leaves the old primary taking writes until
/// the sentinels reconfigure it, seconds later. A session that heartbeats seldom (TTL 60 s)
/// and waits there behind a holder that moved on at once (TTL 4 s) sees the holder's session
/// expire there. Most often it is not granted: a grant that the expiry of the entry ahead
/// decides (at its deadline, or by a message from whichever script dropped it) asks the
/// sentinels first, and goes on on the new primary, behind the holder (5 parallel runs of
/// this file: no grant there; 2 of 5 with the check only at a wait's deadline). When
/// the sentinels' answer does not show the move in time (a loaded machine: the answers in
/// within a quarter of a second decide), the grant made there ends within seconds of the
/// session's move (`Superseded`), while the holder still holds. Before, two `fencelock`
/// commands ran side by side for 45 s, and the next grant's token went backwards (black-box
/// round 22). After the release, the waiter is granted with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_demoted_primary_grants_nothing_whose_holder_moved_on() {
    let Some(g) = group(Failover::Command).await else {
        return;
    };
    // One backend each, as two processes: each follows the primary on its own.
    let connect = || async { RedisBackend::connect(g.url()).await.unwrap() };
    let (holder_backend, waiter_backend) = (connect().await, connect().await);
    let a = session_with(&holder_backend, Duration::from_secs(4)).await;
    let b = session_with(&waiter_backend, Duration::from_secs(60)).await;
    let held = a.mutex("stale").unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let m = b.mutex("stale").unwrap();
        async move { m.lock().await }
    });
    on_every_server(&g, "/sentinel/stale", 2).await;
    let old = tokio::task::block_in_place(|| g.primary_index());
    tokio::task::block_in_place(|| {
        g.command_failover();
        g.wait_failed_over(old);
    });
    // The holder's key expires on the old primary 4 s after its move at the latest, and the
    // sentinels reconfigure the old primary about 10 s after the failover.
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        while !waiter.is_finished() && held.is_held() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let waiter = if waiter.is_finished() && held.is_held() {
        let stale = waiter.await.unwrap().unwrap();
        println!("granted on the old primary: token {:?}", stale.token());
        let why = tokio::time::timeout(Duration::from_secs(15), stale.lost())
            .await
            .expect("granted beside the holder, and never found lost");
        assert_eq!(why, fencelock::LostReason::Superseded);
        assert!(
            held.is_held(),
            "the holder's lock was lost: {:?}",
            a.state()
        );
        // Waits again, behind the holder.
        tokio::spawn({
            let m = b.mutex("stale").unwrap();
            async move { m.lock().await }
        })
    } else {
        assert!(
            waited.is_err(),
            "the holder's lock was lost: {:?}",
            a.state()
        );
        waiter
    };
    let next = hands_over(held, waiter).await;
    next.release().await.unwrap();
    for s in [a, b] {
        s.close().await.unwrap();
    }
}

/// Waits (bounded) until the queue `path` has `n` members on every server.
async fn on_every_server(g: &SentinelGroup, path: &str, n: usize) {
    let key = format!("fencelock:q:{path}");
    tokio::time::timeout(WITHIN, async {
        while !(0..3).all(|i| {
            tokio::task::block_in_place(|| {
                g.server(i).cli(&["ZCARD", &key]).unwrap_or_default().trim() == n.to_string()
            })
        }) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the entries never reached every replica");
}

/// A grant its session's new primary does not hold ends: after a failover (here, to a
/// replica given a live entry ahead of the holder's, written there alone, as a demoted
/// primary's writes are lost) the holder that awaits `lost()` reads what is ahead on the new
/// primary, and its `lost()` fires with `Superseded` (the `fencelock` command exits 76).
/// Without the check the holder held on beside the entry ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_grant_the_new_primary_does_not_hold_is_lost() {
    grant_lost_in_failover(Diverged::EntryAhead, Asked::Lost).await;
}

/// The same when the new primary lacks the holder's entry (a replica that had not received
/// it): `Superseded` too, not `EntryDeleted` (black-box round 34 read "our entry was deleted by
/// someone else" after a failover to a lagging replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_grant_the_new_primary_lacks_is_superseded() {
    grant_lost_in_failover(Diverged::OwnEntryMissing, Asked::Lost).await;
}

/// A release after a failover to a replica that had not received the grant (its entry, and
/// the change of the session's version that made it), before anything looked at the grant,
/// says `Superseded` too (it said `EntryDeleted`: its delete found nothing, as after
/// someone's delete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_release_the_new_primary_lacks_says_superseded() {
    grant_lost_in_failover(Diverged::OwnEntryLagging, Asked::Release).await;
}

/// A superseded guard released after its session took the lock again: the new grant survives
/// the session's next reconciliation (its release counted the name out a second time, and the
/// reconciliation deleted the held entry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_superseded_guard_released_late_leaves_the_next_grant_alone() {
    grant_lost_in_failover(Diverged::OwnEntryMissing, Asked::LostThenAgain).await;
}

/// What tells the holder of the loss first.
#[derive(Clone, Copy, PartialEq)]
enum Asked {
    /// Its `lost()`, then its release.
    Lost,
    /// Its release alone (nothing awaits `lost()`, so nothing looked before it).
    Release,
    /// Its `lost()`, then the lock taken again by the session, then the release.
    LostThenAgain,
}

/// How the replica a failover goes to differs from the primary: changed there alone, as a
/// demoted primary's writes are lost.
#[derive(Clone, Copy, PartialEq)]
enum Diverged {
    /// It has a live entry ahead of the holder's.
    EntryAhead,
    /// It lacks the holder's entry.
    OwnEntryMissing,
    /// It lacks the holder's entry and the session's version that made it, as a replica that
    /// lagged does.
    OwnEntryLagging,
}

async fn grant_lost_in_failover(diverged: Diverged, asked: Asked) {
    let Some(g) = group(Failover::Command).await else {
        return;
    };
    let backend = RedisBackend::connect(g.url()).await.unwrap();
    let s = session_with(&backend, Duration::from_secs(30)).await;
    // A first grant: the holder's token is above 1, the one given to the entry ahead.
    s.mutex("first")
        .unwrap()
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = s.mutex("moved").unwrap().lock().await.unwrap();
    assert!(held.token().get() > 1);
    let queue = "fencelock:q:/sentinel/moved";
    on_every_server(&g, "/sentinel/moved", 1).await;
    let old = tokio::task::block_in_place(|| g.primary_index());
    let (next, other) = ((old + 1) % 3, (old + 2) % 3);
    tokio::task::block_in_place(|| {
        let r = g.server(next);
        let run = |args: &[&str]| assert_ne!(r.cli(args).unwrap().trim(), "", "{args:?}");
        run(&["CONFIG", "SET", "replica-read-only", "no"]);
        match diverged {
            Diverged::EntryAhead => {
                let ahead = "/sentinel/moved/0000000000000000000000000000000f";
                let sid = "0000000000000000000000000000000f";
                assert_eq!(r.write_entry("/sentinel/moved", sid, 120_000), ahead);
            }
            Diverged::OwnEntryMissing | Diverged::OwnEntryLagging => {
                let ours = r.cli(&["ZRANGE", queue, "0", "-1"]).unwrap();
                let ours = ours.trim();
                assert!(ours.starts_with("/sentinel/moved/"), "{ours:?}");
                run(&["ZREM", queue, ours]);
                run(&["DEL", &format!("fencelock:e:{ours}")]);
                if diverged == Diverged::OwnEntryLagging {
                    let sid = ours.rsplit_once('/').unwrap().1;
                    let skey = format!("fencelock:s:{sid}");
                    run(&["HDEL", &skey, ours]);
                    run(&["HINCRBY", &skey, "v", "-1"]);
                }
            }
        }
        // The failover goes to that replica.
        run(&["CONFIG", "SET", "replica-read-only", "yes"]);
        g.server(other)
            .cli(&["CONFIG", "SET", "replica-priority", "0"])
            .unwrap();
        g.command_failover();
        g.wait_failed_over(old);
        assert_eq!(g.primary_index(), next);
    });
    if asked == Asked::Release {
        // Until the sentinels convert the demoted primary (seconds later), it takes writes,
        // the release's among them, and nothing has the client look for a new primary (a
        // release asks no sentinel). Converted, it refuses the release, which the new primary
        // then gets.
        tokio::task::block_in_place(|| {
            let start = std::time::Instant::now();
            while !g
                .server(old)
                .cli(&["ROLE"])
                .unwrap_or_default()
                .starts_with("slave")
            {
                assert!(start.elapsed() < WITHIN, "server {old} was never converted");
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let released = tokio::time::timeout(WITHIN, held.release())
            .await
            .expect("the release ended");
        assert!(
            matches!(
                released,
                Err(Error::NotHeld(fencelock::LostReason::Superseded))
            ),
            "{released:?}"
        );
        let left = tokio::task::block_in_place(|| g.server(next).cli(&["ZCARD", queue]).unwrap());
        assert_eq!(left.trim(), "0", "an entry is left queued");
        assert_eq!(s.state(), SessionState::Live);
        s.close().await.unwrap();
        return;
    }
    let why = tokio::time::timeout(WITHIN, held.lost())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the grant was never found lost (the session {:?}; {})",
                s.state(),
                tokio::task::block_in_place(|| replication(&g))
            )
        });
    assert_eq!(why, fencelock::LostReason::Superseded);
    assert!(!held.is_held());
    // Its entry removed before `lost()` said so: the session's next acquisition of the lock
    // (an entry of the same name) does not find it again.
    let left = tokio::task::block_in_place(|| g.server(next).cli(&["ZCARD", queue]).unwrap());
    let others = usize::from(diverged == Diverged::EntryAhead);
    assert_eq!(
        left.trim(),
        others.to_string(),
        "the superseded entry is still queued"
    );
    if asked == Asked::LostThenAgain {
        // The session locks it again (an entry of the same name) before the superseded guard
        // is released: that release must not count the name out a second time (it removed
        // nothing, the `lost()` had), or a reconciliation deletes the new entry, held, as a
        // released one come back.
        let again = s.mutex("moved").unwrap().lock().await.unwrap();
        assert!(matches!(
            held.release().await,
            Err(Error::NotHeld(fencelock::LostReason::Superseded))
        ));
        let ours = again.key().to_string();
        let sid = ours.rsplit_once('/').unwrap().1;
        let skey = format!("fencelock:s:{sid}");
        // The server made to lose changes of the session: its next heartbeat reconciles.
        let lowered: i64 = tokio::task::block_in_place(|| {
            let r = g.server(next);
            r.cli(&["HINCRBY", &skey, "v", "-1"])
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        });
        tokio::task::block_in_place(|| {
            let start = std::time::Instant::now();
            loop {
                let v = g.server(next).cli(&["HGET", &skey, "v"]).unwrap();
                if v.trim().parse::<i64>().is_ok_and(|v| v > lowered) {
                    break;
                }
                assert!(
                    start.elapsed() < WITHIN,
                    "never reconciled: {ours} {skey} {lowered} {v}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let entry = tokio::task::block_in_place(|| {
            g.server(next)
                .cli(&["EXISTS", &format!("fencelock:e:{ours}")])
                .unwrap()
        });
        assert_eq!(entry.trim(), "1", "the held entry was deleted");
        assert!(again.is_held());
        again.release().await.unwrap();
    } else {
        assert!(matches!(
            held.release().await,
            Err(Error::NotHeld(fencelock::LostReason::Superseded))
        ));
    }
    assert_eq!(s.state(), SessionState::Live);
    s.close().await.unwrap();
}

/// How many commands the sentinels of `g` have processed (a sentinel's `INFO` has no
/// `commandstats`; this counts their pings of each other too, and `redis-cli`'s `INFO`).
fn sentinel_commands(g: &SentinelGroup) -> u64 {
    (0..3)
        .map(|i| {
            g.sentinel_cli(i, &["INFO", "stats"])
                .lines()
                .find_map(|l| l.strip_prefix("total_commands_processed:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// A grant that an entry's expiry decides asks the sentinels first (see the test above), and
/// the grants a crashed process's expiry decides share a question started after the drops:
/// here 30 waiters
/// behind the entries of a session whose key expires (written by hand, as a killed process
/// leaves them) are all granted, and the sentinels answer far fewer than one question per
/// grant (each question is two commands to each of the three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_expired_entries_ask_the_sentinels_once_for_all() {
    const LOCKS: usize = 30;
    let Some(g) = group(Failover::Command).await else {
        return;
    };
    let backend = RedisBackend::connect(g.url()).await.unwrap();
    let s = session_with(&backend, Duration::from_secs(30)).await;
    // The token counter past 1, the token of the entries written by hand.
    let first = s.mutex("first").unwrap().lock().await.unwrap();
    first.release().await.unwrap();
    let sid = "0000000000000000000000000000000e";
    tokio::task::block_in_place(|| {
        let p = g.server(g.primary_index());
        for i in 0..LOCKS {
            p.write_entry(&format!("/sentinel/crashed{i}"), sid, 3000);
        }
    });
    // The sentinels' own traffic (their pings of each other) over as long as the waits take is
    // measured after them, and taken off.
    let started = Instant::now();
    let before = tokio::task::block_in_place(|| sentinel_commands(&g));
    let waits: Vec<_> = (0..LOCKS)
        .map(|i| {
            let m = s.mutex(&format!("crashed{i}")).unwrap();
            tokio::spawn(async move { m.lock().await })
        })
        .collect();
    let mut granted = Vec::new();
    for w in waits {
        let guard = tokio::time::timeout(WITHIN, w)
            .await
            .expect("a waiter behind an expired entry was never granted")
            .unwrap()
            .unwrap();
        assert!(guard.token().get() > 1);
        granted.push(guard);
    }
    let asked = tokio::task::block_in_place(|| sentinel_commands(&g)) - before;
    let took = started.elapsed();
    let before = tokio::task::block_in_place(|| sentinel_commands(&g));
    tokio::time::sleep(took).await;
    let idle = tokio::task::block_in_place(|| sentinel_commands(&g)) - before;
    let asked = asked.saturating_sub(idle);
    println!("{asked} sentinel commands for {LOCKS} grants that expiries decided ({idle} idle)");
    // A question is two commands to each of the three sentinels; one per grant would be 180
    // (210 counted so). (No lower bound: the sentinels' own traffic varies by a few commands.)
    assert!(
        asked < 60,
        "{asked} sentinel commands for {LOCKS} grants that expiries decided ({idle} idle)"
    );
    for guard in granted {
        guard.release().await.unwrap();
    }
    s.close().await.unwrap();
}
