//! The authority of a URL that names several servers (`redis+sentinel://`, `redis+cluster://`):
//! `[user[:password]@]host[:port][,host[:port]…]`.

use fencelock::{Error, Result};

use crate::config::redact;

/// Refuses a URL whose user info holds a raw `/` (what follows `scheme://` is `rest`). The
/// user info ends at the last `@`, as [`redact`] reads it; split at the first `/` instead, a
/// password `12/x` would be read as a host `user:12` and a path, and shown in errors.
pub(crate) fn no_slash_in_userinfo(url: &str, rest: &str) -> Result<()> {
    match rest.rsplit_once('@') {
        Some((userinfo, _)) if userinfo.contains('/') => Err(Error::invalid_config(
            redact(url),
            "a '/' in the user or password must be percent-encoded (%2F), and a name after \
             the hosts may not hold an '@'"
                .to_string(),
        )),
        _ => Ok(()),
    }
}

/// The user info (still percent-encoded) and the `host:port`s of `authority`, a part of `url`
/// (for messages, redacted); a host without a port gets `default_port`; at most `max` hosts,
/// called `what` in messages.
pub(crate) fn parse(
    url: &str,
    authority: &str,
    default_port: u16,
    max: usize,
    what: &str,
) -> Result<(Option<String>, Vec<String>)> {
    let bad = |why: String| {
        Error::invalid_config(
            redact(url),
            format!("{why}{}", fencelock_net::masked_port_note(url)),
        )
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u.to_string()), h),
        None => (None, authority),
    };
    let mut out = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err(bad(format!("an empty {what} address")));
        }
        let with_port = match host.rsplit_once(':') {
            // An IPv6 address without a port ends in `]`.
            Some((h, p)) if !p.ends_with(']') => {
                if h.is_empty() || p.parse::<u16>().map_or(true, |p| p == 0) {
                    return Err(bad(format!("a {what} address must be HOST or HOST:PORT")));
                }
                // Else `::1` would be host `:` at port 1, and `fe80::1:6379` a host no lookup
                // finds, seen only at the connect.
                if h.contains(':') && !(h.starts_with('[') && h.ends_with(']')) {
                    return Err(bad(format!(
                        "a {what} address's host may not hold a ':' (an IPv6 address goes in \
                         brackets: [ADDRESS]:PORT)"
                    )));
                }
                host.to_string()
            }
            _ => format!("{host}:{default_port}"),
        };
        // A server named twice would count twice (a sentinel's answer toward the majority).
        if out.contains(&with_port) {
            return Err(bad(format!("the {what} {with_port} is named twice")));
        }
        out.push(with_port);
        if out.len() > max {
            return Err(bad(format!("more than {max} {what}s")));
        }
    }
    Ok((userinfo, out))
}

/// `redis://` (`rediss://` with `tls`) to `host`, with `userinfo` (still percent-encoded) and a
/// database if given.
pub(crate) fn server_url(tls: bool, userinfo: Option<&str>, host: &str, db: Option<u32>) -> String {
    let scheme = if tls { "rediss" } else { "redis" };
    let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let db = db.map(|d| format!("/{d}")).unwrap_or_default();
    format!("{scheme}://{auth}{host}{db}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Result<Vec<String>> {
        parse("redis+sentinel://x/m", list, 26379, 16, "sentinel").map(|(_, h)| h)
    }

    #[test]
    fn ports_default_and_ipv6_is_bracketed() {
        assert_eq!(
            hosts("a,b:1,[::1],[::1]:2").unwrap(),
            ["a:26379", "b:1", "[::1]:26379", "[::1]:2"]
        );
        for bad in [
            "::1",
            "fe80::1:6379",
            "[::1",
            "a:b:1",
            "a:",
            ":1",
            "a:0",
            "a,,b",
        ] {
            let e = hosts(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig { .. }), "{bad}: {e:?}");
        }
        let e = hosts("fe80::1:6379").unwrap_err().to_string();
        assert!(e.contains("brackets"), "{e}");
    }
}
