//! Lock file names, shared with Python xtr-lock 4.1.0 (and, with the `sf.` prefix, Symfony).

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

/// The prefix Python xtr-lock uses.
pub(crate) const XTR_PREFIX: &str = "xtr.";

/// How many characters of the readable part are kept.
const READABLE_CHARS: usize = 50;

/// How much of the digest a file name carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Digest {
    /// 7 characters (42 bits), the Python peer's and Symfony's names.
    Short,
    /// All 43 characters (256 bits): no two resources share a file, but the names are this
    /// library's only.
    Long,
}

/// `<prefix><readable>.<digest>.lock`:
/// - readable: every maximal run of code points outside `[A-Za-z0-9._-]` becomes one `-`, then
///   the first 50 characters are kept (fold first, cut second);
/// - digest: standard base64 of SHA-256 of the whole resource, `/` → `_`, its first 7
///   characters ([`Digest::Short`]) or all 43 without the padding ([`Digest::Long`]).
pub(crate) fn file_name(prefix: &str, resource: &str, digest: Digest) -> String {
    let mut readable = folded(resource);
    // ASCII only, so characters are bytes.
    readable.truncate(READABLE_CHARS);
    let sum = Sha256::digest(resource.as_bytes());
    let encoded = base64::engine::general_purpose::STANDARD.encode(sum);
    let chars = match digest {
        Digest::Short => 7,
        Digest::Long => 43,
    };
    let digest = encoded[..chars].replace('/', "_");
    format!("{prefix}{readable}.{digest}.lock")
}

/// The readable part of a name: every maximal run of code points outside `[A-Za-z0-9._-]`
/// becomes one `-` (the whole of it: the caller cuts).
pub(crate) fn folded(resource: &str) -> String {
    let mut readable = String::with_capacity(resource.len().min(64));
    let mut in_run = false;
    for c in resource.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            readable.push(c);
            in_run = false;
        } else if !in_run {
            readable.push('-');
            in_run = true;
        }
    }
    readable
}

/// Whether a lock file whose readable part is `readable` may be the file of a resource
/// starting with `prefix` (the readable part of a resource starts with its prefix's, cut where
/// file names cut it).
pub(crate) fn may_start_with(readable: &str, prefix: &str) -> bool {
    let mut want = folded(prefix);
    want.truncate(READABLE_CHARS);
    readable.starts_with(&want)
}

/// The most a semaphore's name may take of a file name (255 bytes, less `.999.lock`).
pub(crate) const MAX_SEMAPHORE_NAME: usize = 246;

/// Slot `number` of semaphore `name`: portalocker's `{name}.{number:02d}.lock`.
pub(crate) fn slot_name(name: &str, number: u32) -> String {
    format!("{name}.{number:02}.lock")
}

/// The companion file holding the limit our clients use for semaphore `name`.
pub(crate) fn limit_name(name: &str) -> String {
    format!("{name}.limit")
}

/// The wake channel of semaphore `name`: one for all its slots. A `/` never starts a file
/// name, so it never meets a lock file's channel.
pub(crate) fn semaphore_channel(name: &str) -> String {
    format!("/{name}")
}

