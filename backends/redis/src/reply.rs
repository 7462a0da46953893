//! The arguments of the scripts, and reading their replies.

use std::time::Duration;

use fencelock::backend::{Entry, EntryKind, Peer};
use fencelock::FencingToken;
use redis::Value;

use crate::layout::kind_of;

/// A script call's arguments, one after another in one buffer: one allocation for all of them,
/// and the command sized from it at once (a `Vec` per argument, and a command grown argument
/// by argument, cost the client about 8,000 instructions per acquisition: callgrind).
#[derive(Clone, Debug, Default)]
pub(crate) struct Args {
    data: Vec<u8>,
    /// Where each argument ends in `data`.
    ends: Vec<usize>,
}

impl Args {
    /// Room for `n` arguments of a typical size.
    pub(crate) fn with_capacity(n: usize) -> Args {
        Args {
            data: Vec::with_capacity(n * 24),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends one argument.
    pub(crate) fn push(&mut self, a: impl ScriptArg) -> &mut Args {
        a.write(&mut self.data);
        self.ends.push(self.data.len());
        self
    }

    /// How many arguments.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Their bytes in all.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Each argument, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let a = &self.data[start..end];
            start = end;
            a
        })
    }
}

impl<A: ScriptArg> FromIterator<A> for Args {
    fn from_iter<I: IntoIterator<Item = A>>(all: I) -> Args {
        let all = all.into_iter();
        let mut args = Args::with_capacity(all.size_hint().0);
        for a in all {
            args.push(a);
        }
        args
    }
}

/// The arguments of a script call: `args![a, b, …]`, each text, bytes or an integer.
macro_rules! args {
    ($($a:expr),* $(,)?) => {{
        let mut args = $crate::reply::Args::with_capacity([$(stringify!($a)),*].len());
        $(args.push($a);)*
        args
    }};
}
pub(crate) use args;

/// What a script takes as an argument: text, bytes, or an integer (in decimal, as the scripts
/// read it).
pub(crate) trait ScriptArg {
    /// Appends it to `buf`.
    fn write(self, buf: &mut Vec<u8>);
}

impl ScriptArg for &str {
    fn write(self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(self.as_bytes());
    }
}

impl ScriptArg for &String {
    fn write(self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(self.as_bytes());
    }
}

impl ScriptArg for String {
    fn write(self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(self.as_bytes());
    }
}

impl ScriptArg for &[u8] {
    fn write(self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(self);
    }
}

macro_rules! integer_arg {
    ($($t:ty),*) => {$(
        impl ScriptArg for $t {
            fn write(self, buf: &mut Vec<u8>) {
                buf.extend_from_slice(itoa::Buffer::new().format(self).as_bytes());
            }
        }
    )*};
}
integer_arg!(i64, u64, u128, usize);

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
