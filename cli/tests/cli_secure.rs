//! The `fencelock` binary against secured etcd clusters: mutual TLS given through environment
//! variables, and user authentication given through flags (the password through the
//! environment, which the command does not inherit); wrong settings exit 78.

use std::process::Command;
use std::sync::Arc;

use fencelock_integration::pki::TestPki;
use fencelock_integration::servers::etcd::{EtcdCluster, EtcdOptions, ServerTls};
use fencelock_integration::servers::{available, Cluster};
use fencelock_integration::target::Kind;

/// Runs `fencelock` with `env` and `args` to its end (bounded by its own timeouts); returns the
/// exit code and what it printed.
fn fencelock(env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .envs(env.iter().copied())
        .args(["--connect-timeout", "3s"])
        .args(args)
        .output()
        .expect("run fencelock");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_from_the_environment() {
    if !available(Kind::Etcd) {
        return;
    }
    let pki = TestPki::generate();
    let server = pki.server();
    let options = EtcdOptions {
        tls: Some(ServerTls {
            cert: server.cert,
            key: server.key,
            client_ca: Some(pki.ca()),
        }),
        ..Default::default()
    };
    let cluster = Arc::new(
        tokio::task::spawn_blocking(move || EtcdCluster::start_with(1, options))
            .await
            .unwrap(),
    );
    let url = format!("etcd://{}", cluster.endpoint(0));
    let client = pki.client();
    let (ca, cert, key) = (
        pki.ca().display().to_string(),
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    let env = [
        ("FENCELOCK_ENDPOINTS", url.as_str()),
        ("FENCELOCK_TLS_CA", ca.as_str()),
        ("FENCELOCK_TLS_CERT", cert.as_str()),
        ("FENCELOCK_TLS_KEY", key.as_str()),
    ];
    let (code, out) = fencelock(
        &env,
        &["lock", "m", "--", "sh", "-c", "echo token=$FENCELOCK_TOKEN"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("token="), "{out}");
    // Without a client certificate the server refuses: a configuration error.
    let (code, out) = fencelock(&env[..2], &["lock", "m", "--", "true"]);
    assert_eq!(code, 78, "{out}");
    // Without TLS at all.
    let (code, out) = fencelock(&env[..1], &["lock", "m", "--", "true"]);
    assert_eq!(code, 78, "{out}");
    // A CA that did not sign the server's certificate: bad configuration, not "unreachable"
    // (69 tells a wrapper to try again).
    let foreign = TestPki::generate();
    let foreign_ca = foreign.ca().display().to_string();
    let (code, out) = fencelock(
        &[
            env[0],
            ("FENCELOCK_TLS_CA", foreign_ca.as_str()),
            env[2],
            env[3],
        ],
        &["lock", "m", "--", "true"],
    );
    assert_eq!(code, 78, "{out}");
    // A server name without TLS would be ignored: refused.
    let (code, out) = fencelock(
        &env[..1],
        &["--server-name", "etcd.example", "lock", "m", "--", "true"],
    );
    assert_eq!(code, 78, "{out}");
    assert!(out.contains("--cacert"), "{out}");
}

/// A TLS-only Redis server that requires client certificates, with an ACL user: the same flags
/// and variables as for etcd, the password from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_mutual_tls_as_an_acl_user() {
    use fencelock_integration::servers::redis::{self as harness, RedisServer};
    if !harness::available() {
        return;
    }
    let pki = TestPki::generate();
    let redis = tokio::task::block_in_place(|| RedisServer::start_tls(&pki, true));
    let client = pki.client();
    let url = format!("redis://app@{}", redis.addr());
    let (ca, cert, key) = (
        pki.ca().display().to_string(),
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    let env = [
        ("FENCELOCK_ENDPOINTS", url.as_str()),
        ("FENCELOCK_PASSWORD", "app-pw"),
        ("FENCELOCK_TLS_CA", ca.as_str()),
        ("FENCELOCK_TLS_CERT", cert.as_str()),
        ("FENCELOCK_TLS_KEY", key.as_str()),
    ];
    let (code, out) = fencelock(
        &env,
        &["lock", "m", "--", "sh", "-c", "echo token=$FENCELOCK_TOKEN"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("token="), "{out}");
    // The same with a rediss:// URL.
    let rediss = format!("rediss://app@{}", redis.addr());
    let mut tls_url = env;
    tls_url[0] = ("FENCELOCK_ENDPOINTS", rediss.as_str());
    let (code, out) = fencelock(&tls_url, &["lock", "m", "--", "true"]);
    assert_eq!(code, 0, "{out}");
    // Without a client certificate, and without TLS: configuration errors (78).
    let (code, out) = fencelock(&env[..3], &["lock", "m", "--", "true"]);
    assert_eq!(code, 78, "{out}");
    let (code, out) = fencelock(&env[..2], &["lock", "m", "--", "true"]);
    assert_eq!(code, 78, "{out}");
    // A wrong password: never printed.
    let mut wrong = env;
    wrong[1] = ("FENCELOCK_PASSWORD", "not-the-pw");
    let (code, out) = fencelock(&wrong, &["lock", "m", "--", "true"]);
    assert_ne!(code, 0, "{out}");
    assert!(!out.contains("not-the-pw"), "{out}");
}

/// A Redis server with a password of its default user (`requirepass`): the password alone, in
/// `FENCELOCK_PASSWORD` with a URL without user info, is used (it was refused with 78 for want
/// of a user); a wrong one is refused with 78 and never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_password_alone_is_the_default_users() {
    use fencelock_integration::servers::redis::{self as harness, Durability, RedisServer};
    if !harness::available() {
        return;
    }
    let redis = tokio::task::block_in_place(|| RedisServer::start(Durability::None));
    redis
        .cli(&["CONFIG", "SET", "requirepass", "only-pw"])
        .unwrap();
    let url = format!("redis://{}", redis.addr());
    let env = [
        ("FENCELOCK_ENDPOINTS", url.as_str()),
        ("FENCELOCK_PASSWORD", "only-pw"),
    ];
    let (code, out) = fencelock(
        &env,
        &[
            "lock",
            "m",
            "--",
            "sh",
            "-c",
            "echo pw=[$FENCELOCK_PASSWORD]",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("pw=[]"), "{out}");
    let wrong = [env[0], ("FENCELOCK_PASSWORD", "not-the-pw")];
    let (code, out) = fencelock(&wrong, &["lock", "m", "--", "true"]);
    assert_eq!(code, 78, "{out}");
    assert!(!out.contains("not-the-pw"), "{out}");
    // No password at all: refused by the server, 78.
    let (code, out) = fencelock(&env[..1], &["lock", "m", "--", "true"]);
    assert_eq!(code, 78, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_authentication() {
    if !available(Kind::Etcd) {
        return;
    }
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| EtcdCluster::start(1))
            .await
            .unwrap(),
    );
    cluster.enable_auth("billing", "ops", "s3cret").await;
    let url = format!("etcd://{}/billing", cluster.endpoint(0));
    let env = [
        ("FENCELOCK_ENDPOINTS", url.as_str()),
        ("FENCELOCK_PASSWORD", "s3cret"),
    ];
    // The command gets the token, not the password.
    let (code, out) = fencelock(
        &env,
        &[
            "--user",
            "ops",
            "lock",
            "m",
            "--",
            "sh",
            "-c",
            "echo pw=[$FENCELOCK_PASSWORD] token=$FENCELOCK_TOKEN",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("pw=[] token="), "{out}");
    let bad = [
        ("FENCELOCK_ENDPOINTS", url.as_str()),
        ("FENCELOCK_PASSWORD", "wrong"),
    ];
    let (code, out) = fencelock(&bad, &["--user", "ops", "lock", "m", "--", "true"]);
    assert_eq!(code, 78, "{out}");
    // The credentials in the URL: used, and never shown to the command or printed.
    let with_creds = format!("etcd://ops:s3cret@{}/billing", cluster.endpoint(0));
    let (code, out) = fencelock(
        &[("FENCELOCK_ENDPOINTS", with_creds.as_str())],
        &[
            "lock",
            "m",
            "--",
            "sh",
            "-c",
            "echo env=[$FENCELOCK_ENDPOINTS] pw=[$FENCELOCK_PASSWORD]",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("s3cret"), "{out}");
    assert!(out.contains(&format!("env=[{url}] pw=[]")), "{out}");
    let wrong = format!("etcd://ops:wr0ng@{}/billing", cluster.endpoint(0));
    let (code, out) = fencelock(
        &[("FENCELOCK_ENDPOINTS", wrong.as_str())],
        &["lock", "m", "--", "true"],
    );
    assert_eq!(code, 78, "{out}");
    assert!(!out.contains("wr0ng"), "{out}");
    // The URL's user and the option's disagree: refused, not guessed.
    let (code, out) = fencelock(
        &[("FENCELOCK_ENDPOINTS", with_creds.as_str())],
        &["--user", "root", "lock", "m", "--", "true"],
    );
    assert_eq!(code, 78, "{out}");
    // A namespace the user has no permission on.
    let other = format!("etcd://{}/payroll", cluster.endpoint(0));
    let (code, out) = fencelock(
        &[
            ("FENCELOCK_ENDPOINTS", other.as_str()),
            ("FENCELOCK_PASSWORD", "s3cret"),
        ],
        &["--user", "ops", "lock", "m", "--", "true"],
    );
    assert_eq!(code, 78, "{out}");
}

/// A password in the URL never shows: not in `--help` (from the environment), not in connect
/// errors, whatever the scheme; etcd and ZooKeeper use the URL's user and password (here the
/// server is unreachable: 69, and the password is not in the message).
#[test]
fn credentials_never_printed() {
    let dead = fencelock_integration::free_port();
    for scheme in ["etcd", "zk", "redis"] {
        let url = format!("{scheme}://app:s3cret@127.0.0.1:{dead}");
        let (code, out) = fencelock(
            &[("FENCELOCK_ENDPOINTS", url.as_str())],
            &["lock", "m", "--", "true"],
        );
        assert_eq!(code, 69, "{scheme}: {out}");
        assert!(!out.contains("s3cret"), "{scheme}: {out}");
        let (code, out) = fencelock(&[("FENCELOCK_ENDPOINTS", url.as_str())], &["--help"]);
        assert_eq!(code, 0, "{out}");
        assert!(!out.contains("s3cret"), "--help: {out}");
        // A user without a password is refused, not ignored.
        let url = format!("{scheme}://app@127.0.0.1:{dead}");
        let (code, out) = fencelock(
            &[("FENCELOCK_ENDPOINTS", url.as_str())],
            &["lock", "m", "--", "true"],
        );
        assert_eq!(code, 78, "{scheme}: {out}");
    }
    // A password that starts with `-` is the option's value, not echoed in a usage error as an
    // unexpected argument.
    let url = format!("redis://127.0.0.1:{dead}");
    for (option, rest) in [
        ("--password", &["--user", "app"][..]),
        ("--sentinel-password", &[][..]),
    ] {
        let mut args = vec!["--endpoints", url.as_str()];
        args.extend_from_slice(rest);
        args.extend_from_slice(&[option, "--S3CRET-pw", "lock", "m", "--", "true"]);
        let (code, out) = fencelock(&[], &args);
        assert_ne!(code, 2, "{option}: {out}");
        assert!(!out.contains("S3CRET"), "{option}: {out}");
    }
}
