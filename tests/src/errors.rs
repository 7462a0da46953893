//! The error table of the secure-connection tests: each wrong setting, the error it gives, and
//! how long it took, printed as a markdown row (`--nocapture` shows them).

use std::future::Future;
use std::time::{Duration, Instant};

use fencelock::Error;

/// A short name for the kind of `e` (its variant).
pub fn kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidName(_) => "InvalidName",
        Error::InvalidTtl(_) => "InvalidTtl",
        Error::InvalidValue(_) => "InvalidValue",
        Error::InvalidConfig(_) => "InvalidConfig",
        Error::Connect { .. } => "Connect",
        Error::Unauthenticated { .. } => "Unauthenticated",
        Error::PermissionDenied { .. } => "PermissionDenied",
        Error::Timeout { .. } => "Timeout",
        Error::SessionLost(_) => "SessionLost",
        Error::NotHeld(_) => "NotHeld",
        Error::EntryVanished { .. } => "EntryVanished",
        Error::StaleToken { .. } => "StaleToken",
        Error::Backend { .. } => "Backend",
        _ => "other",
    }
}

/// The whole chain of `e`'s messages, for a failure message.
pub fn chain(e: &Error) -> String {
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// Runs `op`, which must fail with a permanent error of kind `expected` within `bound`; prints
/// the table row `| situation | error | temporary | time |` and returns the error.
pub async fn expect_permanent<T: std::fmt::Debug>(
    situation: &str,
    expected: &str,
    bound: Duration,
    op: impl Future<Output = fencelock::Result<T>>,
) -> Error {
    let start = Instant::now();
    let r = tokio::time::timeout(bound + Duration::from_secs(5), op)
        .await
        .unwrap_or_else(|_| panic!("{situation}: no answer within {bound:?} (a hang)"));
    let took = start.elapsed();
    let e = match r {
        Ok(v) => panic!("{situation}: expected {expected}, got Ok({v:?})"),
        Err(e) => e,
    };
    println!(
        "| {situation} | {} | {} | {} ms |",
        kind(&e),
        if e.is_temporary() {
            "temporary"
        } else {
            "permanent"
        },
        took.as_millis()
    );
    assert_eq!(kind(&e), expected, "{situation}: {}", chain(&e));
    assert!(
        !e.is_temporary(),
        "{situation}: must be permanent: {}",
        chain(&e)
    );
    assert!(took <= bound, "{situation}: took {took:?}, bound {bound:?}");
    e
}
