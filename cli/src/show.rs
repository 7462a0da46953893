//! `leader`, `observe` and `list`: what they print, as text or JSON lines.

use std::time::SystemTime;

use fencelock::{EntryInfo, EntryKind, LeaderInfo, QueueInfo, QueueKind};
use serde_json::{json, Value};

use crate::args::Output;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `s` for a terminal: control characters escaped (`\n`, `\u{1b}`), so that a value or name
/// someone else wrote cannot forge lines or send escape sequences to whoever reads the output;
/// so are the invisible ones that reorder or hide text (`\u{202e}`, a zero-width space), with
/// which a name would read as another.
fn plain(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() || invisible(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Whether `c` is a character that shows nothing of itself but changes how text around it
/// reads: every format character (Unicode's `Cf`: bidirectional overrides and isolates,
/// zero-width spaces and joiners, soft hyphens, prepended number signs, tag characters), the
/// combining grapheme joiner and variation selectors, line and paragraph separators, fillers
/// that print as blank, and spaces other than the ASCII one.
fn invisible(c: char) -> bool {
    matches!(c,
        // Format characters (Cf), Unicode 15.
        '\u{00ad}' | '\u{0600}'..='\u{0605}' | '\u{061c}' | '\u{06dd}' | '\u{070f}'
        | '\u{0890}'..='\u{0891}' | '\u{08e2}' | '\u{180e}' | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206f}'
        | '\u{feff}' | '\u{fff9}'..='\u{fffb}' | '\u{110bd}' | '\u{110cd}'
        | '\u{13430}'..='\u{1343f}' | '\u{1bca0}'..='\u{1bca3}' | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0001}' | '\u{e0020}'..='\u{e007f}'
        // Joiners and selectors that change the character before them.
        | '\u{034f}' | '\u{fe00}'..='\u{fe0f}' | '\u{e0100}'..='\u{e01ef}'
        // Line and paragraph separators; blank fillers and invisible vowels.
        | '\u{2028}' | '\u{2029}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
        | '\u{2065}' | '\u{3164}' | '\u{ffa0}' | '\u{2800}'
        // Spaces other than the ASCII one, which read as it (a name would read as another).
        | '\u{00a0}' | '\u{1680}' | '\u{2000}'..='\u{200a}' | '\u{202f}' | '\u{205f}'
        | '\u{3000}')
}

/// An entry's creation time; `null` where it cannot be written as RFC 3339 (before 1970 or
/// after 9999: the time is read from the server, where any client could have written it).
fn time(t: Option<SystemTime>) -> Value {
    use std::fmt::Write as _;
    // (humantime panics on a time before the epoch, and fails on one after 9999.)
    t.filter(|t| *t >= SystemTime::UNIX_EPOCH)
        .and_then(|t| {
            let mut s = String::new();
            write!(s, "{}", humantime::format_rfc3339_millis(t))
                .ok()
                .map(|()| Value::String(s))
        })
        .unwrap_or(Value::Null)
}

/// One line for the leader of `name` (or its absence).
pub(crate) fn leader(name: &str, leader: Option<&LeaderInfo>, output: Output) -> String {
    match (output, leader) {
        (Output::Json, l) => json!({
            "name": name,
            "leader": l.map(|l| json!({
                "value": text(&l.value),
                "epoch": l.epoch.get(),
            })),
        })
        .to_string(),
        // An empty value said so (it printed two spaces, which read as a missing field).
        (Output::Text, Some(l)) if l.value.is_empty() => {
            format!("{}: (no value) (epoch {})", plain(name), l.epoch)
        }
        (Output::Text, Some(l)) => format!(
            "{}: {} (epoch {})",
            plain(name),
            plain(&text(&l.value)),
            l.epoch
        ),
        (Output::Text, None) => format!("{}: no leader", plain(name)),
    }
}

fn kind(k: QueueKind) -> &'static str {
    match k {
        QueueKind::Lock => "lock",
        QueueKind::Election => "election",
        QueueKind::ReadWrite => "read-write lock",
        QueueKind::Semaphore => "semaphore leases",
        _ => "queue",
    }
}

