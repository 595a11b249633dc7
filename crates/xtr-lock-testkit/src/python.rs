//! A Python virtual environment with the real peers from PyPI (`xtr-lock` 4.1.0, portalocker
//! 4.4.2), created once per checkout under `target/xtr-testkit/` and shared by every test
//! process.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The Python peers the interop tests install, pinned.
pub const PEERS: &[&str] = &[
    "xtr-lock[redis]==4.1.0",
    "portalocker[redis]==4.4.2",
    "redis==8.1.0",
];

/// The `python` of a virtual environment holding [`PEERS`], creating it on first use.
///
/// # Panics
///
/// With a message saying what is missing (`python3`, its `venv` module, or PyPI) when the
/// environment cannot be made: a test that needs the peer must fail, not skip.
pub fn python_with_peers() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| match ensure_venv() {
            Ok(python) => python,
            Err(why) => panic!("the Python interop peers are not available: {why}"),
        })
        .clone()
}

fn testkit_dir() -> PathBuf {
    // CARGO_TARGET_DIR if set, else <workspace>/target.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("xtr-testkit")
}

fn ensure_venv() -> Result<PathBuf, String> {
    let dir = testkit_dir();
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let venv = dir.join("py-venv");
    let python = venv.join("bin/python");
    let stamp = venv.join("xtr-testkit-peers.txt");
    let wanted = PEERS.join("\n");
    // Several test processes start at once: one builds, the others wait on this lock.
    let guard = File::create(dir.join("py-venv.lock"))
        .map_err(|e| format!("cannot create the venv lock file: {e}"))?;
    guard
        .lock()
        .map_err(|e| format!("cannot lock the venv lock file: {e}"))?;
    if fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) && python.exists() {
        return Ok(python);
    }
    let _ = fs::remove_dir_all(&venv);
    let python3 = std::env::var("XTR_TESTKIT_PYTHON").unwrap_or_else(|_| "python3".into());
    run(
        Command::new(&python3).args(["-m", "venv"]).arg(&venv),
        &format!("{python3} -m venv (install python3 and python3-venv)"),
    )?;
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(PEERS),
        "pip install of the peers from PyPI",
    )?;
    fs::write(&stamp, wanted).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok(python)
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
