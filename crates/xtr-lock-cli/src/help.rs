//! The parts of the help that list stores, generated from the library's scheme table
//! ([`StoreFactory::kinds`]), so that help names every store this build has, and marks those it
//! lacks with the feature that adds them; and the examples, every one safe to copy.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use xtr_lock::{Fencing, StoreFactory, StoreKind};

/// Whether a help text may be shown in this run. clap builds every subcommand's arguments and
/// texts to parse one; the texts generated from the scheme table were 10 % of the instructions
/// of `run … true` (docs/benchmarks.md), so they are made only when help may be shown.
static MAY_SHOW: AtomicBool = AtomicBool::new(true);

/// Decides from the command line `args` (without the program's name) whether help may be
/// shown: no arguments (clap then shows it), `help`, `--help`, `completions`, or a cluster of
/// short options with an `h` (`-h`, `-nh`). A value that looks so only costs the texts' making.
pub(crate) fn make_texts_only_if_asked<I: IntoIterator<Item = impl AsRef<OsStr>>>(args: I) {
    let mut none = true;
    let asked = args.into_iter().any(|arg| {
        none = false;
        let arg = arg.as_ref().as_encoded_bytes();
        matches!(arg, b"help" | b"--help" | b"completions")
            || (arg.len() > 1 && arg[0] == b'-' && arg[1] != b'-' && arg.contains(&b'h'))
    });
    MAY_SHOW.store(asked || none, Ordering::Relaxed);
}

/// `text()`, or nothing where no help is shown in this run.
pub(crate) fn when_shown(text: impl FnOnce() -> String) -> String {
    match MAY_SHOW.load(Ordering::Relaxed) {
        true => text(),
        false => String::new(),
    }
}

/// The top level's first line (`-h`).
pub(crate) const ABOUT: &str =
    "Run commands under exclusive or shared locks, held in lock files or in a lock store.";

/// The top level's description (`--help`).
pub(crate) const LONG_ABOUT: &str = "\
Run commands under exclusive or shared locks held in lock files (the default, no server) or in \
one of the stores below, or a quorum of them; hand locks between processes; show who holds \
them; benchmark a store. Locks taken here and by the programs each store is shared with \
exclude each other.";

/// Examples of `-h` and `--help`: they run as written, and harm nothing if copied (`./job`
/// stands for the user's own command).
const EXAMPLES: &str = "\
Examples:
  xtr-lock run nightly-report ./job           wait for the lock, run ./job, release it
  xtr-lock run -n cron:report -c 'echo hi'    skip (exit 1) if it is held";

