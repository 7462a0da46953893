//! Bookkeeping of the gray-failure tests and benchmark rows: instants of events (lock grants,
//! confirmed heartbeats) recorded by many tasks, and the gaps between them around a fault.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Instants of one kind of event (grants, confirmed heartbeats), shared by the tasks that
/// record them. Clones share the same record.
#[derive(Debug, Clone, Default)]
pub struct Stamps(Arc<Mutex<Vec<Instant>>>);

impl Stamps {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an event now.
    pub fn record(&self) {
        self.record_at(Instant::now());
    }

    /// Records an event at `at`.
    pub fn record_at(&self, at: Instant) {
        self.0.lock().unwrap().push(at);
    }

    /// How many events were recorded.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Whether no event was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every event so far, sorted.
    pub fn sorted(&self) -> Vec<Instant> {
        let mut v = self.0.lock().unwrap().clone();
        v.sort();
        v
    }

    /// The first event at or after `from`, if any.
    pub fn first_after(&self, from: Instant) -> Option<Instant> {
        self.sorted().into_iter().find(|t| *t >= from)
    }
}

/// The events of `stamps` in `[from, to]`, in order.
fn sorted_within(stamps: &[Instant], from: Instant, to: Instant) -> Vec<Instant> {
    let mut inside: Vec<Instant> = stamps
        .iter()
        .copied()
        .filter(|t| *t >= from && *t <= to)
        .collect();
    inside.sort();
    inside
}

/// The events of `stamps` between `from` and `to` (both included), and the longest time without
/// one in that window (its ends count as events).
pub fn grants_between(stamps: &[Instant], from: Instant, to: Instant) -> (usize, Duration) {
    let inside = sorted_within(stamps, from, to);
    let n = inside.len();
    let mut marks = vec![from];
    marks.extend(inside);
    marks.push(to);
    let gap = marks
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    (n, gap)
}

/// The longest time between `from` and the next event, or between two consecutive events
/// after `from` (the last event ends the window: no gap is counted after it).
pub fn longest_gap_from(stamps: &[Instant], from: Instant) -> Duration {
    let mut after: Vec<Instant> = stamps.iter().copied().filter(|t| *t >= from).collect();
    after.sort();
    let mut longest = Duration::ZERO;
    let mut last = from;
    for t in after {
        longest = longest.max(t - last);
        last = t;
    }
    longest
}

/// The longest time without an event that overlaps the fault `[from, to)`: counted from the last
/// event before `from` (or `from`), through the events up to `end`; if no event came after `to`
/// by `end`, the time up to `end` counts too. For heartbeats: the longest time the client went
/// without a confirmed one, around a fault.
pub fn longest_gap_across(
    stamps: &[Instant],
    from: Instant,
    to: Instant,
    end: Instant,
) -> Duration {
    let mut sorted: Vec<Instant> = stamps.iter().copied().filter(|t| *t <= end).collect();
    sorted.sort();
    let start = sorted
        .iter()
        .rev()
        .find(|t| **t <= from)
        .copied()
        .unwrap_or(from);
    let mut marks = vec![start];
    marks.extend(sorted.iter().copied().filter(|t| *t > from));
    if marks.last().is_none_or(|t| *t <= to) {
        marks.push(end);
    }
    marks
        .windows(2)
        .filter(|w| w[0] < to)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

/// The median gap between consecutive events in `[from, to]` (a client's healthy heartbeat
/// period, say); `None` with fewer than two events.
pub fn median_gap(stamps: &[Instant], from: Instant, to: Instant) -> Option<Duration> {
    let inside = sorted_within(stamps, from, to);
    let mut gaps: Vec<Duration> = inside.windows(2).map(|w| w[1] - w[0]).collect();
    if gaps.is_empty() {
        return None;
    }
    gaps.sort();
    Some(gaps[gaps.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_around_a_fault() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let beats = [at(0), at(100), at(200), at(900), at(1000)];
        // Fault from 250 to 800: the gap 200 → 900 overlaps it.
        assert_eq!(
            longest_gap_across(&beats, at(250), at(800), at(1200)),
            Duration::from_millis(700)
        );
        // No beat after the fault: the gap runs to the end.
        assert_eq!(
            longest_gap_across(&beats[..3], at(250), at(800), at(1200)),
            Duration::from_millis(1000)
        );
        assert_eq!(
            grants_between(&beats, at(150), at(950)),
            (2, Duration::from_millis(700))
        );
        assert_eq!(
            longest_gap_from(&beats, at(150)),
            Duration::from_millis(700)
        );
        assert_eq!(
            median_gap(&beats, at(0), at(1000)),
            Some(Duration::from_millis(100))
        );
    }
}
