//! What a Redis session believes it owns, to find out when the server lost some of its
//! changes, and in which groups (see [`crate::layout`]) it has a key.

// foldhash, not SipHash: looked up on every acquisition, and seeded per process.
use foldhash::HashMap;

use crate::layout::Group;

/// What this session believes it owns on the server, to find out when a failover to a replica
/// lost some of its changes: a release lost that way brings the entry back, and the session's
/// own heartbeat would keep it alive for ever, blocking the lock.
///
/// Every script that changes what the session owns, and the heartbeat, carries the highest
/// version the client has seen in that group; the server compares it with its own before it
/// changes anything. A version the client has seen was made before the request was sent, so a
/// server below it lost changes, whatever order the replies are handled in.
#[derive(Default)]
pub(crate) struct Owned {
    /// The groups the session has (or may have: its first enqueue there is in flight) a key in.
    pub(crate) groups: HashMap<Group, InGroup>,
    /// The names of the entries created or being created, with how many times (a name repeats
    /// when a session re-queues on a lock before the release of its previous entry finished),
    /// and what a release of it must know (see [`Tracked`]).
    pub(crate) names: HashMap<String, Tracked>,
    /// The highest version seen in each group the session has let go of (see
    /// [`Owned::forget_unused`]; at most [`crate::layout::GROUPS`]), and whether the server
    /// there was found behind it and not reconciled since: its next create there carries
    /// both. A failover may have brought back, with a release it lost, the session's key
    /// there and the released entry in it, and no heartbeat renewed the key to find out: the
    /// server's version below this one tells the create, and the entry is deleted as any
    /// that came back with a failover. (Found behind before, the server's version may have
    /// caught up since, with a later change of the session's: the flag still tells.)
    let_go: HashMap<Group, (i64, bool)>,
    /// How many create replies were handled: a request notes it when sent, so that a reply
    /// found behind judges only the creates handled before it was sent (see [`Owned::saw`]).
    handled: u64,
}

/// [`Tracked::created`] before the create's reply (versions are never negative).
const NOT_YET: i64 = -1;

/// An entry name the session owns or is creating.
#[derive(Clone, Copy)]
pub(crate) struct Tracked {
    /// How many entries of that name (see [`Owned::names`]).
    count: u32,
    /// The session's version the create of the newest of them made, once its reply came
    /// ([`NOT_YET`] before). (Kept small: one per held lock.)
    created: i64,
    /// When that reply was handled (see [`Owned::handled`]).
    handled: u64,
    /// A server found behind that version: the create was lost (a failover to a replica that
    /// had not received it), and its release must say so (see `queue::remove`).
    pub(crate) lost: bool,
}

/// The session in one group.
#[derive(Default, Clone, Copy)]
pub(crate) struct InGroup {
    /// The highest version of the session's entries in the group the server reported.
    pub(crate) version: i64,
    /// The server said it is behind that version: it lost changes.
    pub(crate) diverged: bool,
    /// A reply showed the session's key there: from now on, its absence means the session is
    /// gone (before, a heartbeat may find the key not made yet).
    pub(crate) confirmed: bool,
    /// Where the next heartbeat goes on renewing the expiries of the session's entries there
    /// (an `HSCAN` cursor of its key: see `KEEP_ALIVE`).
    pub(crate) renewed_to: u64,
    /// When a heartbeat's script last ran there, renewing a slice of the entries (`None`
    /// before the first): how long the session's key may be renewed alone (see
    /// `heartbeat::renew_key_alone`).
    pub(crate) scripted_at: Option<std::time::Instant>,
}

impl Owned {
    /// A reply from `group`: the server's version (the session's key is there), and whether it
    /// was behind the one the request carried; `sent`, [`Owned::handled`] when the request
    /// was sent.
    pub(crate) fn saw(
        &mut self,
        group: &Group,
        version: Option<i64>,
        behind: Option<i64>,
        sent: u64,
    ) {
        let g = self.group(group);
        if let Some(v) = version {
            g.version = g.version.max(v);
            g.confirmed = true;
        }
        if behind == Some(1) {
            let first = !g.diverged;
            g.diverged = true;
            // The first reply of the episode (once: the loop is over every name) tells the
            // version the server kept, or the one after its own change. A create whose reply
            // was handled before this request was sent, and which that server ran, made a
            // version it kept (its versions only grow): so such a create above it was lost.
            // (Not one handled since: the new server may have run it, numbering its changes
            // anew from where it kept. Missed creates lose a reason, never give a false one.)
            // Marked in every group: behind Sentinel, the only one; on a cluster the mark is
            // not read.
            if let (true, Some(kept)) = (first, version) {
                for t in self.names.values_mut() {
                    if t.handled <= sent && t.created != NOT_YET && t.created > kept {
                        t.lost = true;
                    }
                }
            }
        }
    }

    /// How many create replies were handled so far (see [`Owned::saw`]).
    pub(crate) fn handled(&self) -> u64 {
        self.handled
    }

    /// The highest version seen in `group` (let go of or not).
    pub(crate) fn known(&self, group: &Group) -> i64 {
        match self.groups.get(group) {
            Some(g) => g.version,
            None => self.let_go.get(group).map_or(0, |(v, _)| *v),
        }
    }

