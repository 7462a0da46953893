//! The credentials to authenticate with (from the URL and the options), and what of the
//! cluster URL the command may see.

use fencelock::Error;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::args::ClusterArgs;

/// A user and password, from the URL (`scheme://USER:PASSWORD@hosts`, percent-encoded) or the
/// options.
#[derive(PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
}

/// The user and password to authenticate with: from the URL, the options
/// (`--user`/`FENCELOCK_USER`, `--password`/`FENCELOCK_PASSWORD`), or both if they agree.
/// With `default_user` (Redis, whose servers have one: `requirepass`), a password alone is the
/// default user's.
pub(crate) fn credentials(
    args: &ClusterArgs,
    from_url: Option<(String, Option<String>)>,
    default_user: bool,
) -> fencelock::Result<Option<Credentials>> {
    let (url_user, url_password) = match from_url {
        Some((u, p)) => (Some(u), p),
        None => (None, None),
    };
    let pick = |what: &'static str, a: Option<String>, b: &Option<String>| match (a, b) {
        (Some(a), Some(b)) if &a != b => Err(Error::invalid_config(
            "--user / --password",
            format!("two different {what}s: the URL's and the option's"),
        )),
        (Some(a), _) => Ok(Some(a)),
        (None, b) => Ok(b.clone()),
    };
    let user = pick("user", url_user, &args.user)?;
    let password = pick("password", url_password, &args.password)?;
    // Never ignored: a Redis client drops an empty password (`redis://:@HOST` sent no `AUTH`,
    // and ran as the default user: black-box round 37).
    if password.as_ref().is_some_and(String::is_empty) {
        return Err(Error::invalid_config(
            "--password",
            "the password is empty (in the URL, --password or FENCELOCK_PASSWORD): give the password, or no credentials",
        ));
    }
    match (user, password) {
        (None, None) => Ok(None),
        (Some(user), Some(password)) => Ok(Some(Credentials { user, password })),
        (None, Some(password)) if default_user => Ok(Some(Credentials {
            user: String::new(),
            password,
        })),
        _ => Err(Error::invalid_config(
            "--user / --password",
            "authentication needs both a user and a password (FENCELOCK_USER, FENCELOCK_PASSWORD, or USER:PASSWORD@ in the URL)",
        )),
    }
}

/// What the command's environment gets from fencelock's: `FENCELOCK_ENDPOINTS` is `used`, the
/// cluster fencelock holds the lock on (`--endpoints` or the variable), without the
/// credentials it may carry (an inherited variable named another cluster when `--endpoints`
/// was given); the passwords go.
pub(crate) fn command_env(used: Option<&str>) -> Vec<(String, Option<String>)> {
    vec![
        ("FENCELOCK_PASSWORD".to_string(), None),
        ("FENCELOCK_SENTINEL_PASSWORD".to_string(), None),
        (
            "FENCELOCK_ENDPOINTS".to_string(),
            used.map(without_user_info),
        ),
    ]
}

/// `url` without the user info before its hosts (up to the last `@` before the path, the rule
/// of [`Url::parse`](crate::url::Url::parse)).
fn without_user_info(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// The characters a URL's user info may hold as they are: letters, digits and `-._~`.
const USER_INFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `s` with the characters a URL's user info cannot hold percent-encoded.
pub(crate) fn percent(s: &str) -> String {
    utf8_percent_encode(s, USER_INFO).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding() {
        assert_eq!(percent("a-b._~Z9"), "a-b._~Z9");
        assert_eq!(percent("p@ss/w:rd é"), "p%40ss%2Fw%3Ard%20%C3%A9");
    }

    #[test]
    fn the_command_sees_no_user_info() {
        assert_eq!(
            without_user_info("redis://u:p@h:1/2"),
            "redis://h:1/2".to_string()
        );
        assert_eq!(without_user_info("etcd://h:1"), "etcd://h:1".to_string());
        assert_eq!(
            without_user_info("etcd://u:p@h:1/n"),
            "etcd://h:1/n".to_string()
        );
    }
}
