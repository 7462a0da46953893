//! Guarded writes: etcd transactions that apply only while a lock or leadership is held.

use etcd_client::{Compare, CompareOp, Txn};
use fencelock::Holding;

/// A compare that holds exactly while `grant` (a [`Guard`](fencelock::Guard), a write or read
/// guard, a permit, a [`Leadership`](fencelock::Leadership)) is still held: its entry's key
/// still has the create revision that is its fencing token. Go's `Mutex.IsOwner()`.
///
/// Put it in the `when` of your own transaction and etcd itself refuses the write of a holder
/// that lost the lock, even one paused past its lease's expiry that does not know yet: once
/// the lease expired the entry is gone (or re-created with a newer revision), so the compare
/// fails, atomically with the write.
///
/// ```no_run
/// # async fn run(session: fencelock::Session, mut client: etcd_client::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use etcd_client::{Txn, TxnOp};
///
/// let guard = session.mutex("config/publisher")?.lock().await?;
/// let txn = Txn::new()
///     .when([fencelock_etcd::ownership(&guard)])
///     .and_then([TxnOp::put("config/current", "v42", None)]);
/// let applied = client.txn(txn).await?.succeeded();
/// if !applied {
///     // The lock was lost: nothing was written.
/// }
/// # Ok(()) }
/// ```
pub fn ownership(grant: &impl Holding) -> Compare {
    Compare::create_revision(grant.key(), CompareOp::Equal, grant.token().get() as i64)
}

/// A transaction whose `when` is [`ownership`] of `grant`: add your operations with
/// [`Txn::and_then`] (and, if you want to read what is there on failure, [`Txn::or_else`]).
pub fn guarded_txn(grant: &impl Holding) -> Txn {
    Txn::new().when([ownership(grant)])
}
