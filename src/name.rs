//! Validation of lock, election and namespace names.

use crate::{Error, Result};

/// The longest lock or election name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 512;

fn invalid(name: &str, reason: &'static str) -> Error {
    Error::invalid_name(name, reason)
}

/// The longest name of a queue the core makes: a user's name of up to [`MAX_NAME_LEN`] bytes
/// plus the suffix a primitive made of several queues appends to it (a semaphore's `/leases`
/// and `/locks`), so that every primitive accepts every name [`validate_name`] accepts.
pub(crate) const MAX_QUEUE_NAME_LEN: usize = MAX_NAME_LEN + 16;

fn check_segments(name: &str) -> Result<()> {
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(name, "is longer than 512 bytes"));
    }
    check_rest(name)
}

fn check_rest(name: &str) -> Result<()> {
    if name.contains('\0') {
        return Err(invalid(name, "contains NUL"));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(invalid(name, "contains a control character"));
    }
    if name.ends_with('/') {
        return Err(invalid(name, "ends with '/'"));
    }
    for seg in name.split('/').skip(usize::from(name.starts_with('/'))) {
        match seg {
            "" => return Err(invalid(name, "contains an empty segment ('//')")),
            "." | ".." => return Err(invalid(name, "contains a '.' or '..' segment")),
            _ => {}
        }
    }
    Ok(())
}

/// The last segments that a read-write lock keeps its readers and writers under (Go's
/// `RWMutex` layout, `{name}/read/…` and `{name}/write/…`, on etcd and in memory). A user's name
/// ending in one of them below another segment would queue among that read-write lock's
/// entries.
///
/// (A semaphore's two queues, `{name}/locks` and `{name}/leases`, are not reserved: Curator's
/// `InterProcessSemaphoreV2` lays them out the same way, and its own examples lock paths such as
/// `/examples/locks`. As with Curator, a mutex named `pool/locks` is the gate of the semaphore
/// `pool`: do not name a lock after another primitive's queue.)
pub const RESERVED_LAST_SEGMENTS: [&str; 2] = ["read", "write"];

/// Checks a lock or election name: non-empty, at most [`MAX_NAME_LEN`] bytes, no NUL or other
/// control character, no leading or trailing `/`, no empty, `.` or `..` segment (the rules of
/// every backend: ZooKeeper adds its own, below), and, below another segment,
/// no last segment of [`RESERVED_LAST_SEGMENTS`]: a mutex named `jobs/read` would otherwise
/// queue among the readers of the read-write lock `jobs` (a name of one segment, `read`, is
/// fine, but in the root namespace only: a session's namespace is a segment above it).
///
/// A backend may refuse more, at `mutex()` (and the other primitives) or `start()` for a
/// namespace, with [`Error::InvalidName`](crate::Error::InvalidName). ZooKeeper refuses what
/// its server's path check rejects (any character in U+D800–U+F8FF or U+FFF0–U+FFFF, every
/// character above U+FFFF: an emoji, say), segments shaped as its recipes' queue entries
/// (`lock-0000000001`, and the `latch-`, `lease-`, `__READ__`, `__WRIT__` forms), segments
/// ending in `.proclaimed`, and, without a chroot, a path whose first segment is `zookeeper`
/// (a namespace, or a name in the root namespace).
///
/// ```
/// assert!(fencelock::validate_name("jobs/reindex").is_ok());
/// assert!(fencelock::validate_name("read").is_ok());
/// assert!(fencelock::validate_name("examples/locks").is_ok());
/// assert!(fencelock::validate_name("/jobs").is_err());
/// assert!(fencelock::validate_name("").is_err());
/// assert!(fencelock::validate_name("jobs/read").is_err());
/// ```
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(invalid(name, "empty"));
    }
    if name.starts_with('/') {
        return Err(invalid(name, "starts with '/'"));
    }
    check_segments(name)?;
    if let Some((_, last)) = name.rsplit_once('/') {
        if RESERVED_LAST_SEGMENTS.contains(&last) {
            return Err(invalid(
                name,
                "ends in a segment that read-write locks keep their entries under (read, write)",
            ));
        }
    }
    Ok(())
}

