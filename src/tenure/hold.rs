//! One holder's share of a tenure (what every guard is made of), and its own end.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use super::ended::Ended;
use super::Tenure;
use crate::race::{race, First};
use crate::session::LostReason;
use crate::{Error, Result};

/// One holder's share of a tenure: what every guard is made of. A tenure may be held through
/// several shares at once (a reentrant hold, see [`Guard::reenter`](crate::Guard::reenter));
/// its entry is released when the last share is released or dropped.
pub(crate) struct Hold {
    tenure: Arc<Tenure>,
    /// This share was released.
    released: AtomicBool,
    /// The end of this share alone, made by the first `lost()` (most guards never ask): a
    /// share released while others hold the tenure ends here, not in the tenure.
    own_end: OnceLock<Arc<Ended>>,
}

impl Hold {
    pub(crate) fn new(tenure: Tenure) -> Self {
        tenure.holds.store(1, Ordering::SeqCst);
        Hold {
            tenure: Arc::new(tenure),
            released: AtomicBool::new(false),
            own_end: OnceLock::new(),
        }
    }

    /// Another share of the same tenure (same entry, same token).
    pub(crate) fn share(&self) -> Result<Self> {
        self.check_held()?;
        self.tenure.holds.fetch_add(1, Ordering::SeqCst);
        Ok(Hold {
            tenure: self.tenure.clone(),
            released: AtomicBool::new(false),
            own_end: OnceLock::new(),
        })
    }

    pub(crate) fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    pub(crate) fn is_held(&self) -> bool {
        !self.released.load(Ordering::SeqCst) && self.tenure.is_held()
    }

    /// Resolves when this share ends: released or dropped (the others may hold on), or the
    /// tenure ends.
    pub(crate) fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let tenure_lost = self.tenure.lost();
        let own = self.own_end.get_or_init(Default::default).clone();
        // After the end is made: a release that came first did not see it (see `ended_here`).
        if self.released.load(Ordering::SeqCst) {
            own.first(self.end_reason());
        }
        async move {
            match race(own.wait(), tenure_lost).await {
                First::Left(r) | First::Right(r) => r,
            }
        }
    }

    /// Ends this share's `lost()` futures, those to come included (after `released` was
    /// set): the reason is fixed now, not when a `lost()` is first asked for (a share released
    /// before a later loss was released).
    fn ended_here(&self) {
        self.own_end
            .get_or_init(Default::default)
            .first(self.end_reason());
    }

    /// Why this share ended once released or dropped: by its owner's choice, unless the tenure
    /// was lost already (then that loss, which a Supervisor must not take for a release).
    fn end_reason(&self) -> LostReason {
        self.tenure.lost_reason().unwrap_or(LostReason::Released)
    }

    pub(crate) fn check_held(&self) -> Result<()> {
        if self.released.load(Ordering::SeqCst) {
            return Err(Error::NotHeld(LostReason::Released));
        }
        self.tenure.check_held()
    }

    /// Ends this share; the last share releases the entry and confirms it.
    pub(crate) async fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Err(Error::NotHeld(LostReason::Released));
        }
        self.ended_here();
        if self.tenure.holds.fetch_sub(1, Ordering::SeqCst) > 1 {
            // Others still hold it: this share ends, the entry stays.
            return match self.tenure.lost_reason() {
                None => Ok(()),
                Some(r) => Err(Error::NotHeld(r)),
            };
        }
        self.tenure.release().await
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.released.swap(true, Ordering::SeqCst) {
            self.ended_here();
            if self.tenure.holds.fetch_sub(1, Ordering::SeqCst) == 1 {
                self.tenure.hand_off_release();
            }
        }
    }
}