    /// Before a create in `group`: counts the group in (its heartbeats extend the key the
    /// create may make) and returns whether the create must make the session's key there, and
    /// whether the server there lost changes not reconciled yet (the create must then not take
    /// an entry of the session's it finds for one of its own: it may be one released since).
    pub(crate) fn entering(&mut self, group: &Group) -> (bool, bool) {
        let g = self.group(group);
        (!g.confirmed, g.diverged)
    }

    /// What is known of `group`, counted in if new. (Looked up before it is cloned: called
    /// twice per acquisition, and the group is most often known.)
    fn group(&mut self, group: &Group) -> &mut InGroup {
        if !self.groups.contains_key(group) {
            let (version, diverged) = self.let_go.remove(group).unwrap_or((0, false));
            self.groups.insert(
                group.clone(),
                InGroup {
                    version,
                    diverged,
                    ..InGroup::default()
                },
            );
        }
        self.groups.get_mut(group).expect("inserted above")
    }

    /// Forgets the groups where the session has no entry it holds or is creating (`group_of`
    /// names an entry's group): their keys expire by themselves, and the session stops
    /// depending on their shards. The session's next create there makes its key again (with
    /// the version seen there so far: see `let_go`).
    pub(crate) fn forget_unused(&mut self, group_of: impl Fn(&str) -> Option<Group>) {
        let used: std::collections::HashSet<Group> =
            self.names.keys().filter_map(|n| group_of(n)).collect();
        let let_go = &mut self.let_go;
        self.groups.retain(|g, s| {
            let keep = used.contains(g);
            if !keep {
                let_go.insert(g.clone(), (s.version, s.diverged));
            }
            keep
        });
    }

    /// Counts in an entry named `name`, being created.
    pub(crate) fn track(&mut self, name: &str) {
        self.names
            .entry(name.to_string())
            .or_insert(Tracked {
                count: 0,
                created: NOT_YET,
                handled: 0,
                lost: false,
            })
            .count += 1;
    }

    /// The create of an entry named `name` made the session's version `version`.
    pub(crate) fn created(&mut self, name: &str, version: Option<i64>) {
        if let (Some(t), Some(v)) = (self.names.get_mut(name), version) {
            self.handled += 1;
            t.created = v;
            t.handled = self.handled;
            t.lost = false;
        }
    }

    pub(crate) fn untrack(&mut self, name: &str) {
        if let Some(n) = self.names.get_mut(name) {
            n.count -= 1;
            if n.count == 0 {
                self.names.remove(name);
            }
        }
    }

    /// Whether the create of the entry named `name` was found lost.
    pub(crate) fn lost(&self, name: &str) -> bool {
        self.names.get(name).is_some_and(|t| t.lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_come_and_go_with_their_entries() {
        let (a, b) = (Group::hashed("ns/a"), Group::hashed("ns/b"));
        let group_of = |name: &str| Some(Group::hashed(name.rsplit_once('/')?.0));
        let mut o = Owned::default();
        o.track("ns/a/s1");
        assert!(o.entering(&a).0, "first create in a: make the key");
        o.saw(&a, Some(1), Some(0), o.handled());
        assert!(!o.entering(&a).0, "confirmed");
        o.track("ns/b/s1");
        assert!(o.entering(&b).0);
        // b's create in flight: kept by its tracked name, still unconfirmed.
        o.forget_unused(group_of);
        assert_eq!(o.groups.len(), 2);
        o.untrack("ns/a/s1");
        o.forget_unused(group_of);
        assert!(!o.groups.contains_key(&a), "nothing held in a: let go");
        assert_eq!(
            o.entering(&a),
            (true, false),
            "a later create there makes the key again"
        );
        assert_eq!(o.known(&a), 1, "with the version seen there before");
        assert_eq!(o.known(&b), 0);
        o.saw(&b, Some(3), Some(1), o.handled());
        assert!(o.groups[&b].diverged && o.known(&b) == 3);
        o.untrack("ns/b/s1");
        o.forget_unused(group_of);
        assert!(!o.groups.contains_key(&b), "let go, behind or not");
        assert_eq!(o.known(&b), 3, "its version still known");
        assert_eq!(o.entering(&b), (true, true), "and that it was behind");
    }

    #[test]
    fn a_loss_marks_the_creates_above_the_version_kept() {
        let a = Group::single();
        let mut o = Owned::default();
        for (name, v) in [("q/1", 3), ("q/2", 5), ("q/3", 6)] {
            o.track(name);
            o.created(name, Some(v));
            let sent = o.handled();
            o.saw(&a, Some(v), Some(0), sent);
        }
        o.track("q/4"); // in flight: made on whichever server answers it
        let sent = o.handled();
        // Sent before, handled after the request below: made on the new server, numbered
        // anew (its 6 after the 5 it kept), not lost.
        o.track("q/5");
        o.created("q/5", Some(6));
        o.saw(&a, Some(5), Some(1), sent);
        assert!(!o.lost("q/1") && !o.lost("q/2") && !o.lost("q/4") && !o.lost("q/5"));
        assert!(o.lost("q/3"), "created at 6, the server kept 5");
        // Later replies of the same episode mark nothing more.
        let sent = o.handled();
        o.saw(&a, Some(2), Some(1), sent);
        assert!(!o.lost("q/2"));
        // A new create of that name is not lost.
        o.track("q/3");
        o.created("q/3", Some(7));
        assert!(!o.lost("q/3"));
    }
}