/// Which entries of a queue hold it: the first of a lock or election; the readers ahead of
/// the first writer, or that writer, of a read-write lock; every lease of a semaphore (its
/// gate lets at most one more in, which waits for one of them to go).
fn holders(q: &QueueInfo) -> usize {
    match q.kind {
        QueueKind::ReadWrite => match q.entries.first() {
            Some(e) if e.kind == EntryKind::Exclusive => 1,
            _ => q
                .entries
                .iter()
                .position(|e| e.kind == EntryKind::Exclusive)
                .unwrap_or(q.entries.len()),
        },
        QueueKind::Semaphore => q.entries.len(),
        _ => usize::from(!q.entries.is_empty()),
    }
}

fn entry_json(e: &EntryInfo, role: &str) -> Value {
    json!({
        "role": role,
        "key": e.key,
        "token": e.token.get(),
        "session": e.session,
        "shared": e.kind == EntryKind::Shared,
        "value": text(&e.value),
        "created": time(e.created),
    })
}

/// The lines for one queue of `list`: JSON, or text (`one_kind`: the backend keeps a lock and
/// an election alike, and a lock's queue may be an election's: etcd, Redis).
pub(crate) fn queue(q: &QueueInfo, output: Output, one_kind: bool) -> Vec<String> {
    let held = holders(q);
    let role = |i: usize| if i < held { "holder" } else { "waiter" };
    // An election read as a lock, in JSON too (black-box round 16: a script looking for
    // elections found none on etcd and Redis).
    let label = match q.kind {
        QueueKind::Lock if one_kind => "lock or election",
        k => kind(k),
    };
    match output {
        Output::Json => {
            let entries: Vec<Value> = q
                .entries
                .iter()
                .enumerate()
                .map(|(i, e)| entry_json(e, role(i)))
                .collect();
            vec![json!({ "name": q.name, "kind": label, "entries": entries }).to_string()]
        }
        Output::Text => {
            let mut out = vec![format!("{} ({label})", plain(&q.name))];
            for (i, e) in q.entries.iter().enumerate() {
                let mut line = format!(
                    "  {:<6} token {:<10} session {:<18} {}",
                    role(i),
                    e.token,
                    plain(&e.session),
                    plain(&e.key)
                );
                if !e.value.is_empty() {
                    line.push_str(&format!("  value {:?}", text(&e.value)));
                }
                if let Some(age) = e
                    .created
                    .and_then(|c| SystemTime::now().duration_since(c).ok())
                {
                    let age = std::time::Duration::from_secs(age.as_secs());
                    line.push_str(&format!("  for {}", humantime::format_duration(age)));
                }
                out.push(line);
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn times_out_of_rfc3339s_range_are_null() {
        let far = UNIX_EPOCH + Duration::from_secs(300_000_000_000);
        assert_eq!(time(Some(far)), Value::Null);
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(time(Some(before)), Value::Null);
        assert_eq!(
            time(Some(UNIX_EPOCH)),
            Value::String("1970-01-01T00:00:00.000Z".into())
        );
    }

    #[test]
    fn a_leader_without_a_value_says_so() {
        let l = LeaderInfo {
            value: Vec::new(),
            epoch: fencelock::FencingToken::new(3),
        };
        let line = leader("jobs", Some(&l), Output::Text);
        assert_eq!(line, "jobs: (no value) (epoch 3)");
    }

    #[test]
    fn text_output_escapes_control_characters() {
        let l = plain("x\ne: forged (epoch 999)\u{1b}[2J");
        assert_eq!(l, "x\\ne: forged (epoch 999)\\u{1b}[2J");
        assert_eq!(plain("jobs/été"), "jobs/été");
        // A name that would read as another.
        assert_eq!(plain("jobs/\u{202e}gnp.exe"), "jobs/\\u{202e}gnp.exe");
        assert_eq!(plain("a\u{200b}b"), "a\\u{200b}b");
        for c in [
            '\u{034f}',
            '\u{0600}',
            '\u{fe0f}',
            '\u{e0100}',
            '\u{fffa}',
            '\u{17b4}',
        ] {
            assert_eq!(
                plain(&format!("a{c}b")),
                format!("a{}b", c.escape_default())
            );
        }
        assert_eq!(
            plain("\u{e9}t\u{e9} \u{4e2d}"),
            "\u{e9}t\u{e9} \u{4e2d}",
            "visible stays"
        );
    }
}
