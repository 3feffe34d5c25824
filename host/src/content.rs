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

/// Writes next to the final name, flushes to disk, renames, then flushes the directory: a reader sees the
/// whole file or none, even after a crash, and the new name survives one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let partial = path.with_extension(format!("{PARTIAL}{}", std::process::id()));
    let mut file = std::fs::File::create(&partial)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&partial, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// What the name of a file being written by [`write_atomically`] has in its extension, before the pid.
const PARTIAL: &str = "partial-";

/// The extension of a file this process is writing, the `n`th: one [`remove_partials`] removes if a crash
/// leaves it.
pub fn partial_suffix(n: u64) -> String {
    format!("{PARTIAL}{}-{n}", std::process::id())
}

/// Removes what writes cut short left in `dir` (a process killed between writing and renaming); returns how
/// many. Only for a directory no other writer is using at the time (a store or cache being opened).
pub fn remove_partials(dir: &Path) -> std::io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let partial = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.starts_with(PARTIAL));
        if partial && path.is_file() {
            std::fs::remove_file(&path)?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_killed_write_left_is_removed_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("voicehost-partials-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        write_atomically(&dir.join("index.json"), b"{}").unwrap();
        std::fs::write(dir.join("ab.wasm"), b"kept").unwrap();
        std::fs::write(dir.join("cd.partial-4242"), b"cut short").unwrap();
        std::fs::write(dir.join("index.partial-17"), b"cut short").unwrap();
        assert_eq!(remove_partials(&dir).unwrap(), 2);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["ab.wasm", "index.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
