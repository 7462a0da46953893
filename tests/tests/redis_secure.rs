//! Redis over TLS (a TLS-only `redis-server`, with and without required client certificates)
//! and with ACL users, started by the harness with certificates generated at test time: what
//! works, and what each wrong setting gives — a typed, permanent error within a bounded time,
//! never a hang or a retry loop, and never the password in a message. Run with `--nocapture`
//! to see the error table.

use std::time::Duration;

use fencelock::{Error, Session};
use fencelock_integration::errors::{chain, expect_permanent};
use fencelock_integration::pki::TestPki;
use fencelock_integration::servers::redis::{self as harness, Durability, RedisServer};
use fencelock_integration::HungServer;
use fencelock_redis::{RedisBackend, RedisConfig, Redlock, RedlockTiming, TlsConfig};

/// How long a wrong setting may take to be reported.
const BOUND: Duration = Duration::from_secs(5);

async fn connect(config: RedisConfig) -> fencelock::Result<RedisBackend> {
    config.timeout(Duration::from_secs(3)).connect().await
}

/// One lock taken and released through `backend`, with its fencing token.
/// Then a second session waits behind a first holder, and is woken (Redis pub/sub, on a
/// connection of its own: over TLS too) when it releases, with a larger token.
async fn lock_once(backend: RedisBackend) {
    let s = Session::builder(backend.clone())
        .namespace("tls")
        .start()
        .await
        .unwrap();
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    assert!(g.token().get() >= 1);
    let waiter = Session::builder(backend)
        .namespace("tls")
        .start()
        .await
        .unwrap();
    let behind = waiter.mutex("m").unwrap();
    let waiting = tokio::spawn(async move { behind.lock().await.map(|g| g.token()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "granted while held");
    let first = g.token();
    g.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter is woken by the release")
        .unwrap()
        .unwrap();
    assert!(second > first, "{second:?} after {first:?}");
    waiter.close().await.unwrap();
    s.close().await.unwrap();
}

/// With the CA and a client certificate, `rediss://` works, as an ACL user too, and a bare
/// `host:port` with TLS settings means TLS; every wrong TLS setting fails at once with a
/// permanent, typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls() {
    if !harness::available() {
        return;
    }
    let pki = TestPki::generate();
    let server = tokio::task::block_in_place(|| RedisServer::start_tls(&pki, true));
    let addr = server.addr();
    let rediss = format!("rediss://{addr}");

    let ok = connect(RedisConfig::new(&rediss).tls(pki.client_tls()))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    lock_once(ok).await;
    let bare = connect(RedisConfig::new(&addr).tls(pki.client_tls()))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    lock_once(bare).await;
    let user =
        connect(RedisConfig::new(format!("rediss://app:app-pw@{addr}")).tls(pki.client_tls()))
            .await
            .unwrap_or_else(|e| panic!("{}", chain(&e)));
    lock_once(user).await;
    // Redlock over TLS servers, from configs. The first request of a connection carries its
    // TLS handshake: more than the default 50 ms in a debug build on a loaded machine.
    let mut timing = RedlockTiming::default();
    timing.request_timeout = Duration::from_secs(2);
    let redlock =
        Redlock::with_configs([RedisConfig::new(&rediss).tls(pki.client_tls())], timing).unwrap();
    let guard = redlock
        .try_lock("tls", Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)))
        .expect("a free lock is granted");
    assert!(guard.token().get() >= 1);
    assert!(guard.release().await.unwrap());

    println!("| situation | error | kind | took |\n|---|---|---|---|");
    let ca_only = TlsConfig::from_ca_file(pki.ca()).unwrap();
    let rogue = pki.rogue_client();
    let rogue_client = TlsConfig::from_ca_file(pki.ca())
        .unwrap()
        .with_identity_files(rogue.cert, rogue.key)
        .unwrap();
    let client = pki.client();
    let untrusting = TlsConfig::from_ca_file(pki.rogue_ca())
        .unwrap()
        .with_identity_files(client.cert, client.key)
        .unwrap();
    let cases: Vec<(&str, &str, RedisConfig)> = vec![
        (
            "plaintext redis:// to a TLS-only server",
            "InvalidConfig",
            RedisConfig::new(format!("redis://{addr}")),
        ),
        (
            "no client certificate where one is required",
            "Unauthenticated",
            RedisConfig::new(&rediss).tls(ca_only.clone()),
        ),
        (
            "a client certificate of another CA",
            "Unauthenticated",
            RedisConfig::new(&rediss).tls(rogue_client),
        ),
        (
            "the server's certificate signed by an untrusted CA",
            "Connect",
            RedisConfig::new(&rediss).tls(untrusting),
        ),
        (
            "TLS settings with a redis:// URL",
            "InvalidConfig",
            RedisConfig::new(format!("redis://{addr}")).tls(pki.client_tls()),
        ),
        (
            "a server name override",
            "InvalidConfig",
            RedisConfig::new(&rediss).tls(pki.client_tls().with_server_name("other")),
        ),
    ];
    for (situation, expected, config) in cases {
        expect_permanent(situation, expected, BOUND, connect(config)).await;
    }
    drop(server);
}

