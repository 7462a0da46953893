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
/// assert_eq!(fencelock_net::redact("http://[::1]:2379,[::1]"), "http://[::1]:2379,[::1]");
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

/// `rest` (what follows the scheme) with every "port" of its hosts that is not a number masked:
/// `user:password` with its `@host` left out reads as a host and a port, and the "port" may be
/// a password.
fn mask_odd_ports(rest: &str) -> String {
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let hosts: Vec<String> = authority
        .split(',')
        .map(|host| match host.rsplit_once(':') {
            // A bracketed IPv6 address without a port: the colon is the address's.
            Some((_, port)) if port.contains(']') => host.to_string(),
            Some((name, port)) if !port.is_empty() && !port.bytes().all(|b| b.is_ascii_digit()) => {
                format!("{name}:***")
            }
            _ => host.to_string(),
        })
        .collect();
    format!("{}{tail}", hosts.join(","))
}
