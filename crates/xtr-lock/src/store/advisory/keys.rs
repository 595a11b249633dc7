//! What a resource locks: its advisory key (one `bigint`) in PostgreSQL, its lock name in
//! MySQL/MariaDB.

use sha2::{Digest as _, Sha256};

/// How resources map to advisory keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMode {
    /// The default: the first 8 bytes of the SHA-256 of the resource's UTF-8 bytes, read as a
    /// big-endian signed 64-bit integer. A collision between two resources becomes likely only
    /// at about 5×10⁹ distinct resources.
    Sha256,
    /// Symfony's `PostgreSqlStore`: the CRC-32 (IEEE, as PHP's `crc32()`) of the resource,
    /// zero-extended to 64 bits. Shares locks with PHP processes, but the keys come from a
    /// 32-bit space: two resources are likely to collide from about 77,000 distinct resources
    /// on (`invoice:29685295` and `invoice:32060020` do), and colliding resources exclude each
    /// other.
    Crc32,
}

impl KeyMode {
    /// The DSN's spelling (`keys=...`).
    pub fn as_str(self) -> &'static str {
        match self {
            KeyMode::Sha256 => "sha256",
            KeyMode::Crc32 => "crc32",
        }
    }

    /// The advisory key of `resource`.
    pub fn key(self, resource: &str) -> i64 {
        match self {
            KeyMode::Sha256 => {
                let digest = Sha256::digest(resource.as_bytes());
                let mut first = [0u8; 8];
                first.copy_from_slice(&digest[..8]);
                i64::from_be_bytes(first)
            }
            // u32 → i64 zero-extends, as PHP passes the unsigned value.
            KeyMode::Crc32 => i64::from(crc32fast::hash(resource.as_bytes())),
        }
    }
}

/// How `pg_locks` shows a single-`bigint` key: `classid` is the upper 32 bits and `objid` the
/// lower, both as unsigned 32-bit numbers (`oid`), with `objsubid = 1`.
pub(crate) fn pg_locks_ids(key: i64) -> (i64, i64) {
    let bits = key as u64;
    ((bits >> 32) as i64, (bits & 0xFFFF_FFFF) as i64)
}

/// The `GET_LOCK` name of `resource` for a store on `database`: `xtr-lock:` followed by the
/// first 55 lowercase hex digits of the SHA-256 of the database's name, a NUL byte and the
/// resource (64 characters in all, MySQL's limit). In SQL:
/// `CONCAT('xtr-lock:', LEFT(SHA2(CONCAT(database, CHAR(0), resource), 256), 55))`.
///
/// Lock names are server-wide: the database's name keeps two applications on one server apart,
/// as PostgreSQL keeps advisory locks per database. Hashed, because names are limited to 64
/// characters and compared case-insensitively on some servers and not on others, while
/// resources are any string and case-sensitive.
pub(crate) fn getlock_name(database: &str, resource: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(database.as_bytes());
    hasher.update([0u8]);
    hasher.update(resource.as_bytes());
    let digest = hasher.finalize();
    let mut name = String::with_capacity(64);
    name.push_str(GETLOCK_PREFIX);
    for byte in digest {
        name.push_str(&format!("{byte:02x}"));
    }
    name.truncate(64);
    name
}

/// What every `GET_LOCK` name of this library starts with.
pub(crate) const GETLOCK_PREFIX: &str = "xtr-lock:";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_keys_are_symfonys() {
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        for (resource, key) in [
            ("res1", 4_221_736_143),
            ("invoice:29685295", 1_840_419_416),
            ("invoice:32060020", 1_840_419_416),
            ("my/resource name:1", 1_055_571_682),
            ("", 0),
            ("ключ", 212_833_818),
        ] {
            assert_eq!(KeyMode::Crc32.key(resource), key, "{resource:?}");
            assert_eq!(pg_locks_ids(key), (0, key));
        }
    }

    #[test]
    fn sha256_keys_are_the_first_eight_bytes_big_endian() {
        // sha256("res1") = 0e405b9869cefa2c…
        assert_eq!(KeyMode::Sha256.key("res1"), 0x0e40_5b98_69ce_fa2c);
        // sha256("") = e3b0c44298fc1c14…: the sign bit set, a negative key.
        assert_eq!(
            KeyMode::Sha256.key(""),
            i64::from_be_bytes([0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14])
        );
        assert!(KeyMode::Sha256.key("") < 0);
        // sha256("invoice:29685295") = 301e30eb137dfa84…: no crc32 collision here.
        assert_eq!(
            KeyMode::Sha256.key("invoice:29685295"),
            0x301e_30eb_137d_fa84
        );
        assert_ne!(
            KeyMode::Sha256.key("invoice:29685295"),
            KeyMode::Sha256.key("invoice:32060020")
        );
    }

    #[test]
    fn negative_keys_show_their_sign_bits_in_classid() {
        assert_eq!(pg_locks_ids(-2), (4_294_967_295, 4_294_967_294));
    }

    #[test]
    fn getlock_names_fit_mysqls_limit_and_separate_databases() {
        // sha256("app\0res1") = 3890736d9dff…b0, computed independently (Python's hashlib).
        let name = getlock_name("app", "res1");
        assert_eq!(
            name,
            "xtr-lock:3890736d9dff1ae0f6d8468ff204b8a37feb6b84c03f027067f087b"
        );
        assert_eq!(name.len(), 64);
        assert!(name.starts_with("xtr-lock:"));
        assert!(
            name[9..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_ne!(getlock_name("app", "res1"), getlock_name("other", "res1"));
        assert_ne!(
            getlock_name("app", "Invoice"),
            getlock_name("app", "invoice")
        );
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(getlock_name("ab", "c"), getlock_name("a", "bc"));
        assert_eq!(getlock_name("app", &"x".repeat(10_000)).len(), 64);
    }
}
