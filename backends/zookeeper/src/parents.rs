//! The queue parents this backend has seen exist, so that an enqueue on a known lock sends
//! only its create, and one on a new lock creates the parent in the same round trip.

use std::collections::HashSet;
use std::sync::Mutex;

/// At most this many parents are remembered (then the set starts again): a hint, never a
/// truth. A parent remembered but gone (a container the server reaped once it emptied) costs
/// one failed create, then it is created again.
const CAPACITY: usize = 65_536;

/// The set of parents known to exist.
#[derive(Debug, Default)]
pub(crate) struct KnownParents {
    set: Mutex<HashSet<String>>,
}

impl KnownParents {
    pub(crate) fn knows(&self, parent: &str) -> bool {
        self.set.lock().unwrap().contains(parent)
    }

    pub(crate) fn remember(&self, parent: &str) {
        let mut set = self.set.lock().unwrap();
        // Most often known already: no copy of the path made.
        if set.contains(parent) {
            return;
        }
        if set.len() >= CAPACITY {
            set.clear();
        }
        set.insert(parent.to_string());
    }

    pub(crate) fn forget(&self, parent: &str) {
        self.set.lock().unwrap().remove(parent);
    }
}
