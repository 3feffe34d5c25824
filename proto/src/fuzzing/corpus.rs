//! Replaying a fuzz target's kept corpus on stable, as `cargo test` does for every target.

use std::path::{Path, PathBuf};

/// Every file of a kept corpus, sorted by path.
pub fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("the fuzz corpus {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let bytes = std::fs::read(&path).expect("a corpus file");
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

/// Runs one input of `target` with `run`; on a panic, says which input and how to reproduce it.
pub fn replay(target: &str, name: &str, bytes: &[u8], run: impl Fn(&[u8])) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(bytes)));
    if let Err(panic) = outcome {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        panic!("{name} breaks a rule (reproduce: scripts/fuzz {target} {name}):\n{message}");
    }
}

/// `bytes` with one to four bytes changed, removed or added, as `rng` picks.
pub fn mutate(bytes: &[u8], rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut mutated = bytes.to_vec();
    for _ in 0..rng.usize(1..=4) {
        match rng.u8(..4) {
            0 if !mutated.is_empty() => {
                let at = rng.usize(..mutated.len());
                mutated[at] = rng.u8(..);
            }
            1 if !mutated.is_empty() => {
                mutated.remove(rng.usize(..mutated.len()));
            }
            2 => {
                let at = rng.usize(..=mutated.len());
                mutated.insert(at, rng.u8(..));
            }
            _ => {
                for _ in 0..rng.usize(..16) {
                    mutated.push(rng.u8(..));
                }
            }
        }
    }
    mutated
}
