//! Builds the guest programs for wasm32-wasip2, in the manner of wasmtime's `crates/test-programs`: the
//! wasm workspaces below are compiled by their own cargo into `target/guests` (at the repository's root,
//! where `scripts/build-agents` puts them too), and `$OUT_DIR/programs.rs` names each component's path.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wasm workspaces (relative to the repository's root) and the programs each holds: (crate, what it
/// is). Only Rust crates: the other languages' folders hold their own toolchains (node_modules).
const WORKSPACES: [(&str, &[(&str, &str)]); 2] = [
    (
        "examples",
        &[
            ("conformance", "The example conformance agent."),
            (
                "llm",
                "The example agent that asks a language model over `wasi:http`.",
            ),
        ],
    ),
    (
        "tests/programs/guests",
        &[
            ("panicker", "A test guest: panics on \"panic\"."),
            ("looper", "A test guest: spins forever on \"loop\"."),
            (
                "hog",
                "A test guest: grows its memory until that fails on \"grow\".",
            ),
            (
                "recursor",
                "A test guest: recurses without bound on \"recurse\".",
            ),
            (
                "prober",
                "The pressure scenarios' test guest: audio of its own, floods, big sends.",
            ),
            (
                "legacy",
                "A test guest built against voicehost:agent@0.1.0, the world before 0.2.0.",
            ),
            (
                "previous",
                "A test guest built against voicehost:agent@0.2.0, the world before 0.3.0.",
            ),
            (
                "hoarder",
                "A test guest: makes the host keep `wasi:http` fields, bodies and random bytes for it.",
            ),
        ],
    ),
];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.ancestors().nth(2).unwrap().to_path_buf();
    let target_dir = root.join("target").join("guests");
    let guests = target_dir.join("wasm32-wasip2").join("release");

    for path in ["guest-sdk", "wit", "host/wit-0.1", "host/wit-0.2"] {
        watch(&root.join(path));
    }
    for (workspace, programs) in WORKSPACES {
        let workspace = root.join(workspace);
        watch(&workspace.join("Cargo.toml"));
        watch(&workspace.join("Cargo.lock"));
        for (name, _) in programs {
            watch(&workspace.join(name));
        }
        build(&workspace.join("Cargo.toml"), &target_dir);
    }

    let mut code = String::new();
    let mut all = String::new();
    for (workspace, programs) in WORKSPACES {
        for (name, doc) in programs {
            let path = guests.join(format!("{name}.wasm"));
            let constant = name.to_uppercase();
            let doc = format!("{doc} Its crate: `{workspace}/{name}`.");
            writeln!(code, "#[doc = {doc:?}]").unwrap();
            writeln!(
                code,
                "pub const {constant}: &str = {:?};",
                path.display().to_string()
            )
            .unwrap();
            writeln!(all, "    ({name:?}, {constant}),").unwrap();
        }
    }
    writeln!(
        code,
        "/// Every program: its name (its crate's) and its component's path."
    )
    .unwrap();
    writeln!(code, "pub const ALL: &[(&str, &str)] = &[\n{all}];").unwrap();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("programs.rs");
    std::fs::write(out, code).unwrap();
}

fn watch(path: &Path) {
    println!("cargo:rerun-if-changed={}", path.display());
}

/// `cargo build --release --target wasm32-wasip2` of the workspace `manifest`, into `target_dir`.
fn build(manifest: &Path, target_dir: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target_dir);
    // The outer build's settings are not the guests': a wrapper (clippy), flags and jobs stay outside.
    for (key, _) in std::env::vars() {
        if key.starts_with("CARGO_") && key != "CARGO_HOME"
            || key.starts_with("RUSTC")
            || key.contains("RUSTFLAGS")
        {
            build.env_remove(&key);
        }
    }
    let status = build
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build {}: {e}", manifest.display()));
    if !status.success() {
        panic!(
            "building {} failed; is the target installed? `rustup target add wasm32-wasip2`",
            manifest.display()
        );
    }
}
