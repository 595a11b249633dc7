//! The help: `-h` short enough to read at a glance, `--help` complete and true (every store of
//! this build named, the ones it lacks marked), examples safe to copy.

use crate::common::xtr;

/// The help text `args` print, at clap's default width (100 columns, as without a terminal).
fn help(args: &[&str]) -> String {
    let out = xtr().args(args).env("COLUMNS", "100").output().unwrap();
    assert!(out.status.success(), "{args:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The names in the "Commands:" list of `text` (`help` aside).
fn subcommands(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect()
}

/// Every command line whose help is shown: the top level, each subcommand, theirs.
fn every_command() -> Vec<Vec<String>> {
    let mut all = vec![vec![]];
    let mut at = 0;
    while at < all.len() {
        let path = all[at].clone();
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("-h");
        for name in subcommands(&help(&args)) {
            let mut more = path.clone();
            more.push(name);
            all.push(more);
        }
        at += 1;
    }
    all
}

#[test]
fn short_help_fits_on_a_screen_for_every_command() {
    let commands = every_command();
    assert!(commands.len() >= 12, "{commands:?}");
    for path in commands {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("-h");
        let text = help(&args);
        let lines = text.lines().count();
        assert!(
            lines <= 30,
            "`xtr-lock {}` is {lines} lines:\n{text}",
            args.join(" ")
        );
        let long = help(&[&args[..args.len() - 1], &["--help"]].concat());
        assert!(long.lines().count() >= lines, "{args:?}");
    }
}

#[test]
fn help_lists_every_store_of_this_build_from_the_scheme_table() {
    let top = help(&["--help"]);
    let run = help(&["run", "--help"]);
    for kind in xtr_lock::StoreFactory::kinds() {
        assert!(top.contains(kind.example), "{}:\n{top}", kind.example);
        if !kind.built {
            let marked = format!("not in this build (feature `{}`)", kind.feature);
            assert!(top.contains(&marked), "{} unmarked:\n{top}", kind.name);
            continue;
        }
        assert!(top.contains(kind.summary), "{}:\n{top}", kind.name);
        assert!(
            run.contains(kind.example),
            "--store of run: {}",
            kind.example
        );
        for scheme in kind.schemes {
            assert!(top.contains(&format!("{scheme}:")), "{scheme}:\n{top}");
        }
        for keyword in kind.keywords {
            assert!(top.contains(keyword), "{keyword}:\n{top}");
        }
    }
    let short = help(&["-h"]);
    let built: Vec<&str> = xtr_lock::StoreFactory::kinds()
        .filter(|k| k.built)
        .map(|k| k.name)
        .collect();
    for name in built {
        assert!(short.contains(name), "-h lacks {name}:\n{short}");
    }
}

/// What help says of the ttl is what the commands do: 5m (the library's default) unless told,
/// `none` accepted, and no claim that `acquire` renews its lock.
#[test]
fn help_tells_the_ttl_as_it_is() {
    let default = humantime::format_duration(xtr_lock::DEFAULT_TTL).to_string();
    for args in [
        ["run", "--help"],
        ["acquire", "--help"],
        ["refresh", "--help"],
    ] {
        let text = help(&args);
        assert!(
            text.contains(&format!("default {default}"))
                || text.contains(&format!("{default} by default")),
            "{args:?} does not say the default ttl is {default}:\n{text}"
        );
    }
    let acquire = help(&["acquire", "--help"]);
    assert!(acquire.contains("The lock is not renewed"), "{acquire}");
    assert!(
        !acquire.contains("renewed while the command runs"),
        "{acquire}"
    );
    for (args, word) in [(["run", "--help"], "none"), (["run", "--help"], "forever")] {
        assert!(help(&args).contains(word), "{args:?} lacks {word}");
    }
}

/// Every help text, short and long, of every command: no example that destroys anything if
/// pasted into a shell.
#[test]
fn examples_are_safe_to_copy() {
    // Commands that destroy whatever they are given, as words of a shell line.
    const COMMANDS: &[&str] = &[
        "rm", "rmdir", "mkfs", "dd", "shred", "truncate", "wipefs", "shutdown", "reboot", "kill",
        "pkill", "killall",
    ];
    // And what makes a harmless command destructive.
    const PIECES: &[&str] = &[
        "-delete",
        "find /",
        "> /dev/",
        "> /etc",
        "mv /",
        "chmod -r",
        "chown -r",
        "drop table",
        "delete from",
        ":(){",
    ];
    for path in every_command() {
        for flag in ["-h", "--help"] {
            let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
            args.push(flag);
            let text = help(&args).to_lowercase();
            let words = text.split(|c: char| c.is_whitespace() || ";|&()'\"`$".contains(c));
            for word in words {
                assert!(
                    !COMMANDS.contains(&word),
                    "`xtr-lock {}` shows {word:?}:\n{text}",
                    args.join(" ")
                );
            }
            for bad in PIECES {
                assert!(
                    !text.contains(bad),
                    "`xtr-lock {}` shows {bad:?}:\n{text}",
                    args.join(" ")
                );
            }
        }
    }
}
