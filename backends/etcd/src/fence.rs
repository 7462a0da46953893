//! The session's create fence: a create that the cluster applies after the session gave it up
//! must fail, not leave an entry that nobody knows of.
//!
//! A create whose request went unanswered (held up on a paused member, or in a link that
//! delivers late) may still be applied after the session moved on: after it removed the entry
//! or found none to abandon. Such an entry, on the session's live lease, would queue ahead of
//! every later waiter for the session's whole life, and nobody would release it.
//!
//! So every create of the session also compares the *fence key*'s mod revision with the last
//! one the session knows (0 while the key does not exist), and a removal that may leave such a
//! create on its way — of a key whose create went unanswered, or an abandon — puts the fence
//! key in the same txn: every create sent before it then fails its compare, wherever it is
//! held up. The session's own creates that fail on the fence alone (another removal moved it
//! meanwhile) read its new revision in the same txn and are sent again. Only a removal after an
//! unanswered create writes the fence: none does while requests are answered.
//!
//! The fence key is `{namespace}/./{lease hex}`, attached to the lease (it goes with the
//! session). No lock's entry is there: a `.` segment is no valid name. (A user whose etcd role
//! grants fewer keys than the namespace's range cannot compare it: see the README.)

use std::collections::HashMap;
use std::sync::Mutex;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, TxnOp, TxnResponse};

/// How often a create is sent again because the fence moved under it, before it fails with a
/// temporary error (the core then retries it, after a pause).
pub(crate) const FENCE_TRIES: usize = 8;

/// The fence of one session.
#[derive(Debug, Default)]
pub(crate) struct Fence {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Each namespace's fence key, made once (every create names it), and its revision as
    /// last known (0: no fence key yet).
    revs: HashMap<String, Known>,
    /// The keys whose create went unanswered, with their namespace: their next removal must
    /// move the fence.
    unsettled: HashMap<String, String>,
}

/// A namespace's fence, as last known.
#[derive(Debug)]
struct Known {
    key: String,
    rev: i64,
}

/// The fence key of `lease` in `namespace`.
pub(crate) fn fence_key(namespace: &str, lease: i64) -> String {
    format!("{namespace}/./{lease:x}")
}

/// Whether `key`, found under `{namespace}/`, is a fence key (not an entry): of this namespace
/// or of one nested in it (`a/b/./…` under `a`). No valid name or namespace has a `.` segment.
pub(crate) fn is_fence_key(namespace: &str, key: &str) -> bool {
    key.strip_prefix(namespace)
        .is_some_and(|rest| rest.contains("/./"))
}

impl Fence {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fence of `namespace` as last known, made on first use.
    fn known<'a>(s: &'a mut State, namespace: &str, lease: i64) -> &'a mut Known {
        // Looked up before a key is made: once per create.
        if !s.revs.contains_key(namespace) {
            let key = fence_key(namespace, lease);
            s.revs.insert(namespace.to_string(), Known { key, rev: 0 });
        }
        s.revs.get_mut(namespace).expect("inserted above")
    }

    /// The compare that every create in `namespace` carries (the fence as last known), the
    /// fence key (to read it back if the create fails), and the revision it expects.
    pub(crate) fn compare(&self, namespace: &str, lease: i64) -> (Compare, String, i64) {
        let mut s = self.state();
        let k = Self::known(&mut s, namespace, lease);
        let compare = Compare::mod_revision(k.key.as_str(), CompareOp::Equal, k.rev);
        (compare, k.key.clone(), k.rev)
    }

    /// A create that expected the fence at `sent` failed and read it (`kvs`, the reply to a
    /// get of the fence key in the same txn): whether the fence is elsewhere (then the create
    /// is sent again, expecting it where it now is, after putting it again if it is
    /// [gone](Self::gone)).
    pub(crate) fn moved(&self, namespace: &str, lease: i64, sent: i64, kvs: &[KeyValue]) -> bool {
        let now = kvs.first().map_or(0, KeyValue::mod_revision);
        // Read in the txn whose compare failed: the cluster's truth, whatever replies of
        // removals said before.
        Self::known(&mut self.state(), namespace, lease).rev = now;
        now != sent
    }

    /// Whether the fence key in `namespace` was deleted by someone else (an operator) after
    /// it had been put: creates sent before it was put would pass again.
    pub(crate) fn gone(&self, namespace: &str, sent: i64) -> bool {
        sent > 0 && self.state().revs.get(namespace).is_none_or(|k| k.rev == 0)
    }

    /// The put that moves the fence of `namespace` (in a removal's txn), on `lease`.
    pub(crate) fn put(&self, namespace: &str, lease: i64) -> TxnOp {
        let key = Self::known(&mut self.state(), namespace, lease).key.clone();
        TxnOp::put(key, "", Some(PutOptions::new().with_lease(lease)))
    }

    /// The fence of `namespace` was put by the txn that answered `resp` (its revision).
    pub(crate) fn moved_by(&self, namespace: &str, lease: i64, resp: &TxnResponse) {
        let Some(rev) = resp.header().map(|h| h.revision()) else {
            return;
        };
        let mut s = self.state();
        let k = Self::known(&mut s, namespace, lease);
        // Replies of several removals may come in any order: the fence only grows.
        k.rev = k.rev.max(rev);
    }

    /// The create of `key` (in `namespace`) went unanswered: it may still be applied.
    pub(crate) fn unanswered(&self, namespace: &str, key: &str) {
        self.state()
            .unsettled
            .insert(key.to_string(), namespace.to_string());
    }

    /// The namespace of `key` if its removal must move the fence (a create of it went
    /// unanswered).
    pub(crate) fn must_move(&self, key: &str) -> Option<String> {
        self.state().unsettled.get(key).cloned()
    }

    /// The fence moved after every create of `key` that went unanswered.
    pub(crate) fn settled(&self, key: &str) {
        self.state().unsettled.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_keys_are_told_from_entries() {
        let key = fence_key("ns", 0xab);
        assert_eq!(key, "ns/./ab");
        assert!(is_fence_key("ns", &key));
        // A nested namespace's, and the empty namespace's.
        assert!(is_fence_key("ns", &fence_key("ns/team", 1)));
        assert!(is_fence_key("", &fence_key("", 1)));
        assert!(!is_fence_key("ns", "ns/jobs/ab"));
        assert!(!is_fence_key("ns", "ns/jobs/read/ab_1"));
    }
}
