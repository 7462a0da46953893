//! Guarded writes: ZooKeeper `multi`s that apply only while a lock or leadership is held.

use fencelock::Holding;
use zookeeper_client as zk;

/// Adds to `multi` a check that `grant` (a [`Guard`](fencelock::Guard), a read or write guard,
/// a permit, a [`Leadership`](fencelock::Leadership)) is still held: its entry node exists.
/// The node's name carries the uuid of the attempt that created it and is never re-used, so
/// its existence is the grant's (a lost session's ephemeral node is gone).
///
/// Add it first, then your writes, and commit: ZooKeeper applies all of them or none, so the
/// write of a holder that lost the lock, even one paused past its session's expiry that does
/// not know yet, is refused by the ensemble itself (the check fails with `NoNode`).
///
/// Paths are the client's: build `multi` on a client with the same chroot as the backend.
///
/// ```no_run
/// # async fn run(session: fencelock::Session, client: zookeeper_client::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let guard = session.mutex("config/publisher")?.lock().await?;
/// let mut multi = client.new_multi_writer();
/// fencelock_zookeeper::add_ownership_check(&mut multi, &guard)?;
/// multi.add_set_data("/config/current", b"v42", None)?;
/// match multi.commit().await {
///     Ok(_) => {}
///     Err(zookeeper_client::MultiWriteError::OperationFailed { index: 0, .. }) => {
///         // The lock was lost: nothing was written.
///     }
///     Err(e) => return Err(e.into()),
/// }
/// # Ok(()) }
/// ```
pub fn add_ownership_check(
    multi: &mut zk::MultiWriter<'_>,
    grant: &impl Holding,
) -> Result<(), zk::Error> {
    // Version -1: any version (a revocation request changes the node's data, not its owner).
    multi.add_check_version(grant.key(), -1)
}
