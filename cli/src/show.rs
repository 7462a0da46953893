//! `leader`, `observe` and `list`: what they print, as text or JSON lines.

use std::time::SystemTime;

use fencelock::{EntryInfo, EntryKind, LeaderInfo, QueueInfo, QueueKind};
use serde_json::{json, Value};

use crate::args::Output;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn time(t: Option<SystemTime>) -> Value {
    t.map_or(Value::Null, |t| {
        Value::String(humantime::format_rfc3339_millis(t).to_string())
    })
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
        (Output::Text, Some(l)) => format!("{name}: {} (epoch {})", text(&l.value), l.epoch),
        (Output::Text, None) => format!("{name}: no leader"),
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

/// The lines for one queue of `list`.
pub(crate) fn queue(q: &QueueInfo, output: Output) -> Vec<String> {
    let held = holders(q);
    let role = |i: usize| if i < held { "holder" } else { "waiter" };
    match output {
        Output::Json => {
            let entries: Vec<Value> = q
                .entries
                .iter()
                .enumerate()
                .map(|(i, e)| entry_json(e, role(i)))
                .collect();
            vec![json!({ "name": q.name, "kind": kind(q.kind), "entries": entries }).to_string()]
        }
        Output::Text => {
            let mut out = vec![format!("{} ({})", q.name, kind(q.kind))];
            for (i, e) in q.entries.iter().enumerate() {
                let mut line = format!(
                    "  {:<6} token {:<10} session {:<18} {}",
                    role(i),
                    e.token,
                    e.session,
                    e.key
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
