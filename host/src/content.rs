//! Content addresses and files written whole: what the registry's store, the compiled cache and uploads
//! share (uploads are received into a [`Spool`], never held in memory). A leaf: it imports nothing of the
//! host's.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// A new file only its owner may read or write (0600), truncated if it exists: what the host keeps is
/// its tenants' code, which other users of the machine have no business reading.
pub fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Makes `dir` (and its missing parents) only its owner may enter (0700), and narrows it to that if it
/// was there already, open to others: the host's own directories hold its tenants' code. A directory of
/// another user's, or a sticky one (`/tmp`), keeps the mode it has.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    // A directory others share on purpose (sticky, as `/tmp` is) keeps its mode.
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 == 0 || mode & 0o1000 != 0 {
        return Ok(());
    }
    match std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)) {
        Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => Ok(()),
        done => done,
    }
}

/// Writes next to the final name, flushes to disk, renames, then flushes the directory: a reader sees the
/// whole file or none, even after a crash, and the new name survives one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let partial = path.with_extension(format!("{PARTIAL}{}", std::process::id()));
    let mut file = create_private(&partial)?;
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

/// Makes `dir` if it is missing and checks that a file can be written in it: a host that cannot write its
/// data directory (another user's, a read-only mount) says so when it starts, not at its first upload.
pub fn ensure_writable(dir: &Path) -> std::io::Result<()> {
    private_dir(dir)?;
    let probe = TempFile::new_in(dir, "probe");
    create_private(probe.path()).map(drop)
}

/// A file that is deleted when dropped, unless it was renamed away first.
#[derive(Debug)]
pub struct TempFile(PathBuf);

impl TempFile {
    /// A new name in `dir` that [`remove_partials`] knows: `<stem>.partial-<pid>-<n>`.
    pub fn new_in(dir: &Path, stem: &str) -> TempFile {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        TempFile(dir.join(format!("{stem}.{}", partial_suffix(n))))
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A component being received into a file piece by piece, its SHA-256 and size counted as it comes, so
/// that an upload never has to be held in memory. Dropped before [`Spool::finish`] (an upload abandoned,
/// too large, too slow), its file is deleted.
pub struct Spool {
    file: tokio::io::BufWriter<tokio::fs::File>,
    temp: TempFile,
    hasher: Sha256,
    size: u64,
}

impl Spool {
    /// A new, empty file in `dir`.
    pub async fn create(dir: &Path) -> std::io::Result<Spool> {
        let temp = TempFile::new_in(dir, "upload");
        let path = temp.path().to_path_buf();
        let file = tokio::task::spawn_blocking(move || create_private(&path))
            .await
            .map_err(std::io::Error::other)??;
        let file = tokio::fs::File::from_std(file);
        Ok(Spool {
            file: tokio::io::BufWriter::with_capacity(64 << 10, file),
            temp,
            hasher: Sha256::new(),
            size: 0,
        })
    }

    /// Appends `data`.
    pub async fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        self.hasher.update(data);
        self.size += data.len() as u64;
        self.file.write_all(data).await
    }

    /// Bytes written so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The whole component, written out.
    pub async fn finish(mut self) -> std::io::Result<Spooled> {
        use tokio::io::AsyncWriteExt as _;
        self.file.flush().await?;
        Ok(Spooled {
            digest: Digest(format!("sha256:{}", hex(&self.hasher.finalize()))),
            size: self.size,
            temp: self.temp,
        })
    }
}

/// A component received whole into a file ([`Spool`]): its digest and size. The file is deleted when this
/// is dropped, unless [`Spooled::keep_as`] moved it into place.
#[derive(Debug)]
pub struct Spooled {
    temp: TempFile,
    digest: Digest,
    size: u64,
}

impl Spooled {
    /// `bytes` written into a new file in `dir` (blocking): for callers that have the bytes already.
    pub fn from_bytes(dir: &Path, bytes: &[u8]) -> std::io::Result<Spooled> {
        use std::io::Write as _;
        let temp = TempFile::new_in(dir, "upload");
        create_private(temp.path())?.write_all(bytes)?;
        Ok(Spooled {
            temp,
            digest: Digest::of(bytes),
            size: bytes.len() as u64,
        })
    }

    /// Where the file is, until it is kept.
    pub fn path(&self) -> &Path {
        self.temp.path()
    }

