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
        None => rest.to_string(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{rest}"),
        None => rest,
    }
}
