//! ZooKeeper with TLS (the Netty `secureClientPort`, client certificates required) and with
//! SASL DIGEST-MD5 required, started by the harness with certificates generated at test time:
//! what works, and what each wrong setting gives — a typed, permanent error within a bounded
//! time, never a hang or a retry loop. Run with `--nocapture` to see the error table.

use std::sync::Arc;
use std::time::Duration;

use fencelock::{Error, Session};
use fencelock_integration::errors::{chain, expect_permanent};
use fencelock_integration::pki::TestPki;
use fencelock_integration::servers::zookeeper::{
    self as harness, ZkEnsemble, ZkOptions, ZkServerTls,
};
use fencelock_integration::servers::{available, Cluster};
use fencelock_integration::target::Kind;
use fencelock_integration::HungServer;
use fencelock_zookeeper::{AclMode, TlsConfig, ZooKeeperBackend, ZooKeeperConfig};

/// How long a wrong setting may take to be reported.
const BOUND: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(4);

fn builder(connect: &str) -> ZooKeeperConfig {
    ZooKeeperBackend::builder(connect).connect_timeout(Duration::from_secs(3))
}

/// Connects and starts a session (what a user does; credentials are checked at the start).
async fn start(config: ZooKeeperConfig) -> fencelock::Result<Session> {
    let backend = config.connect().await?;
    Session::builder(backend).ttl(TTL).start().await
}

async fn ensemble(options: ZkOptions) -> Arc<ZkEnsemble> {
    Arc::new(
        tokio::task::spawn_blocking(move || ZkEnsemble::start_with(1, options))
            .await
            .unwrap(),
    )
}

/// A server that takes the connection and never completes the TLS handshake (hung, stopped)
/// is unreachable for now, a temporary error within the connect timeout: not a port that does
/// not speak TLS (a configuration error, which ends every retry loop, the CLI's with 78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_with_tls_is_a_temporary_error() {
    let hung = HungServer::start().await;
    let pki = TestPki::generate();
    let start = std::time::Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        builder(&hung.addr()).tls(pki.client_tls()).connect(),
    )
    .await
    .expect("the connect hung");
    assert!(
        matches!(&r, Err(e @ Error::Connect { .. }) if e.is_temporary()),
        "{}",
        r.err().map(|e| chain(&e)).unwrap_or_default()
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

/// With the CA and a client certificate, a TLS-only server works; every wrong TLS setting
/// fails with a permanent, typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls() {
    if !available(Kind::ZooKeeper) {
        return;
    }
    let pki = TestPki::generate();
    let zk = ensemble(ZkOptions {
        tls: Some(ZkServerTls {
            keystore: pki.server_keystore(),
            ca: pki.ca(),
            client_auth: true,
        }),
        ..Default::default()
    })
    .await;
    let ep = zk.endpoint(0);
    let s = start(builder(&ep).tls(pki.client_tls()))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    assert!(g.token().get() > 0);
    g.release().await.unwrap();
    s.close().await.unwrap();
    // The scheme may be spelled out.
    start(builder(&format!("tcp+tls://{ep}")).tls(pki.client_tls()))
        .await
        .unwrap()
        .close()
        .await
        .unwrap();

    println!(
        "\n| situation (ZooKeeper) | error | temporary? | time to error |\n|---|---|---|---:|"
    );
    let client = pki.client();
    let rogue_ca = TlsConfig::from_ca_file(pki.rogue_ca())
        .unwrap()
        .with_identity_files(&client.cert, &client.key)
        .unwrap();
    expect_permanent(
        "server certificate from an unknown CA",
        "Connect",
        BOUND,
        start(builder(&ep).tls(rogue_ca)),
    )
    .await;
    let rogue = pki.rogue_client();
    let wrong_client = TlsConfig::from_ca_file(pki.ca())
        .unwrap()
        .with_identity_files(rogue.cert, rogue.key)
        .unwrap();
    expect_permanent(
        "client certificate from another CA",
        "Unauthenticated",
        BOUND,
        start(builder(&ep).tls(wrong_client)),
    )
    .await;
    expect_permanent(
        "no client certificate (mutual TLS required)",
        "Unauthenticated",
        BOUND,
        start(builder(&ep).tls(TlsConfig::from_ca_file(pki.ca()).unwrap())),
    )
    .await;
    expect_permanent(
        "plaintext client at a TLS port",
        "InvalidConfig",
        BOUND,
        start(builder(&ep)),
    )
    .await;
    expect_permanent(
        "tcp+tls:// server without TLS settings",
        "InvalidConfig",
        Duration::from_millis(100),
        start(builder(&format!("tcp+tls://{ep}"))),
    )
    .await;
    if let Some(plain) = harness::shared() {
        expect_permanent(
            "TLS client at a plaintext port",
            "InvalidConfig",
            BOUND,
            start(builder(&plain.connect_string()).tls(pki.client_tls())),
        )
        .await;
    }
}

