//! An error as fencelock prints it: the error, then each of its causes (the part that says
//! why: a refused connection, a server's own message), with every secret it was given masked.

use std::sync::OnceLock;

use crate::args::ClusterArgs;
use crate::credentials::percent;
use crate::url::Url;

/// The longest a printed error may be (a server's message can be long; one line is meant).
const MAX_LEN: usize = 1_000;

/// The secrets every printed error is masked of (set once, at the start).
static SECRETS: OnceLock<Vec<String>> = OnceLock::new();

/// Notes the secrets of `args` (see [`secrets`]) for every later [`describe`].
pub(crate) fn remember_secrets(args: &ClusterArgs) {
    let _ = SECRETS.set(secrets(args));
}

/// [`describe_masking`] with the secrets noted at the start.
pub(crate) fn describe(e: &fencelock::Error) -> String {
    describe_masking(e, SECRETS.get().map(Vec::as_slice).unwrap_or_default())
}

/// The secrets fencelock was given (passwords from the options, the environment and the
/// URL, as given and as a URL would carry them), longest first so that a secret holding
/// another is masked whole.
fn secrets(args: &ClusterArgs) -> Vec<String> {
    let mut found: Vec<String> = [&args.password, &args.sentinel_password]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    if let Some(url) = args.endpoints.as_deref() {
        // The URL's user info as written, and decoded (it may not parse as a whole).
        if let Some((_, rest)) = url.split_once("://") {
            let authority = rest.split('/').next().unwrap_or_default();
            if let Some((info, _)) = authority.rsplit_once('@') {
                found.extend(info.split_once(':').map(|(_, p)| p.to_string()));
            }
        }
        if let Ok(parsed) = Url::parse(url) {
            found.extend(parsed.user_info.and_then(|(_, p)| p));
        }
    }
    let encoded: Vec<String> = found.iter().map(|s| percent(s)).collect();
    found.extend(encoded);
    found.retain(|s| !s.is_empty());
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found.dedup();
    found
}

/// `e` and its causes, `: `-separated (a cause that the text already holds is left out),
/// unmasked (see [`describe`]).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

/// [`chain`] on one line, with each of `secrets` masked.
fn describe_masking(e: &fencelock::Error, secrets: &[String]) -> String {
    let mut line = chain(e);
    for secret in secrets {
        line = mask(&line, secret);
    }
    let mut line: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.len() > MAX_LEN {
        let mut end = MAX_LEN;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
        line.push('…');
    }
    line
}

/// A secret this long is masked wherever it appears; a shorter one only as a word of its own,
/// so that a password `e` leaves `redis` and `authentication` whole (masked inside words, a
/// short password spoils the message and shows itself by the pattern of what was masked).
const MASKED_ANYWHERE: usize = 6;

/// `line` with `secret` masked (see [`MASKED_ANYWHERE`]).
fn mask(line: &str, secret: &str) -> String {
    if secret.chars().count() >= MASKED_ANYWHERE {
        return line.replace(secret, "***");
    }
    // Part of a word, a number or a host name: a letter, a digit, or one of `._-` next to it.
    let joins = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || "._-".contains(c));
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find(secret) {
        let (before, after) = (&rest[..at], &rest[at + secret.len()..]);
        // What precedes in the whole line: what was already copied, if `before` is empty.
        let prev = before
            .chars()
            .next_back()
            .or_else(|| out.chars().next_back());
        out.push_str(before);
        if joins(prev) || joins(after.chars().next()) {
            out.push_str(secret);
        } else {
            out.push_str("***");
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_follow_and_secrets_are_masked() {
        let e = fencelock::Error::Connect {
            backend: "redis",
            endpoints: "redis://***@h:1".into(),
            temporary: true,
            source: "refused: AUTH hunter2 and hunter2%21\nnext".into(),
        };
        let secrets = vec!["hunter2%21".to_string(), "hunter2".to_string()];
        assert_eq!(
            describe_masking(&e, &secrets),
            "redis: cannot connect to redis://***@h:1: refused: AUTH *** and *** next"
        );
    }

    #[test]
    fn a_short_secret_is_masked_only_as_a_word() {
        assert_eq!(
            mask("redis: authentication failed for user:e@host, e", "e"),
            "redis: authentication failed for user:***@host, ***"
        );
        assert_eq!(
            mask("http://127.0.0.1:31099 password 1", "1"),
            "http://127.0.0.1:31099 password ***"
        );
        assert_eq!(mask("zookeeper accepted pw", "p"), "zookeeper accepted pw");
        assert_eq!(mask("long s3cret! here", "s3cret!"), "long *** here");
        assert_eq!(mask("xs3cret!x", "s3cret!"), "x***x");
    }
}
