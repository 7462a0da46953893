//! Credentials kept out of messages.

/// `url` with everything before its last `@` (where a user and password may be, even one
/// holding a `/` or an `@`) replaced by `***`, the scheme kept, and the value of a `pass` or
/// `password` query parameter (where a Unix-socket URL, `redis+unix:///run/r.sock?pass=…`,
/// carries its password) replaced by `***`: for error messages and logs.
///
/// ```
/// assert_eq!(fencelock_net::redact("redis://u:p@h:1/2"), "redis://***@h:1/2");
/// assert_eq!(fencelock_net::redact("u:p@h:1"), "***@h:1");
/// assert_eq!(fencelock_net::redact("etcd://a:1,b:2/ns"), "etcd://a:1,b:2/ns");
/// // A user and password without the `@host` after them: read as a host and a port.
/// assert_eq!(fencelock_net::redact("etcd://bob:Hunter2"), "etcd://bob:***");
/// assert_eq!(fencelock_net::redact("bob:pa/ss,zk2:2181"), "bob:***");
/// assert_eq!(fencelock_net::redact("etcd://bob:123456"), "etcd://bob:***");
/// assert_eq!(fencelock_net::redact("bob:pa:ss"), "bob:***");
/// assert_eq!(fencelock_net::redact("http://[::1]:2379,[::1]"), "http://[::1]:2379,[::1]");
/// assert_eq!(fencelock_net::redact("a:1,b:2/ns?x=1"), "a:1,b:2/ns?x=1");
/// assert_eq!(
///     fencelock_net::redact("redis+unix:///r.sock?db=1&pass=p&user=u"),
///     "redis+unix:///r.sock?db=1&pass=***&user=u"
/// );
/// ```
pub fn redact(url: &str) -> String {
    let masked = redact_userinfo(url);
    let Some((before, query)) = masked.split_once('?') else {
        return masked;
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if is_password_key(key) => format!("{key}=***"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{before}?{}", query.join("&"))
}

/// What a message about `input` adds when [`redact`] hides part of it that reads as a port
/// but is none (`host:99999`, `host:pa/ss`): the user learns why what they typed is not shown
/// (black-box round 39: "127.0.0.1:***" hid the very part they got wrong). Empty otherwise.
///
/// ```
/// assert!(fencelock_net::masked_port_note("127.0.0.1:99999").contains("not a port"));
/// assert_eq!(fencelock_net::masked_port_note("127.0.0.1:2379"), "");
/// assert_eq!(fencelock_net::masked_port_note("redis://u:p@h:1"), "");
/// assert!(fencelock_net::masked_port_note("::1:2379").contains("brackets"));
/// assert!(!fencelock_net::masked_port_note("h1:99999,::1").contains("brackets"));
/// ```
pub fn masked_port_note(input: &str) -> &'static str {
    let rest = input.split_once("://").map_or(input, |(_, r)| r);
    if rest.contains('@') {
        return "";
    }
    // What `redact` masks: the first address that is no `host:port`. An IPv6 address without
    // its brackets reads as a host and an odd port.
    let Some((_, address)) = odd_address(rest) else {
        return "";
    };
    let unbracketed = address.parse::<std::net::Ipv6Addr>().is_ok()
        || address
            .rsplit_once(':')
            .is_some_and(|(a, _)| a.parse::<std::net::Ipv6Addr>().is_ok());
    if unbracketed {
        " (an IPv6 address goes in brackets: [::1]:2379; what follows its first ':' is not shown)"
    } else {
        " (what follows a host's ':' is not a port from 0 to 65535, and is not shown: it may be a password)"
    }
}

/// Whether a query parameter named `key` holds a password (as redis-rs reads Unix-socket
/// URLs: `pass`; `password` for the same mistake spelled out).
fn is_password_key(key: &str) -> bool {
    key.eq_ignore_ascii_case("pass") || key.eq_ignore_ascii_case("password")
}

fn redact_userinfo(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let rest = match rest.rsplit_once('@') {
        Some((_, hosts)) => format!("***@{hosts}"),
        None => mask_odd_ports(rest),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{rest}"),
        None => rest,
    }
}

/// `rest` (what follows the scheme) with what may be a password masked when there is no `@`:
/// `user:password` with its `@host` left out reads as a host and a port, and the "port" may be
/// a password (holding digits only, or a `/`, `?`, `,` or `:` of its own). A host with a `:`
/// that does not read as `host:port` (a port from 0 to 65535) has everything after its name
/// masked, and so has the rest of the string after it.
fn mask_odd_ports(rest: &str) -> String {
    let Some((i, address)) = odd_address(rest) else {
        return rest.to_string();
    };
    // A bracketed IPv6 address is the name; else what precedes the first `:`.
    let name = match address.split_once(']') {
        Some((v6, _)) if address.starts_with('[') => format!("{v6}]"),
        _ => address.split(':').next().unwrap_or_default().to_string(),
    };
    let mut out: Vec<String> = rest.split(',').take(i).map(str::to_string).collect();
    out.push(format!("{name}:***"));
    out.join(",")
}

/// The first of `rest`'s comma-separated hosts whose address (the last host carries the path
/// and query, if any) has a `:` but does not read as `host:port`: its index and its address.
fn odd_address(rest: &str) -> Option<(usize, &str)> {
    rest.split(',')
        .map(|host| host.split(['/', '?']).next().unwrap_or_default())
        .enumerate()
        .find(|(_, address)| {
            address.contains(':') && crate::probe::split(address, Some(1)).is_none()
        })
}
