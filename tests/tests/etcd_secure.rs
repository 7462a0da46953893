//! etcd with TLS (mutual TLS required) and with authentication, started by the harness with
//! certificates generated at test time: what works, and what each wrong setting gives — a
//! typed, permanent error within a bounded time, never a hang or a retry loop. Run with
//! `--nocapture` to see the error table.

use std::sync::Arc;
use std::time::Duration;

use fencelock::{Error, Session};
use fencelock_etcd::{EtcdBackend, EtcdConfig, TlsConfig};
use fencelock_integration::errors::{chain, expect_permanent};
use fencelock_integration::notifications::etcd_counter;
use fencelock_integration::pki::TestPki;
use fencelock_integration::servers::etcd::{self as harness, EtcdCluster, EtcdOptions, ServerTls};
use fencelock_integration::servers::{available, Cluster};
use fencelock_integration::target::Kind;
use fencelock_integration::HungServer;
use futures::StreamExt;

/// How long a wrong setting may take to be reported.
const BOUND: Duration = Duration::from_secs(5);

async fn tls_cluster(pki: &TestPki) -> Arc<EtcdCluster> {
    let server = pki.server();
    let options = EtcdOptions {
        tls: Some(ServerTls {
            cert: server.cert,
            key: server.key,
            client_ca: Some(pki.ca()),
        }),
        ..Default::default()
    };
    Arc::new(
        tokio::task::spawn_blocking(move || EtcdCluster::start_with(1, options))
            .await
            .unwrap(),
    )
}

async fn connect(config: EtcdConfig) -> fencelock::Result<EtcdBackend> {
    EtcdBackend::connect_with(config.connect_timeout(Duration::from_secs(3))).await
}

/// With the CA and a client certificate, `https://` endpoints work; every wrong TLS setting
/// fails at once with a permanent, typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls() {
    if !available(Kind::Etcd) {
        return;
    }
    let pki = TestPki::generate();
    let cluster = tls_cluster(&pki).await;
    let ep = cluster.endpoint(0);
    let https = format!("https://{ep}");

    let backend = connect(EtcdConfig::new([&https]).tls(pki.client_tls()))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let s = Session::builder(backend)
        .namespace("tls")
        .start()
        .await
        .unwrap();
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    s.close().await.unwrap();
    // A bare host:port uses TLS when it is configured.
    connect(EtcdConfig::new([&ep]).tls(pki.client_tls()))
        .await
        .unwrap();

    println!("\n| situation (etcd) | error | temporary? | time to error |\n|---|---|---|---:|");
    let rogue_ca = TlsConfig::from_ca_file(pki.rogue_ca())
        .unwrap()
        .with_identity_files(pki.client().cert, pki.client().key)
        .unwrap();
    expect_permanent(
        "server certificate from an unknown CA",
        "Connect",
        BOUND,
        connect(EtcdConfig::new([&https]).tls(rogue_ca)),
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
        connect(EtcdConfig::new([&https]).tls(wrong_client)),
    )
    .await;
    expect_permanent(
        "no client certificate (mutual TLS required)",
        "Unauthenticated",
        BOUND,
        connect(EtcdConfig::new([&https]).tls(TlsConfig::from_ca_file(pki.ca()).unwrap())),
    )
    .await;
    expect_permanent(
        "plaintext client at a TLS port",
        "InvalidConfig",
        BOUND,
        connect(EtcdConfig::new([&ep])),
    )
    .await;
    expect_permanent(
        "a TLS server name that is no DNS name",
        "InvalidConfig",
        Duration::from_millis(100),
        connect(EtcdConfig::new([&https]).tls(pki.client_tls().with_server_name("not a name"))),
    )
    .await;
    expect_permanent(
        "https:// endpoint without TLS settings",
        "InvalidConfig",
        Duration::from_millis(100),
        connect(EtcdConfig::new([&https])),
    )
    .await;
    if let Some(plain) = harness::shared() {
        expect_permanent(
            "TLS client at a plaintext port",
            "InvalidConfig",
            BOUND,
            connect(EtcdConfig::new([plain.endpoint(0)]).tls(pki.client_tls())),
        )
        .await;
    }
    expect_permanent(
        "CA file that is not PEM",
        "InvalidConfig",
        Duration::from_millis(100),
        async { TlsConfig::from_ca_pem("not a certificate") },
    )
    .await;
}

