//! Where agent components are kept: content-addressed by SHA-256, behind [`ComponentStore`] so a shared
//! object store can stand in for the disk later. Tenants, agents and versions (issue 5) build on this.

use sha2::{Digest as _, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};

/// The content address of a component: `sha256:` and 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// The address of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        let hex: String = Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Digest(format!("sha256:{hex}"))
    }

    /// Parses an address, refusing anything else (so it is always safe as a file name).
    pub fn parse(text: &str) -> Result<Digest, StoreError> {
        let hex = text.strip_prefix("sha256:").unwrap_or_default();
        if hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Digest(text.to_string()))
        } else {
            Err(StoreError::BadDigest(text.chars().take(80).collect()))
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

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not a component digest: {0:?}")]
    BadDigest(String),
    #[error("no component {0}")]
    NotFound(Digest),
    /// What is stored no longer hashes to its address.
    #[error("the stored component {0} is damaged")]
    Corrupt(Digest),
    #[error("the component store failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Components by content address.
pub trait ComponentStore: Send + Sync {
    /// Keeps `wasm` and returns its address; keeping the same bytes twice is one copy.
    fn put(&self, wasm: &[u8]) -> Result<Digest, StoreError>;
    /// The bytes at `digest`, checked against it.
    fn get(&self, digest: &Digest) -> Result<Vec<u8>, StoreError>;
}

/// The embedded store: one file per component under a directory, written atomically.
pub struct DiskStore {
    dir: PathBuf,
}

impl DiskStore {
    pub fn new(dir: impl Into<PathBuf>) -> Result<DiskStore, StoreError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(DiskStore { dir })
    }

    fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.wasm", digest.hex()))
    }
}

impl ComponentStore for DiskStore {
    fn put(&self, wasm: &[u8]) -> Result<Digest, StoreError> {
        let digest = Digest::of(wasm);
        let path = self.path(&digest);
        if !path.exists() {
            write_atomically(&path, wasm)?;
        }
        Ok(digest)
    }

    fn get(&self, digest: &Digest) -> Result<Vec<u8>, StoreError> {
        let bytes = match std::fs::read(self.path(digest)) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(digest.clone()))
            }
            Err(error) => return Err(error.into()),
        };
        if Digest::of(&bytes) != *digest {
            return Err(StoreError::Corrupt(digest.clone()));
        }
        Ok(bytes)
    }
}

/// Writes next to the final name, then renames: a reader sees the whole file or none.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let partial = path.with_extension(format!("partial-{}", std::process::id()));
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(name: &str) -> DiskStore {
        let dir =
            std::env::temp_dir().join(format!("voicehost-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        DiskStore::new(dir).unwrap()
    }

    #[test]
    fn a_component_comes_back_by_its_digest_and_is_kept_once() {
        let store = store("roundtrip");
        let digest = store.put(b"\0asm component").unwrap();
        assert_eq!(store.put(b"\0asm component").unwrap(), digest);
        assert_eq!(store.get(&digest).unwrap(), b"\0asm component");
        assert_eq!(std::fs::read_dir(&store.dir).unwrap().count(), 1);
    }

    #[test]
    fn an_unknown_digest_is_not_found_and_a_damaged_file_is_refused() {
        let store = store("damaged");
        let unknown = Digest::of(b"never stored");
        assert!(matches!(store.get(&unknown), Err(StoreError::NotFound(_))));
        let digest = store.put(b"original").unwrap();
        std::fs::write(store.path(&digest), b"tampered").unwrap();
        assert!(matches!(store.get(&digest), Err(StoreError::Corrupt(_))));
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