/// More examples, for `--help`.
const MORE_EXAMPLES: &str = "
  xtr-lock run -w 30 --store redis://cache:6379 invoice:42 -- sleep 5
  KEY=$(xtr-lock acquire --store redis://cache:6379 job:7); echo \"$KEY\" | xtr-lock release
  xtr-lock status nightly-report && echo running
  xtr-lock bench --store flock --clients 8";

/// What the top level's `-h` shows after the options.
pub(crate) fn top_short() -> String {
    format!(
        "{EXAMPLES}\n\nStores in this build: {}. `xtr-lock --help`: the stores, more \
         examples, the exit codes.",
        built_names()
    )
}

/// What the top level's `--help` shows after the options.
pub(crate) fn top_long() -> String {
    format!(
        "Stores (--store DSN, $XTR_LOCK_STORE or a configuration entry; several DSNs: a \
         quorum):\n{}\n\n{EXAMPLES}{MORE_EXAMPLES}\n\n{}",
        table(),
        crate::exit::TABLE
    )
}

/// The stores, one line each (`  example   summary`), the other schemes that name one on the
/// line below, and those this build lacks marked with the feature that adds them.
pub(crate) fn table() -> String {
    let kinds: Vec<StoreKind> = StoreFactory::kinds().collect();
    let width = kinds.iter().map(|k| k.example.len()).max().unwrap_or(0) + 2;
    let mut out = String::new();
    for kind in &kinds {
        let summary = if kind.built {
            kind.summary.to_owned()
        } else {
            format!("not in this build (feature `{}`)", kind.feature)
        };
        let _ = writeln!(out, "  {:width$}{summary}", kind.example);
        let also = other_names(kind);
        if kind.built && !also.is_empty() {
            let mut line = format!("  {:width$}also", "");
            for (i, name) in also.iter().enumerate() {
                let piece = if i + 1 < also.len() {
                    format!(" {name},")
                } else {
                    format!(" {name}")
                };
                if line.len() + piece.len() > LINE {
                    let _ = writeln!(out, "{line}");
                    line = format!("  {:width$}    ", "");
                }
                line.push_str(&piece);
            }
            let _ = writeln!(out, "{line}");
        }
    }
    out.trim_end().to_owned()
}

/// The longest line the table writes: clap wraps at 100 columns without a terminal.
const LINE: usize = 96;

/// The schemes and keywords of `kind` that its example does not show.
fn other_names(kind: &StoreKind) -> Vec<String> {
    let shown = kind
        .example
        .split_once(':')
        .map_or(kind.example, |(s, _)| s);
    let schemes = kind
        .schemes
        .iter()
        .filter(|s| **s != shown)
        .map(|s| format!("{s}:"));
    let keywords = kind
        .keywords
        .iter()
        .filter(|k| **k != shown)
        .map(|k| (*k).to_owned());
    schemes.chain(keywords).collect()
}

/// `--store`'s long help: where the store comes from, and every store's example DSN.
pub(crate) fn store_long() -> String {
    let examples: Vec<String> = StoreFactory::kinds()
        .map(|k| match k.built {
            true => k.example.to_owned(),
            false => format!("{} (not in this build: feature `{}`)", k.example, k.feature),
        })
        .collect();
    format!(
        "Where locks live, as a DSN: {}. `xtr-lock --help` says what each is.\n\n\
         Repeated, or several separated by commas: a quorum (strict majority) over those \
         stores. Without --store: --config, then $XTR_LOCK_STORE (also a comma-separated list), \
         then $XTR_LOCK_CONFIG, then flock.",
        examples.join(", ")
    )
}

/// The stores of this build by name, the default first: `flock (the default), redis, …`.
fn built_names() -> String {
    let names: Vec<String> = StoreFactory::kinds()
        .filter(|k| k.built)
        .map(|k| match k.name {
            "flock" => "flock (the default)".to_owned(),
            name => name.to_owned(),
        })
        .collect();
    names.join(", ")
}

/// The stores of this build that give fencing tokens, by name.
pub(crate) fn fencing_names() -> String {
    let names: Vec<&str> = StoreFactory::kinds()
        .filter(|k| k.built && k.fencing != Fencing::None)
        .map(|k| k.name)
        .collect();
    names.join(", ")
}

/// The stores in this build with counting semaphores (`--limit N`).
pub(crate) fn counting_names() -> String {
    let names: Vec<&str> = StoreFactory::kinds()
        .filter(|k| k.built && k.counting)
        .map(|k| k.name)
        .collect();
    names.join(", ")
}

/// `run --help`'s examples.
pub(crate) const RUN_EXAMPLES: &str = "\
Examples:
  xtr-lock run backup ./job                   wait as long as it takes (flock(1) style)
  xtr-lock run -n backup ./job                skip if held: exit 1 (cron)
  xtr-lock run -w 30 -E 0 backup ./job        wait 30 s at most, then skip quietly
  xtr-lock run -s report -c 'echo reading'    readers together, writers alone
  xtr-lock run --store redis://cache:6379 --ttl 2m deploy -- sleep 5
  xtr-lock run --limit 4 api ./export         at most 4 of these at once
  xtr-lock run -n -E 0 --min-hold 55m --max-hold 50m --store redis://cache:6379 hourly ./job
                                              an hourly cron job on many machines: once an hour
  xtr-lock run --on-conflict queue-one sync ./job   at most one run waiting behind this one
  xtr-lock run --on-conflict replace -w 1m deploy ./job   stop the running one, then run
  XTR_LOCK_STORE=redis://a:6379,redis://b:6379,redis://c:6379 xtr-lock run job ./job
  xtr-lock run -v --json job ./job 2>events.jsonl   what happened, as JSON lines on stderr";

/// `run -h`'s examples and where the rest is.
pub(crate) const RUN_SHORT: &str = "\
Examples:
  xtr-lock run backup ./job                   wait for the lock, run ./job, release it
  xtr-lock run -n backup -c 'echo hi'         skip if held: exit 1 (cron)
`xtr-lock run --help`: every option, the stores, the command's environment, exit codes.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_texts_are_made_where_help_may_be_shown_only() {
        let cases: &[(&[&str], bool)] = &[
            (&[], true),
            (&["--help"], true),
            (&["run", "-h"], true),
            (&["run", "-nh", "r", "true"], true),
            (&["help", "run"], true),
            (&["completions", "bash"], true),
            (
                &["run", "-n", "--store", "flock:///tmp", "r", "--", "true"],
                false,
            ),
            (&["run", "r", "-c", "echo hi"], false),
        ];
        for (args, shown) in cases {
            make_texts_only_if_asked(*args);
            assert_eq!(MAY_SHOW.load(Ordering::Relaxed), *shown, "{args:?}");
            assert_eq!(when_shown(|| "x".into()).is_empty(), !shown);
        }
        MAY_SHOW.store(true, Ordering::Relaxed);
    }
}