/// Without required client certificates, the CA alone is enough; a wrong ACL password over
/// TLS is `Unauthenticated`, and neither the error nor `Debug` shows it; `rediss://` to a
/// plaintext server is a wrong setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_tls_and_acl_users() {
    if !harness::available() {
        return;
    }
    let pki = TestPki::generate();
    let server = tokio::task::block_in_place(|| RedisServer::start_tls(&pki, false));
    let addr = server.addr();
    let ca_only = TlsConfig::from_ca_file(pki.ca()).unwrap();

    let ok = connect(RedisConfig::new(format!("rediss://app:app-pw@{addr}")).tls(ca_only.clone()))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    lock_once(ok).await;

    let wrong = RedisConfig::new(format!("rediss://app:not-the-pw@{addr}")).tls(ca_only.clone());
    assert!(!format!("{wrong:?}").contains("not-the-pw"), "{wrong:?}");
    let e = expect_permanent(
        "a wrong ACL password over TLS",
        "Unauthenticated",
        BOUND,
        connect(wrong),
    )
    .await;
    assert!(!chain(&e).contains("not-the-pw"), "{}", chain(&e));

    // The system's trust store (a bare rediss:// URL) and a server of a private CA: a wrong
    // setting, not an unreachable server (it was a temporary connect error, retried for ever).
    expect_permanent(
        "rediss:// with the system's trust store, a server of a private CA",
        "Connect",
        BOUND,
        connect(RedisConfig::new(format!("rediss://{addr}"))),
    )
    .await;

    let plain = tokio::task::spawn_blocking(|| RedisServer::start(Durability::None))
        .await
        .unwrap();
    let e = expect_permanent(
        "rediss:// to a plaintext server",
        "InvalidConfig",
        BOUND,
        connect(RedisConfig::new(format!("rediss://{}", plain.addr())).tls(ca_only.clone())),
    )
    .await;
    assert!(!e.is_temporary());
    assert!(matches!(e, Error::InvalidConfig(_)));
    // With a timeout shorter than the TLS handshake's probe (2 s): the plaintext answer to a
    // PING, asked beside the handshake, tells at once (it was a temporary "no answer").
    expect_permanent(
        "rediss:// to a plaintext server, a 1 s timeout",
        "InvalidConfig",
        Duration::from_millis(1500),
        RedisConfig::new(format!("rediss://{}", plain.addr()))
            .tls(ca_only)
            .timeout(Duration::from_secs(1))
            .connect(),
    )
    .await;
    // The same with the system's trust store (a bare rediss:// URL, no CA to probe the
    // handshake with): the server's plaintext answer to a PING tells (it was a temporary
    // "no answer" once the timeout passed).
    let e = expect_permanent(
        "rediss:// without a CA to a plaintext server",
        "InvalidConfig",
        BOUND,
        connect(RedisConfig::new(format!("rediss://{}", plain.addr()))),
    )
    .await;
    assert!(chain(&e).contains("plaintext"), "{}", chain(&e));
}

/// A server that accepts connections and never answers (a hung process): the connect fails
/// with a temporary `Error::Connect` once its timeout has passed, at most half a second later
/// (while the probe for a wrong setting, which runs beside the connect, finishes), with TLS or
/// without: never a hang, and never a configuration error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_is_a_temporary_connect_error_within_the_timeout() {
    let hung = HungServer::start().await;
    let addr = hung.addr();
    let pki = TestPki::generate();
    let timeout = Duration::from_secs(1);
    for config in [
        RedisConfig::new(format!("redis://{addr}")),
        RedisConfig::new(format!("rediss://{addr}")).tls(pki.client_tls()),
        RedisConfig::new(format!("rediss://{addr}")),
    ] {
        let config = config.timeout(timeout);
        let what = format!("{config:?}");
        let started = std::time::Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(10), config.connect())
            .await
            .unwrap_or_else(|_| panic!("{what}: the connect hung"));
        let took = started.elapsed();
        assert!(
            matches!(
                r,
                Err(Error::Connect {
                    temporary: true,
                    ..
                })
            ),
            "{what}: {r:?}"
        );
        assert!(
            took < timeout + Duration::from_millis(800),
            "{what}: took {took:?}"
        );
    }
    drop(hung);
}
