//! An error as fencelock prints it: the error, then each of its causes (the part that says
//! why: a refused connection, a server's own message), with every secret it was given masked.

use std::error::Error as _;
use std::sync::OnceLock;

use crate::args::ClusterArgs;
use crate::url::{percent, Url};

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
/// on one line, with each of `secrets` masked.
fn describe_masking(e: &fencelock::Error, secrets: &[String]) -> String {
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
    for secret in secrets {
        line = line.replace(secret.as_str(), "***");
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
}
