//! The arguments of the scripts, and reading their replies.

use std::time::Duration;

use fencelock::backend::{Entry, EntryKind, Peer};
use fencelock::FencingToken;
use redis::Value;

use crate::layout::kind_of;

/// A script call's arguments.
pub(crate) type Args = Vec<Vec<u8>>;

/// One argument, as text.
pub(crate) fn arg(v: impl ToString) -> Vec<u8> {
    v.to_string().into_bytes()
}

/// Whole milliseconds, at least 1 (what `PX` and `WAIT` take).
pub(crate) fn ms(d: Duration) -> u128 {
    d.as_millis().max(1)
}

/// An integer reply (or a bulk string holding one).
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// A string reply.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A bulk reply's bytes (empty for anything else).
pub(crate) fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        Value::SimpleString(s) => s.clone().into_bytes(),
        _ => Vec::new(),
    }
}

/// An array reply (nil as empty).
pub(crate) fn array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(a) => Some(a),
        Value::Nil => Some(&[]),
        _ => None,
    }
}

pub(crate) fn entry(key: String, kind: EntryKind, token: u64) -> Entry {
    Entry {
        key,
        token: FencingToken::new(token),
        order: token,
        kind,
    }
}

/// The `{name, token, kind, …}` list of the scripts, nearest first, in queue order.
pub(crate) fn peers(v: &Value) -> Option<Vec<Peer>> {
    let flat = array(v)?;
    let mut out = Vec::with_capacity(flat.len() / 3);
    for t in flat.chunks(3) {
        let [name, token, kind] = t else { return None };
        out.push(Peer {
            key: text(name)?,
            order: u64::try_from(int(token)?).ok()?,
            kind: kind_of(&text(kind)?),
        });
    }
    out.reverse();
    Some(out)
}

/// The lines of a reply a script wrote as one bulk string (`ENQUEUE`, `REMOVE`: cheaper for
/// the client to parse than an array); `None` for anything else.
pub(crate) fn lines(v: &Value) -> Option<std::slice::Split<'_, u8, impl FnMut(&u8) -> bool>> {
    match v {
        Value::BulkString(b) => Some(b.split(|c| *c == b'\n')),
        _ => None,
    }
}

/// A line holding an integer.
pub(crate) fn int_line(line: Option<&[u8]>) -> Option<i64> {
    std::str::from_utf8(line?).ok()?.parse().ok()
}

/// The `name`, `token`, `kind` lines that end such a reply, nearest first, in queue order.
pub(crate) fn peer_lines<'a>(mut rest: impl Iterator<Item = &'a [u8]>) -> Option<Vec<Peer>> {
    let mut out = Vec::new();
    while let Some(name) = rest.next() {
        let (token, kind) = (rest.next()?, rest.next()?);
        out.push(Peer {
            key: String::from_utf8_lossy(name).into_owned(),
            order: u64::try_from(int_line(Some(token))?).ok()?,
            kind: kind_of(&String::from_utf8_lossy(kind)),
        });
    }
    out.reverse();
    Some(out)
}