    /// The component's content address.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// The component's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Flushes the file to disk (blocking), so that [`Spooled::keep_as`] has little left to do.
    pub fn sync(&self) -> std::io::Result<()> {
        std::fs::File::open(self.path())?.sync_all()
    }

    /// Moves the file to `path` (blocking) as [`write_atomically`] writes one: flushed to disk, renamed
    /// (over a file already there), the directory flushed; copied if `path` is on another file system.
    pub fn keep_as(self, path: &Path) -> std::io::Result<()> {
        self.sync()?;
        match std::fs::rename(self.path(), path) {
            Ok(()) => {}
            // `uploads/` and `components/` on different file systems: copied beside the final name
            // (flushed), then renamed there. Any other failure is the caller's to hear.
            Err(error) if error.kind() == std::io::ErrorKind::CrossesDevices => {
                let copy = TempFile::new_in(path.parent().unwrap_or(Path::new("/")), "copy");
                std::fs::copy(self.path(), copy.path())?;
                std::fs::File::open(copy.path())?.sync_all()?;
                std::fs::rename(copy.path(), path)?;
            }
            Err(error) => return Err(error),
        }
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
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

#[cfg(test)]
mod spool_tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("voicehost-spool-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn files(dir: &Path) -> usize {
        std::fs::read_dir(dir).unwrap().count()
    }

    #[tokio::test]
    async fn a_spooled_component_has_the_digest_and_size_of_its_bytes_and_moves_into_place() {
        let dir = dir("whole");
        let mut spool = Spool::create(&dir).await.unwrap();
        for piece in [&b"\0asm"[..], b"\x0d\0\x01\0", b"rest"] {
            spool.write(piece).await.unwrap();
        }
        assert_eq!(spool.size(), 12);
        let spooled = spool.finish().await.unwrap();
        assert_eq!(*spooled.digest(), Digest::of(b"\0asm\x0d\0\x01\0rest"));
        assert_eq!(spooled.size(), 12);
        let kept = dir.join("kept.wasm");
        spooled.keep_as(&kept).unwrap();
        assert_eq!(std::fs::read(&kept).unwrap(), b"\0asm\x0d\0\x01\0rest");
        assert_eq!(files(&dir), 1, "only the kept file");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_component_moves_into_place_on_another_file_system() {
        use std::os::unix::fs::MetadataExt as _;
        // /dev/shm is a tmpfs on Linux: another file system than the temporary directory's disk.
        let uploads = dir("cross-uploads");
        let components = Path::new("/dev/shm").join(format!("voicehost-{}", std::process::id()));
        std::fs::create_dir_all(&components).unwrap();
        let device = |path: &Path| std::fs::metadata(path).unwrap().dev();
        assert_ne!(
            device(&uploads),
            device(&components),
            "the test needs two file systems"
        );
        let spooled = Spooled::from_bytes(&uploads, b"\0asm component").unwrap();
        let kept = components.join("kept.wasm");
        spooled.keep_as(&kept).unwrap();
        assert_eq!(std::fs::read(&kept).unwrap(), b"\0asm component");
        assert_eq!(files(&uploads), 0, "the upload's file is gone");
        assert_eq!(files(&components), 1, "only the kept file: no copy left");
        let _ = std::fs::remove_dir_all(uploads);
        let _ = std::fs::remove_dir_all(components);
    }

    #[test]
    fn a_directory_that_takes_no_file_is_refused() {
        // A path through a regular file can never be a directory, whoever runs the test (root included).
        let dir = dir("not-a-dir");
        std::fs::write(dir.join("file"), b"").unwrap();
        assert!(ensure_writable(&dir.join("file/compiled")).is_err());
        ensure_writable(&dir.join("made/compiled")).unwrap();
        assert_eq!(files(&dir.join("made/compiled")), 0, "the probe is gone");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn an_abandoned_spool_or_spooled_component_leaves_no_file() {
        let dir = dir("abandoned");
        let mut spool = Spool::create(&dir).await.unwrap();
        spool.write(&[7; 100_000]).await.unwrap();
        assert_eq!(files(&dir), 1);
        drop(spool);
        assert_eq!(files(&dir), 0);
        let spooled = Spooled::from_bytes(&dir, b"bytes").unwrap();
        assert_eq!(files(&dir), 1);
        drop(spooled);
        assert_eq!(files(&dir), 0);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Now, in Unix seconds (0 for a clock before 1970).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