/// A member that takes the connection and never completes the TLS handshake (hung, stopped)
/// is unreachable for now, a temporary error within the connect timeout, like a hung
/// plaintext one: not a port that does not speak TLS (a configuration error, which ends every
/// retry loop, the CLI's with 78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_with_tls_is_a_temporary_error() {
    let hung = HungServer::start().await;
    let pki = TestPki::generate();
    for tls in [true, false] {
        let mut config = EtcdConfig::new([hung.addr()]);
        if tls {
            config = config.tls(pki.client_tls());
        }
        let start = std::time::Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(15), connect(config))
            .await
            .expect("the connect hung");
        assert!(
            matches!(&r, Err(e @ Error::Connect { .. }) if e.is_temporary()),
            "TLS {tls}: {}",
            r.err().map(|e| chain(&e)).unwrap_or_default()
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "TLS {tls}: took {:?}",
            start.elapsed()
        );
    }
}

/// With authentication enabled: the right user works in its namespace; a wrong password, a
/// namespace the user's role does not grant, and a user set against a cluster without
/// authentication each give a permanent, typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication() {
    if !available(Kind::Etcd) {
        return;
    }
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .unwrap();
    cluster.enable_auth("granted", "app", "app-pw").await;
    let ep = cluster.endpoint(0);
    let authentications = || {
        etcd_counter(
            &ep,
            "grpc_server_started_total",
            r#"grpc_method="Authenticate""#,
        )
    };
    let before = authentications().await.expect("the server's counter");

    let backend = connect(EtcdConfig::new([&ep]).user("app", "app-pw"))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let s = Session::builder(backend.clone())
        .namespace("granted")
        .start()
        .await
        .unwrap();
    let g = s.mutex("m").unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    s.close().await.unwrap();
    // One authentication for the connect, the session, its heartbeat and its lock: each costs
    // the server a bcrypt check (black-box round 7: 2-3 per process, and 18 processes starting
    // together on a loaded machine lost their sessions).
    let after = authentications().await.expect("the server's counter");
    assert_eq!(
        after - before,
        1.0,
        "authentications by one backend and session"
    );

    println!(
        "\n| situation (etcd auth) | error | temporary? | time to error |\n|---|---|---|---:|"
    );
    expect_permanent(
        "wrong password",
        "Unauthenticated",
        BOUND,
        connect(EtcdConfig::new([&ep]).user("app", "wrong")),
    )
    .await;
    expect_permanent(
        "unknown user",
        "Unauthenticated",
        BOUND,
        connect(EtcdConfig::new([&ep]).user("nobody", "pw")),
    )
    .await;
    expect_permanent(
        "no user, authentication required",
        "Unauthenticated",
        BOUND,
        async {
            let b = connect(EtcdConfig::new([&ep])).await?;
            let s = Session::builder(b).namespace("granted").start().await?;
            s.mutex("m")?.lock().await
        },
    )
    .await;
    // Said as it is, not in etcd's words ("user name is empty", as if one had been given).
    let e = async {
        let b = connect(EtcdConfig::new([&ep])).await?;
        let s = Session::builder(b).namespace("granted").start().await?;
        s.mutex("m")?.lock().await.map(drop)
    }
    .await
    .unwrap_err();
    assert!(chain(&e).contains("no user was given"), "{}", chain(&e));
    // Lease operations need no permission: the session starts; its first lock is refused.
    let outside = Session::builder(backend.clone())
        .namespace("other")
        .start()
        .await
        .unwrap();
    expect_permanent(
        "user without permission on the namespace (lock)",
        "PermissionDenied",
        BOUND,
        outside.mutex("m").unwrap().lock(),
    )
    .await;
    expect_permanent(
        "user without permission on the namespace (leader)",
        "PermissionDenied",
        BOUND,
        outside.election("e").unwrap().leader(),
    )
    .await;
    assert!(outside.list_entries().await.is_err());
    // observe() yields the permanent error once and ends: no stream that retries for ever.
    let items: Vec<_> = tokio::time::timeout(
        BOUND,
        outside.election("e").unwrap().observe().collect::<Vec<_>>(),
    )
    .await
    .expect("observe() ended after a permanent error");
    assert!(
        matches!(items[..], [Err(Error::PermissionDenied { .. })]),
        "{items:?}"
    );
    outside.close().await.unwrap();
    if let Some(plain) = harness::shared() {
        expect_permanent(
            "user set, authentication not enabled",
            "InvalidConfig",
            BOUND,
            connect(EtcdConfig::new([plain.endpoint(0)]).user("app", "pw")),
        )
        .await;
    }
    let r = connect(EtcdConfig::new([&ep]).user("app", "wrong")).await;
    assert!(matches!(r, Err(Error::Unauthenticated { .. })));
}