/// [`validate_name`] for a queue in `namespace`: a namespace nests (a lock `b` in the
/// namespace `ns/a` is the lock `a/b` in `ns`, and `a` in `ns` is `ns/a` in the root), so a
/// name of one segment in a namespace is below another segment too, and may not be one of
/// [`RESERVED_LAST_SEGMENTS`] either (`read` in `ns` would queue among the readers of the
/// read-write lock `ns` of the root namespace).
pub fn validate_name_in(namespace: &str, name: &str) -> Result<()> {
    validate_name(name)?;
    if !namespace.trim_matches('/').is_empty() && RESERVED_LAST_SEGMENTS.contains(&name) {
        return Err(invalid(
            name,
            "in a namespace, a segment that read-write locks keep their entries under (read, write)",
        ));
    }
    Ok(())
}

/// Checks the name of a queue the core makes or finds (a user's name with a primitive's suffix,
/// or a name read back from a listing): the rules of [`validate_name`], with room for the
/// suffix ([`MAX_QUEUE_NAME_LEN`]).
pub(crate) fn validate_queue_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(invalid(name, "empty"));
    }
    if name.starts_with('/') {
        return Err(invalid(name, "starts with '/'"));
    }
    if name.len() > MAX_QUEUE_NAME_LEN {
        return Err(invalid(name, "longer than a queue name may be"));
    }
    check_rest(name)
}

/// Checks the prefix of a listing: no name could start with a longer one, or with a NUL or
/// another control character (a listing by such a prefix would find nothing, and say so as if
/// nothing were held: an input error reads better).
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.len() > MAX_QUEUE_NAME_LEN {
        return Err(invalid(prefix, "a prefix longer than any name"));
    }
    if prefix.chars().any(|c| c.is_control()) {
        return Err(invalid(prefix, "contains a control character"));
    }
    Ok(())
}

/// Checks a namespace: empty, or a name as for [`validate_name`] that may also start with `/`.
pub fn validate_namespace(namespace: &str) -> Result<()> {
    if namespace.is_empty() {
        return Ok(());
    }
    if namespace == "/" {
        return Err(invalid(namespace, "use the empty namespace instead of '/'"));
    }
    // Said to be the namespace: the same checks as a name's, whose message would blame a name.
    check_segments(namespace).map_err(|e| match e {
        Error::InvalidName(i) => {
            Error::invalid_name(namespace, format!("the namespace {}", i.reason))
        }
        e => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_namespace_is_said_to_be_the_namespace() {
        let e = validate_namespace("x/").unwrap_err().to_string();
        assert!(e.contains("the namespace ends with '/'"), "{e}");
    }

    #[test]
    fn names() {
        for ok in [
            "a",
            "jobs/reindex",
            "x.y",
            "é",
            &"n".repeat(512),
            "read",
            "locks",
            "read/jobs",
            "jobs/reader",
            "examples/locks",
            "pool/leases",
        ] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "a//b",
            "a\0b",
            "a/./b",
            "..",
            "a\nb",
            &"n".repeat(513),
            "jobs/read",
            "a/b/write",
        ] {
            assert!(
                matches!(validate_name(bad), Err(Error::InvalidName(_))),
                "{bad:?}"
            );
        }
        assert!(validate_namespace("").is_ok());
        assert!(validate_namespace("/svc/locks").is_ok());
        assert!(validate_namespace("/").is_err());
        assert!(validate_name_in("", "read").is_ok());
        assert!(validate_name_in("/", "write").is_ok());
        assert!(validate_name_in("ns", "reads").is_ok());
        for (ns, name) in [("ns", "read"), ("/svc/jobs", "write"), ("ns", "a/read")] {
            assert!(
                matches!(validate_name_in(ns, name), Err(Error::InvalidName(_))),
                "{ns:?} {name:?}"
            );
        }
    }

    #[test]
    fn prefixes() {
        for ok in ["", "jobs/", "a", &"n".repeat(MAX_QUEUE_NAME_LEN)] {
            assert!(validate_prefix(ok).is_ok(), "{ok}");
        }
        for bad in [&"n".repeat(MAX_QUEUE_NAME_LEN + 1), "a\0", "a\tb"] {
            assert!(
                matches!(validate_prefix(bad), Err(Error::InvalidName(_))),
                "{bad:?}"
            );
        }
    }
}
