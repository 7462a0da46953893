//! The conformance suite and etcd-specific behaviour against a real etcd member started by the
//! harness.

use std::time::Duration;

use fencelock::{Error, Session};
use fencelock_etcd::{EtcdBackend, EtcdConfig};
use fencelock_integration::servers::etcd::EtcdFactory;

fencelock::conformance_tests!(EtcdFactory::shared());

/// Keys follow the Go `clientv3/concurrency` layout and the token is the key's create
/// revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_compatible_layout_and_create_revision_token() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let s = Session::builder(f.etcd().clone())
        .namespace("layout")
        .start()
        .await
        .unwrap();
    let g = s.mutex("jobs/reindex").unwrap().lock().await.unwrap();
    assert_eq!(g.key(), format!("layout/jobs/reindex/{}", s.id()));
    let mut kv = f.etcd().client().kv_client();
    let got = kv.get(g.key(), None).await.unwrap();
    let kv0 = &got.kvs()[0];
    assert_eq!(kv0.create_revision() as u64, g.token().get());
    assert_eq!(format!("{:x}", kv0.lease()), s.id());
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// Elections use the Go `concurrency.Election` layout: `{prefix}/{lease hex}` holding the
/// value; the epoch is the key's create revision; `proclaim` rewrites the value in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_compatible_election_layout() {
    let Some(f) = EtcdFactory::shared().await else {
        return;
    };
    let s = Session::builder(f.etcd().clone())
        .namespace("")
        .start()
        .await
        .unwrap();
    let name = format!("elect-{}", std::process::id());
    let l = s
        .election(&name)
        .unwrap()
        .campaign(b"node-a:8080")
        .await
        .unwrap();
    assert_eq!(l.key(), format!("/{name}/{}", s.id()));
    let mut kv = f.etcd().client().kv_client();
    let got = kv.get(l.key(), None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"node-a:8080");
    assert_eq!(got.kvs()[0].create_revision() as u64, l.epoch().get());
    l.proclaim(b"node-a:9090").await.unwrap();
    let got = kv.get(l.key(), None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"node-a:9090");
    assert_eq!(got.kvs()[0].create_revision() as u64, l.epoch().get());
    l.resign().await.unwrap();
    s.close().await.unwrap();
}

/// An unreachable endpoint fails with `Error::Connect` after the bounded connect timeout; no
/// endpoint at all is a configuration error.
#[tokio::test]
async fn unreachable_endpoint_is_a_connect_error() {
    let port = fencelock_integration::free_port();
    let config = EtcdConfig::new(vec![format!("127.0.0.1:{port}")])
        .connect_timeout(Duration::from_millis(500));
    let start = std::time::Instant::now();
    let r = EtcdBackend::connect_with(config).await;
    assert!(matches!(r, Err(Error::Connect { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    let r = EtcdBackend::connect(Vec::<String>::new()).await;
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
}
