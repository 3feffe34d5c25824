//! `voicehost new`, the real binary as an agent author starts: a project made from the example agent of
//! the language, or nothing written and a reason. (That a made project builds and passes `voicehost
//! test` in every language is `host/tests/languages.rs`'s, which has the toolchains.)

use crate::operator::BIN;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

fn new_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("new")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// The repository's root.
fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn a_new_c_agent_is_the_example_with_the_world_its_scenarios_and_a_build_script() {
    let dir = voicehost_testkit::author_dir("new-made", &[]);
    let out = new_in(&dir, &["support-desk", "--lang", "c"]);
    assert!(out.status.success(), "{out:?}");
    let project = dir.join("support-desk");
    assert_eq!(
        std::fs::read(project.join("agent.c")).unwrap(),
        std::fs::read(repo().join("examples/c/agent.c")).unwrap(),
        "the example's own source"
    );
    assert_eq!(
        std::fs::read(project.join("wit/agent.wit")).unwrap(),
        std::fs::read(repo().join("wit/agent.wit")).unwrap()
    );
    let build = std::fs::metadata(project.join("build.sh")).unwrap();
    assert_eq!(build.permissions().mode() & 0o111, 0o111, "build.sh runs");
    assert!(project.join("tests/scenarios.toml").is_file());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(
            "./build.sh && voicehost test --agent target/agent.wasm tests/scenarios.toml"
        ),
        "{stdout}"
    );
}

#[test]
fn a_project_is_never_written_over_and_a_bad_name_is_refused() {
    let dir = voicehost_testkit::author_dir("new-refused", &[]);
    std::fs::create_dir_all(dir.join("desk")).unwrap();
    std::fs::write(dir.join("desk/notes.txt"), "mine").unwrap();
    let out = new_in(&dir, &["desk", "--lang", "python"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exists already"),
        "{out:?}"
    );
    assert_eq!(
        std::fs::read_dir(dir.join("desk")).unwrap().count(),
        1,
        "nothing written"
    );
    for name in ["Desk", "../desk", "test", "voicehost-agent"] {
        let out = new_in(&dir, &[name]);
        assert_eq!(out.status.code(), Some(2), "{name}: {out:?}");
    }
    // Rust's own names are Rust's: a JavaScript agent may be called `test`.
    let out = new_in(&dir, &["test", "--lang", "js"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}
