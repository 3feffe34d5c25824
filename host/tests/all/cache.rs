//! The compiled-component cache: a component is compiled once per host and read back by content hash; a
//! damaged entry is compiled again, never trusted; what no version needs is collected.

use std::collections::BTreeSet;
use voicehost::content::Digest;
use voicehost::sandbox::Sandbox;
use voicehost_testkit::guest;

fn fresh_dir(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_component_is_compiled_once_then_read_back_from_the_cache() {
    let dir = fresh_dir("cache-once");
    let sandbox = Sandbox::new().unwrap().with_cache(&dir);
    let wasm = guest("conformance");
    assert!(!sandbox.load(&wasm).unwrap().from_cache());
    assert!(sandbox.load(&wasm).unwrap().from_cache());
    // Another component is another entry.
    assert!(!sandbox.load(&guest("panicker")).unwrap().from_cache());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
}

#[test]
fn a_damaged_cache_entry_is_compiled_again() {
    let dir = fresh_dir("cache-damaged");
    let sandbox = Sandbox::new().unwrap().with_cache(&dir);
    let wasm = guest("conformance");
    sandbox.load(&wasm).unwrap();
    let entry = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&entry, b"not a compiled component").unwrap();
    let code = sandbox.load(&wasm).unwrap();
    assert!(!code.from_cache());
    assert!(
        sandbox.load(&wasm).unwrap().from_cache(),
        "the entry was not rewritten"
    );
}

#[test]
fn collecting_keeps_only_the_compiled_forms_of_components_in_use() {
    let dir = fresh_dir("cache-collect");
    let sandbox = Sandbox::new().unwrap().with_cache(&dir);
    let (kept, dropped) = (guest("conformance"), guest("panicker"));
    sandbox.load(&kept).unwrap();
    sandbox.load(&dropped).unwrap();
    // What an older host compiled under other settings, and a stray file.
    let digest = Digest::of(&kept);
    std::fs::write(
        dir.join(format!("{}-0000000000000000.cwasm", digest.hex())),
        b"old",
    )
    .unwrap();
    std::fs::write(dir.join("notes.txt"), b"stray").unwrap();

    let removed = sandbox
        .collect_cache(&BTreeSet::from([digest.clone()]))
        .unwrap();
    assert_eq!(removed, 3);
    assert!(sandbox.load(&kept).unwrap().from_cache());
    assert!(!sandbox.load(&dropped).unwrap().from_cache());

    sandbox.forget(&Digest::of(&dropped));
    sandbox.forget(&digest);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}