/// With SASL DIGEST-MD5 required: the right user works; a wrong password, an unknown user and a
/// client without SASL are refused at once; SASL against a server without it is refused too
/// (it would connect, unauthenticated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_digest_md5() {
    if !available(Kind::ZooKeeper) {
        return;
    }
    let zk = ensemble(ZkOptions {
        sasl_users: vec![("app".into(), "app-pw".into())],
        ..Default::default()
    })
    .await;
    let ep = zk.endpoint(0);
    let s = start(builder(&ep).sasl_digest_md5("app", "app-pw"))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    s.close().await.unwrap();

    println!(
        "\n| situation (ZooKeeper SASL) | error | temporary? | time to error |\n|---|---|---|---:|"
    );
    expect_permanent(
        "wrong password",
        "Unauthenticated",
        BOUND,
        start(builder(&ep).sasl_digest_md5("app", "wrong")),
    )
    .await;
    expect_permanent(
        "unknown user",
        "Unauthenticated",
        BOUND,
        start(builder(&ep).sasl_digest_md5("nobody", "pw")),
    )
    .await;
    expect_permanent(
        "no SASL, SASL required",
        "Unauthenticated",
        BOUND,
        start(builder(&ep)),
    )
    .await;
    if let Some(plain) = harness::shared() {
        expect_permanent(
            "SASL against a server without SASL",
            "Unauthenticated",
            BOUND,
            start(builder(&plain.connect_string()).sasl_digest_md5("app", "app-pw")),
        )
        .await;
    }
}

/// A digest identity without permission on a namespace created by another: `PermissionDenied`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_without_permission() {
    let Some(plain) = harness::shared() else {
        return;
    };
    let ns = fencelock::conformance::unique_namespace("zk_denied").replace('/', "-");
    let owner = builder(&plain.connect_string())
        .digest_auth("alice", "a-pw")
        .acl(AclMode::CreatorDelete)
        .connect()
        .await
        .unwrap();
    let s = Session::builder(owner)
        .namespace(&ns)
        .ttl(TTL)
        .start()
        .await
        .unwrap();
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    let other = Session::builder(
        ZooKeeperBackend::builder(plain.connect_string())
            .digest_auth("bob", "b-pw")
            .connect()
            .await
            .unwrap(),
    )
    .namespace(&ns)
    .ttl(TTL)
    .start()
    .await
    .unwrap();
    println!(
        "\n| situation (ZooKeeper ACL) | error | temporary? | time to error |\n|---|---|---|---:|"
    );
    let e = expect_permanent(
        "another identity queues on a creator-only lock",
        "PermissionDenied",
        BOUND,
        other.mutex("m").unwrap().lock(),
    )
    .await;
    assert!(matches!(e, Error::PermissionDenied { .. }));
    g.release().await.unwrap();
    s.close().await.unwrap();
    other.close().await.unwrap();
}
