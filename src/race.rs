//! Racing two futures without tokio's `select!` (the core asks tokio for no macros).

use std::future::Future;
use std::pin::pin;

use futures_util::future::{select, Either};

/// Which of two raced futures finished first, with its output (the other is dropped).
#[derive(Debug)]
pub(crate) enum First<A, B> {
    /// The first future finished first.
    Left(A),
    /// The second future finished first.
    Right(B),
}

/// Runs `a` and `b` concurrently; returns the output of the first to finish, dropping the
/// other. When both are ready at once, `a` wins.
pub(crate) async fn race<A: Future, B: Future>(a: A, b: B) -> First<A::Output, B::Output> {
    match select(pin!(a), pin!(b)).await {
        Either::Left((a, _)) => First::Left(a),
        Either::Right((b, _)) => First::Right(b),
    }
}
