//! Unit tests of the ZooKeeper settings: what is accepted, what is refused, what is masked.

use super::*;

#[test]
fn credentials_in_the_connect_string() {
    let e = ZooKeeperConfig::new("u:secret@a:1,b:2/x")
        .resolve()
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    assert!(!e.to_string().contains("secret"), "{e}");
    // A password with a '/' or a ':' in it: nothing of it shows (split first, its start was
    // taken for a host and port, its end for a chroot).
    for cs in [
        "admin:2024/Spring@zk1:2181",
        "user:pa/ss@zk1:2181",
        "u:a:b@zk1",
    ] {
        let e = ZooKeeperConfig::new(cs).resolve().err().unwrap();
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        for part in ["2024", "Spring", "pa", "ss", "a:b"] {
            if cs.contains(part) {
                assert!(!e.to_string().contains(part), "{cs}: {e}");
            }
        }
    }
}

/// `user:password` with its `@host` left out reads as a host and a port: the "port" is not
/// shown.
#[test]
fn a_password_taken_for_a_port_is_not_shown() {
    let e = ZooKeeperConfig::new("bob:Hunter2Secret")
        .resolve()
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    assert!(!e.to_string().contains("Hunter2"), "{e}");
    // What is hidden is said to be (black-box round 39).
    let e = ZooKeeperConfig::new("127.0.0.1:99999")
        .resolve()
        .err()
        .unwrap();
    assert!(e.to_string().contains("not a port"), "{e}");
}

#[test]
fn resolve_rules() {
    let r = ZooKeeperConfig::new("a:1,b/x").resolve().unwrap();
    assert_eq!(r.servers, "tcp://a:1,tcp://b:2181");
    assert_eq!(r.chroot.as_deref(), Some("/x"));
    let bad = |c: ZooKeeperConfig| matches!(c.resolve(), Err(Error::InvalidConfig(_)));
    assert!(bad(ZooKeeperConfig::new("a:1/x").chroot("/y")));
    assert!(bad(ZooKeeperConfig::new("a:1").chroot("x")));
    assert!(bad(ZooKeeperConfig::new("a:1").chroot("/x/")));
    assert!(bad(ZooKeeperConfig::new("")));
    assert!(bad(ZooKeeperConfig::new("a:notaport")));
    assert!(bad(ZooKeeperConfig::new("tcp+tls://a:1")));
    assert!(bad(ZooKeeperConfig::new("http://a:1")));
    // A chroot after another server than the last would be dropped: refused.
    assert!(bad(ZooKeeperConfig::new("a:1/apps/billing,b:2")));
    assert!(bad(ZooKeeperConfig::new("tcp://a:1/x,tcp://b:2/x")));
    assert!(bad(ZooKeeperConfig::new("::1")));
    assert!(bad(ZooKeeperConfig::new("a:1").acl(AclMode::CreatorDelete)));
    assert!(ZooKeeperConfig::new("a:1")
        .digest_auth("u", "p")
        .acl(AclMode::CreatorDelete)
        .resolve()
        .is_ok());
    assert!(bad(
        ZooKeeperConfig::new("a:1").connect_timeout(Duration::ZERO)
    ));
    assert!(bad(
        ZooKeeperConfig::new("a:1").connect_timeout(Duration::MAX)
    ));
    // A host out of the DNS grammar is a setting to fix (black-box round 39).
    assert!(bad(ZooKeeperConfig::new("not a host!!")));
    assert!(bad(ZooKeeperConfig::new("a:1,bücher.example:2181")));
    assert!(!bad(ZooKeeperConfig::new(
        "zk-1.example_a:2181,[::1]:2181,10.0.0.1"
    )));
    // 1 ns failed every session start later, as a temporary error (black-box round 39).
    assert!(bad(
        ZooKeeperConfig::new("a:1").connect_timeout(Duration::from_nanos(1))
    ));
    assert!(!bad(
        ZooKeeperConfig::new("a:1").connect_timeout(crate::MIN_CONNECT_TIMEOUT)
    ));
    assert!(bad(ZooKeeperConfig::new("a:1").sasl_digest_md5("", "p")));
    assert!(bad(ZooKeeperConfig::new("a:1").min_ttl(Duration::ZERO)));
    assert!(bad(
        ZooKeeperConfig::new("a:1").min_ttl(Duration::from_micros(999))
    ));
    assert!(bad(
        ZooKeeperConfig::new("a:1").min_ttl(crate::MAX_TTL + Duration::from_millis(1))
    ));
    assert!(ZooKeeperConfig::new("a:1")
        .min_ttl(Duration::from_millis(1))
        .resolve()
        .is_ok());
    let r = ZooKeeperConfig::new("a:1/").resolve().unwrap();
    assert_eq!(r.chroot, None);
    // A server named twice is one server (a session moved off it must not come back to it).
    let r = ZooKeeperConfig::new("a:1,A:1,b,b:2181").resolve().unwrap();
    assert_eq!(r.servers, "tcp://a:1,tcp://b:2181");
    // ZooKeeper's own tree is no chroot, nor is a path ZooKeeper refuses: settings refused
    // as such, not as names.
    for c in [
        ZooKeeperConfig::new("a:1").chroot("/zookeeper/quota"),
        ZooKeeperConfig::new("a:1/zookeeper"),
        ZooKeeperConfig::new("a:1").chroot("/a//b"),
        ZooKeeperConfig::new("a:1").chroot("/a/."),
    ] {
        assert!(matches!(c.resolve(), Err(Error::InvalidConfig(_))));
    }
    // `user:password` given as the digest user: the password is not shown.
    let e = ZooKeeperConfig::new("a:1")
        .digest_auth("billing:12345", "p")
        .resolve()
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    assert!(!e.to_string().contains("12345"), "{e}");
    let dbg = format!(
        "{:?}",
        ZooKeeperConfig::new("a:1")
            .digest_auth("u", "secret")
            .sasl_digest_md5("v", "secret")
    );
    assert!(!dbg.contains("secret"));
    let dbg = format!("{:?}", ZooKeeperConfig::new("u:secret@a:1"));
    assert!(!dbg.contains("secret"), "{dbg}");
}
