//! Nothing silently different from what was asked: `-s` on a store without shared locks, and a
//! ttl asked for (`--ttl`, a configuration file) on a store whose locks end with their holder,
//! each say so in one line on stderr, unless `-q`; where the store does what was asked, or the
//! ttl is the default, nothing is said.

use crate::common::{flock_dsn, xtr};

/// A resource of this test process's own (semaphores are shared by the whole machine).
fn unique(what: &str) -> String {
    format!("cli-warn:{what}:{}", std::process::id())
}

/// The stderr of `run ARGS RESOURCE -- true`, which must succeed.
fn stderr_of_run(args: &[&str], resource: &str) -> String {
    let out = xtr()
        .env_remove("XTR_LOCK_STORE")
        .env_remove("XTR_LOCK_CONFIG")
        .arg("run")
        .args(args)
        .args([resource, "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    stderr
}

/// The warning `-s` gets on a store without shared locks.
fn no_shared(store: &str) -> String {
    format!(
        "xtr-lock: warning: the {store} store has no shared locks; -s takes an exclusive lock\n"
    )
}

/// The warning `--ttl` gets on a store whose locks end with their holder.
fn ttl_unused(store: &str, asked: &str) -> String {
    format!(
        "xtr-lock: warning: the {store} store's locks do not expire: {asked} is not used, the \
         lock ends with its holder\n"
    )
}

#[test]
fn semaphores_say_that_s_is_exclusive_and_a_ttl_unused() {
    let r = unique("sem");
    let sem = ["--store", "semaphore"];
    assert_eq!(
        stderr_of_run(&[&sem[..], &["-s"]].concat(), &r),
        no_shared("semaphore")
    );
    assert_eq!(
        stderr_of_run(&[&sem[..], &["--ttl", "1m"]].concat(), &r),
        ttl_unused("semaphore", "--ttl")
    );
    assert_eq!(
        stderr_of_run(&[&sem[..], &["-s", "--ttl", "1m"]].concat(), &r),
        no_shared("semaphore") + &ttl_unused("semaphore", "--ttl")
    );
    // Quiet when asked to be, when nothing was asked, and when no ttl was asked for.
    assert_eq!(
        stderr_of_run(&[&sem[..], &["-q", "-s", "--ttl", "1m"]].concat(), &r),
        ""
    );
    assert_eq!(stderr_of_run(&sem, &r), "");
    assert_eq!(
        stderr_of_run(&[&sem[..], &["--ttl", "none"]].concat(), &r),
        ""
    );
    // Under --json, a warning event.
    let out = stderr_of_run(&[&sem[..], &["--json", "-s"]].concat(), &r);
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["xtr_lock"], "warning", "{out}");
    assert_eq!(
        first["message"].as_str().unwrap(),
        no_shared("semaphore")
            .trim_start_matches("xtr-lock: warning: ")
            .trim_end()
    );
}

#[test]
fn flock_and_memory_share_and_say_only_that_a_ttl_is_unused() {
    let tmp = tempfile::tempdir().unwrap();
    let flock = flock_dsn(tmp.path());
    assert_eq!(stderr_of_run(&["--store", &flock, "-s"], "r"), "");
    assert_eq!(
        stderr_of_run(&["--store", &flock, "--ttl", "30s"], "r"),
        ttl_unused("flock", "--ttl")
    );
    // A quorum: one line per kind of store, not per member.
    for member in ["b", "c"] {
        std::fs::create_dir(tmp.path().join(member)).unwrap();
    }
    let quorum = format!("{flock},{flock}/b,{flock}/c");
    assert_eq!(
        stderr_of_run(&["--store", &quorum, "--ttl", "30s", "-s"], "r"),
        ttl_unused("flock", "--ttl")
    );
    let memory = ["--store", "in-memory", "-s", "--ttl", "30s"];
    let stderr = stderr_of_run(&memory, "r");
    assert!(!stderr.contains("no shared locks"), "{stderr}");
    assert!(stderr.ends_with(&ttl_unused("memory", "--ttl")), "{stderr}");

    // A configuration file's ttl is asked for too; its absence is the default, said nothing of.
    let file = tmp.path().join("locks.toml");
    std::fs::write(
        &file,
        format!("ttl = \"2m\"\n[stores]\ndefault = \"{flock}\"\n"),
    )
    .unwrap();
    assert_eq!(
        stderr_of_run(&["--config", file.to_str().unwrap()], "r"),
        ttl_unused("flock", "the configuration file's ttl")
    );
    std::fs::write(&file, format!("[stores]\ndefault = \"{flock}\"\n")).unwrap();
    assert_eq!(
        stderr_of_run(&["--config", file.to_str().unwrap()], "r"),
        ""
    );
}

/// `--meta` on a store that keeps no metadata is said not to be kept; the default metadata
/// (host, pid, command) goes unsaid, and a store that keeps it says nothing.
#[test]
fn meta_on_a_store_without_metadata_is_said_not_to_be_kept() {
    let stderr = stderr_of_run(&["--store", "semaphore", "--meta", "role=x"], "meta-sysv");
    assert_eq!(
        stderr.trim(),
        "xtr-lock: warning: the semaphore store keeps no holder metadata: --meta is not kept"
    );
    assert_eq!(stderr_of_run(&["--store", "semaphore"], "meta-sysv"), "");
    let tmp = tempfile::tempdir().unwrap();
    let flock = flock_dsn(tmp.path());
    assert_eq!(
        stderr_of_run(&["--store", &flock, "--meta", "role=x"], "r"),
        ""
    );
}
