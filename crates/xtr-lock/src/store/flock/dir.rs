//! The lock directory: Python's default (`<tempdir>/xtr-lock-<uid>`) and the checks on it.

use std::ffi::OsString;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};

const PRIVATE: u32 = 0o700;

/// The system temporary directory as Python's `tempfile.gettempdir()` finds it: the first of
/// `$TMPDIR`, `$TEMP`, `$TMP`, `/tmp`, `/var/tmp`, `/usr/tmp` and the working directory in which a
/// file can be created, written and removed. Found once per process, like Python.
pub(crate) fn python_tempdir() -> &'static Path {
    static TEMPDIR: OnceLock<PathBuf> = OnceLock::new();
    TEMPDIR.get_or_init(|| {
        let mut candidates: Vec<PathBuf> = ["TMPDIR", "TEMP", "TMP"]
            .iter()
            .filter_map(std::env::var_os)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .collect();
        candidates.extend(["/tmp", "/var/tmp", "/usr/tmp"].map(PathBuf::from));
        if let Ok(cwd) = std::env::current_dir() {
            candidates.push(cwd);
        }
        for candidate in candidates {
            let dir = absolute_lexical(&candidate);
            if is_usable(&dir) {
                return dir;
            }
        }
        // Python raises here; a lock store with nowhere to go cannot do better than /tmp, and
        // opening the directory will then report the real error.
        PathBuf::from("/tmp")
    })
}

/// Absolute and lexically normalised, symlinks not resolved (Python's `os.path.abspath`).
pub(crate) fn absolute_lexical(path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(path)
    };
    let mut out = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::Normal(c) => out.push(c),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

fn is_usable(dir: &Path) -> bool {
    let mut name = OsString::from("xtr-lock-probe-");
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return false;
    }
    name.push(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let probe = dir.join(name);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&probe)
        .and_then(|mut f| f.write_all(b"blat"));
    let removed = fs::remove_file(&probe);
    written.is_ok() && removed.is_ok()
}

/// The default directory, `<tempdir>/xtr-lock-<real uid>`, made private (0700) and checked.
pub(crate) fn default_dir() -> Result<PathBuf> {
    let uid = rustix::process::getuid().as_raw();
    let dir = python_tempdir().join(format!("xtr-lock-{uid}"));
    let private_error = |e: std::io::Error| {
        invalid(format!(
            "the flock store directory {} cannot be made private: {e}",
            shown(&dir)
        ))
    };
    match DirBuilder::new().mode(PRIVATE).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(private_error(e)),
    }
    let meta = fs::symlink_metadata(&dir).map_err(private_error)?;
    check_owned_dir(&dir, &meta, uid)?;
    if meta.mode() & 0o7777 != PRIVATE {
        // Python peers re-chmod it on every construction anyway: keeping the rule costs nothing.
        fs::set_permissions(&dir, fs::Permissions::from_mode(PRIVATE)).map_err(private_error)?;
    }
    Ok(dir)
}

/// An explicit directory: created (0700) when missing, then checked as OpenSSH checks the
/// directories its keys live in, so locks can be shared between users without anyone being able
/// to swap the lock files under them: the directory and each of its parents must be real
/// directories (no symlink for the directory itself) owned by this user or by root, and none may
/// be writable by every user unless it is sticky (`/tmp`). The directory must be writable. An
/// existing directory's mode is left alone, so its owner may open it to a group to share locks.
/// Returned absolute: a relative path is resolved once, here, not against each later working
/// directory.
pub(crate) fn explicit_dir(path: &Path) -> Result<PathBuf> {
    let uid = rustix::process::getuid().as_raw();
    let dir = absolute_lexical(path);
    if !dir.is_dir() {
        let _ = DirBuilder::new().recursive(true).mode(PRIVATE).create(&dir);
        if !dir.is_dir() {
            return Err(invalid(format!(
                "the flock store directory {} does not exist and cannot be created",
                shown(&dir)
            )));
        }
        let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(PRIVATE));
    }
    // Checked also when we just created it: a race could have put something else there.
    let meta = fs::symlink_metadata(&dir).map_err(|e| {
        invalid(format!(
            "the flock store directory {} cannot be read: {e}",
            shown(&dir)
        ))
    })?;
    if !meta.file_type().is_dir() {
        return Err(refused(&dir, "it is a symbolic link, not a directory"));
    }
    check_shared_dir(&dir, &dir, &meta, uid)?;
    for parent in dir.ancestors().skip(1) {
        // Parents are followed as the kernel follows them; a parent we cannot read is checked
        // by the kernel when the lock files are opened.
        if let Ok(meta) = fs::metadata(parent) {
            check_shared_dir(&dir, parent, &meta, uid)?;
        }
    }
    if rustix::fs::access(&dir, rustix::fs::Access::WRITE_OK).is_err() {
        return Err(invalid(format!(
            "the flock store directory {} is not writable",
            shown(&dir)
        )));
    }
    Ok(dir)
}

/// The rules one directory on the way to the lock files must meet (see [`explicit_dir`]).
fn check_shared_dir(dir: &Path, at: &Path, meta: &fs::Metadata, uid: u32) -> Result<()> {
    let whose = if at == dir {
        "it".to_owned()
    } else {
        format!("its parent {}", shown(at))
    };
    let owner = meta.uid();
    if owner != uid && owner != 0 {
        return Err(refused(
            dir,
            &format!(
                "{whose} belongs to user {owner}, neither this user ({uid}) nor root, who \
                 could replace its lock files"
            ),
        ));
    }
    let mode = meta.mode();
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(refused(
            dir,
            &format!(
                "{whose} is writable by every user and not sticky (mode {:o}), so anyone could \
                 replace its lock files; chmod o-w or chmod +t it",
                mode & 0o7777
            ),
        ));
    }
    Ok(())
}

fn refused(dir: &Path, why: &str) -> Error {
    invalid(format!(
        "refusing the flock store directory {}: {why}",
        shown(dir)
    ))
}

fn check_owned_dir(dir: &Path, meta: &fs::Metadata, uid: u32) -> Result<()> {
    if !meta.file_type().is_dir() || meta.uid() != uid {
        return Err(invalid(format!(
            "refusing the flock store directory {}: it is not a directory of this user",
            shown(dir)
        )));
    }
    Ok(())
}

fn invalid(reason: String) -> Error {
    Error::invalid_argument(reason)
}

/// A path in a message: quoted, escaped, one line.
pub(crate) fn shown(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_normalisation_does_not_resolve_symlinks() {
        assert_eq!(
            absolute_lexical(Path::new("/a/b/../c/./")),
            PathBuf::from("/a/c")
        );
        assert_eq!(absolute_lexical(Path::new("/../..")), PathBuf::from("/"));
        let rel = absolute_lexical(Path::new("x/y"));
        assert!(rel.is_absolute() && rel.ends_with("x/y"));
    }

    #[test]
    fn the_tempdir_is_usable_and_absolute() {
        let t = python_tempdir();
        assert!(t.is_absolute());
        assert!(t.is_dir());
    }
}
