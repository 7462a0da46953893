//! Credentials kept out of messages.

/// `url` with everything before its last `@` (where a user and password may be, even one
/// holding a `/` or an `@`) replaced by `***`, the scheme kept: for error messages and logs.
///
/// ```
/// assert_eq!(fencelock_net::redact("redis://u:p@h:1/2"), "redis://***@h:1/2");
/// assert_eq!(fencelock_net::redact("u:p@h:1"), "***@h:1");
/// assert_eq!(fencelock_net::redact("etcd://a:1,b:2/ns"), "etcd://a:1,b:2/ns");
/// ```
pub fn redact(url: &str) -> String {
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
