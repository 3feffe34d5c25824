//! Content addresses and files written whole: what the registry's store and the compiled cache share. A
//! leaf: it imports nothing of the host's.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::path::Path;

/// The content address of a component: `sha256:` and 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// The address of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex(&Sha256::digest(bytes))))
    }

    /// Parses an address, refusing anything else (so it is always safe as a file name).
    pub fn parse(text: &str) -> Result<Digest, DigestError> {
        let hex = text.strip_prefix("sha256:").unwrap_or_default();
        if hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Digest(text.to_string()))
        } else {
            Err(DigestError(text.chars().take(80).collect()))
        }
    }

    /// The 64 hex digits alone.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Bytes in lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Text that is not a digest (at most its first 80 characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a component digest: {0:?}")]
pub struct DigestError(String);

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Digest, D::Error> {
        let text = String::deserialize(deserializer)?;
        Digest::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Writes next to the final name, flushes to disk, then renames: a reader sees the whole file or none, even
/// after a crash.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let partial = path.with_extension(format!("partial-{}", std::process::id()));
    let mut file = std::fs::File::create(&partial)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sha256_digest_parses() {
        let good = Digest::of(b"x").to_string();
        assert_eq!(Digest::parse(&good).unwrap().to_string(), good);
        for bad in [
            "",
            "sha256:",
            "sha256:../../etc/passwd",
            "md5:00",
            &good.to_uppercase(),
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }
}