/// The channel of the semaphore whose slot file is `file`, when it looks like one (`.NN.lock`
/// or `.NNN.lock`: a lock file's digest has 7 or 43 characters).
pub(crate) fn slot_channel(file: &str) -> Option<String> {
    let stem = file.strip_suffix(".lock")?;
    let (name, number) = stem.rsplit_once('.')?;
    let digits = (2..=3).contains(&number.len()) && number.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| semaphore_channel(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names produced by the Python peer's own `file_for` for these resources.
    #[test]
    fn python_vectors() {
        let x80 = "x".repeat(80);
        let a49 = format!("{}éb", "a".repeat(49));
        let cases: Vec<(&str, String)> = vec![
            ("reports:nightly", "xtr.reports-nightly.4JXv6FB.lock".into()),
            ("", "xtr..47DEQpj.lock".into()),
            ("a/b/../c", "xtr.a-b-..-c.9cmlgf_.lock".into()),
            ("héllo wörld", "xtr.h-llo-w-rld.oQA_fQS.lock".into()),
            (&x80, format!("xtr.{}.2SnN7qf.lock", "x".repeat(50))),
            ("invoice:42", "xtr.invoice-42.XNI+szs.lock".into()),
            ("ÄÖÜ", "xtr.-.Hsyq8MT.lock".into()),
            ("..", "xtr....XsH35wD.lock".into()),
            ("a  b\t\nc", "xtr.a-b-c.NHuQvP9.lock".into()),
            ("\u{212A}elvin-\u{0131}", "xtr.-elvin--.H7rbeR8.lock".into()),
            ("emoji🔒lock", "xtr.emoji-lock.OGo8fMa.lock".into()),
            (
                "<?py echo \"% hello word ! %\" ?>",
                "xtr.-py-echo-hello-word-.nX7LFGo.lock".into(),
            ),
            (&a49, format!("xtr.{}-.q9XxmLH.lock", "a".repeat(49))),
            ("/", "xtr.-.il7asoJ.lock".into()),
            ("UPPER_lower-1.2", "xtr.UPPER_lower-1.2.vMVyhvP.lock".into()),
            ("res1", "xtr.res1.DkBbmGn.lock".into()),
            ("ключ", "xtr.-.HeNqMq9.lock".into()),
        ];
        for (resource, want) in cases {
            assert_eq!(
                file_name(XTR_PREFIX, resource, Digest::Short),
                want,
                "{resource:?}"
            );
        }
    }

    /// Long names carry the whole digest; the short name's digest is its beginning.
    #[test]
    fn long_names_carry_the_whole_digest() {
        let long = file_name(XTR_PREFIX, "reports:nightly", Digest::Long);
        assert_eq!(
            long.len(),
            "xtr.reports-nightly.".len() + 43 + ".lock".len()
        );
        assert!(long.starts_with("xtr.reports-nightly.4JXv6FB"), "{long}");
        assert!(!long.contains('/') && !long.contains('='), "{long}");
    }

    /// The Symfony vectors: same formula, prefix `sf.`.
    #[test]
    fn symfony_vectors() {
        for (resource, want) in [
            ("res1", "sf.res1.DkBbmGn.lock"),
            ("invoice:29685295", "sf.invoice-29685295.MB4w6xN.lock"),
            ("invoice:32060020", "sf.invoice-32060020.RkHKaGz.lock"),
            ("my/resource name:1", "sf.my-resource-name-1.YZNL6Yt.lock"),
            ("", "sf..47DEQpj.lock"),
            ("ключ", "sf.-.HeNqMq9.lock"),
        ] {
            assert_eq!(
                file_name("sf.", resource, Digest::Short),
                want,
                "{resource:?}"
            );
        }
    }

    #[test]
    fn slot_files_are_portalockers_and_find_their_channel() {
        assert_eq!(slot_name("exports", 0), "exports.00.lock");
        assert_eq!(slot_name("exports", 123), "exports.123.lock");
        assert_eq!(slot_channel("exports.07.lock").as_deref(), Some("/exports"));
        assert_eq!(slot_channel("a.b.999.lock").as_deref(), Some("/a.b"));
        assert_eq!(slot_channel("xtr.res1.DkBbmGn.lock"), None);
        assert_eq!(slot_channel("exports.limit"), None);
        assert_eq!(slot_channel("exports.1.lock"), None);
    }

    #[test]
    fn names_are_short_ascii_and_never_a_path() {
        for resource in [
            "",
            "..",
            "/",
            "nul\0byte",
            &"é".repeat(10_000),
            "../../etc/passwd",
        ] {
            let name = file_name(XTR_PREFIX, resource, Digest::Short);
            assert!(name.len() <= 67, "{name}");
            assert!(name.is_ascii());
            assert!(!name.contains('/') && !name.contains('\0'), "{name}");
            assert!(name != "." && name != "..");
        }
    }
}
