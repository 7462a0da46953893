//! How the command line is read: options over their variables, empty variables unset, and
//! the exit of a command line that runs nothing (help, version, a usage error).

use crate::args::Cli;

impl Cli {
    /// The command line, parsed (clap's own exit on a usage error); a variable of the
    /// environment set but empty counts as unset (`FENCELOCK_NAMESPACE=`, from `NS=$UNSET` or
    /// an EnvironmentFile line without a value, switched to the empty namespace, and the locks
    /// of processes that meant to share one stopped excluding each other; `FENCELOCK_TTL=` was
    /// a usage error, `FENCELOCK_PASSWORD=` a password of nothing). The empty namespace stays
    /// reachable from the command line (`--namespace ''`).
    ///
    /// An option given on the command line overrides its variable, which is then not read at
    /// all: clap checks a global option's variable wherever the option is not given (at the
    /// top level, say, when it follows the subcommand), so a malformed `FENCELOCK_TTL` failed
    /// a run given `--ttl 5s`.
    pub(crate) fn parsed() -> Cli {
        Cli::parsed_from(std::env::args_os().collect())
    }

    fn parsed_from(args: Vec<std::ffi::OsString>) -> Cli {
        use clap::parser::ValueSource;
        use clap::{CommandFactory, FromArgMatches};
        // Which options the command line gives, read without the environment (a command line
        // that fails so is left to the full parse below, which reports it).
        let given: Vec<clap::Id> = Cli::command()
            .mut_args(|a| a.env(None))
            .try_get_matches_from(&args)
            .map(|m| {
                m.ids()
                    .filter(|id| m.value_source(id.as_str()) == Some(ValueSource::CommandLine))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let empty = |a: &clap::Arg| {
            a.get_env()
                .and_then(std::env::var_os)
                .is_some_and(|v| v.is_empty())
        };
        let command = Cli::command().mut_args(|a| match given.contains(a.get_id()) || empty(&a) {
            true => a.env(None),
            false => a,
        });
        // A variable still read that is not UTF-8 is named (clap said only "invalid UTF-8 was
        // detected in one or more arguments": black-box round 14). Its value is not shown: it
        // may be a password.
        let not_utf8 = command
            .get_arguments()
            .filter_map(|a| a.get_env())
            .find(|var| std::env::var_os(var).is_some_and(|v| v.to_str().is_none()))
            .map(|var| var.to_string_lossy().into_owned());
        let matches = command
            .try_get_matches_from(&args)
            .unwrap_or_else(|e| match not_utf8 {
                Some(var) if e.kind() == clap::error::ErrorKind::InvalidUtf8 => {
                    not_run(Cli::command().error(e.kind(), format!("{var} is not valid UTF-8")))
                }
                _ => not_run(e),
            });
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| not_run(e))
    }
}

/// Ends a command line that runs nothing: its help or version on stdout (exit 0), or its usage
/// error on stderr (exit 2), as clap's own exit does, except that help that cannot be written
/// (`--help > /dev/full`) exits 70 with a message, as other output does, where clap's exit
/// ignored the failure and exited 0. A reader that quit (`--help | head -1`) still ends it
/// quietly.
fn not_run(e: clap::Error) -> ! {
    use std::io::Write as _;
    // Help or version for a standard output closed at start (`--help >&-`): Rust's runtime put
    // /dev/null there, and the print succeeded into nothing (exit 0: black-box round 15).
    if !e.use_stderr() && crate::stdio::stdout_closed() {
        let _ = writeln!(
            std::io::stderr(),
            "fencelock: cannot write the output: the standard output is closed"
        );
        std::process::exit(i32::from(crate::exit::SOFTWARE));
    }
    let printed = e.print().and_then(|()| std::io::stdout().flush());
    let code = match printed {
        Err(w) if !e.use_stderr() && w.kind() != std::io::ErrorKind::BrokenPipe => {
            let _ = writeln!(std::io::stderr(), "fencelock: cannot write the output: {w}");
            i32::from(crate::exit::SOFTWARE)
        }
        _ => e.exit_code(),
    };
    std::process::exit(code)
}
