//! Critical sections checked across tasks and processes: whoever enters a resource's section
//! creates its marker file with `O_EXCL` (finding one is two holders at once, as in the peers'
//! mixed contention) and appends its fencing token to the resource's log while inside, so the
//! log is in section order whichever process wrote it; the tokens must strictly increase.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The markers and token logs of a test's resources, in one directory every process shares.
#[derive(Clone, Debug)]
pub(crate) struct Sections {
    dir: PathBuf,
}

/// Inside a resource's section until [`leave`](Section::leave) (which must come before the
/// release; a panic leaves the marker, which fails the test anyway).
#[must_use = "a section is left explicitly, before the release"]
pub(crate) struct Section {
    marker: PathBuf,
}

impl Sections {
    /// Sections whose markers and logs live in `dir` (created by the caller, shared).
    pub(crate) fn new(dir: &Path) -> Sections {
        Sections {
            dir: dir.to_owned(),
        }
    }

    fn file(&self, resource: &str, what: &str) -> PathBuf {
        let safe: String = resource
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        self.dir.join(format!("{safe}.{what}"))
    }

    /// Enters `resource`'s section as `who` with the holder's fencing token.
    ///
    /// # Panics
    ///
    /// When someone is inside already: two holders at once.
    pub(crate) fn enter(&self, resource: &str, token: u64, who: &str) -> Section {
        let marker = self.file(resource, "inside");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker)
            .unwrap_or_else(|e| {
                let other = std::fs::read_to_string(&marker).unwrap_or_default();
                panic!("{who} entered {resource:?} while {other} was inside: {e}")
            });
        write!(file, "{who}").unwrap();
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.file(resource, "tokens"))
            .unwrap();
        writeln!(log, "{token} {who}").unwrap();
        Section { marker }
    }

    /// The tokens of `resource`'s sections, in section order, with who held them.
    pub(crate) fn tokens(&self, resource: &str) -> Vec<(u64, String)> {
        std::fs::read_to_string(self.file(resource, "tokens"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let (token, who) = l.split_once(' ').unwrap();
                (token.parse().unwrap(), who.to_owned())
            })
            .collect()
    }

    /// The number of sections of `resource`, after checking that its fencing tokens strictly
    /// increased from one section to the next.
    ///
    /// # Panics
    ///
    /// When a token did not exceed the one before it.
    pub(crate) fn check_tokens(&self, resource: &str) -> usize {
        let tokens = self.tokens(resource);
        for pair in tokens.windows(2) {
            assert!(
                pair[1].0 > pair[0].0,
                "{resource:?}: token {:?} after {:?}",
                pair[1],
                pair[0]
            );
        }
        tokens.len()
    }
}

impl Section {
    /// Leaves the section (before releasing the lock).
    pub(crate) fn leave(self) {
        std::fs::remove_file(&self.marker).unwrap();
    }
}
