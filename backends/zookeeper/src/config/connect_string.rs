//! The connect string's parts: the servers, and the chroot after the last of them.

/// Splits `host:port,...[/chroot]` into the servers and the chroot, as the client parses it:
/// the chroot follows the first '/' of the last server (after its optional scheme).
pub(super) fn split_chroot(connect_string: &str) -> (&str, Option<&str>) {
    let after_comma = connect_string.rfind(',').map_or(0, |i| i + 1);
    // Spaces after the comma are the servers' (`a:1, tcp://b:2`), as for every server.
    let last_start = connect_string.len() - connect_string[after_comma..].trim_start().len();
    let last = &connect_string[last_start..];
    let scheme = ["tcp://", "tcp+tls://"]
        .iter()
        .find(|s| last.starts_with(*s))
        .map_or(0, |s| s.len());
    match last[scheme..].find('/') {
        Some(i) => {
            let at = last_start + scheme + i;
            (&connect_string[..at], Some(&connect_string[at..]))
        }
        None => (connect_string, None),
    }
}

/// Whether `host` (split from its port) can name a server: a bracketed IPv6 address (its ':'),
/// or a name of the DNS grammar's characters. One out of it (a space, a '!') failed the connect
/// as a name that does not resolve, where etcd and Redis refuse it as a setting (black-box
/// round 39).
pub(super) fn is_host(host: &str) -> bool {
    host.contains(':')
        || host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chroot_split() {
        assert_eq!(split_chroot("a:1"), ("a:1", None));
        assert_eq!(split_chroot("a:1,b:2/x/y"), ("a:1,b:2", Some("/x/y")));
        assert_eq!(split_chroot("tcp://a:1/x"), ("tcp://a:1", Some("/x")));
        assert_eq!(split_chroot("a:1,tcp://b:2"), ("a:1,tcp://b:2", None));
        assert_eq!(split_chroot("a:1, tcp://b:2"), ("a:1, tcp://b:2", None));
        assert_eq!(
            split_chroot("a:1,  tcp://b:2/x"),
            ("a:1,  tcp://b:2", Some("/x"))
        );
    }
}
