//! Builds the example agents (`examples/`, a workspace of their own) for wasm32-wasip2, so tests, benches
//! and the demo have real components: their directory is `VOICEHOST_GUESTS` at compile time.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    // Only the Rust agents: the other languages' folders hold their own toolchains (node_modules).
    let rust_agents = [
        "conformance",
        "panicker",
        "looper",
        "hog",
        "recursor",
        "llm",
        "prober",
    ];
    let watched = [
        "guest-sdk",
        "wit",
        "examples/Cargo.toml",
        "examples/Cargo.lock",
    ]
    .into_iter()
    .map(String::from)
    .chain(rust_agents.iter().map(|agent| format!("examples/{agent}")));
    for path in watched {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    let target_dir = root.join("target").join("guests");
    let guests = target_dir.join("wasm32-wasip2").join("release");
    // The fuzzing build (`host/fuzz`, on nightly, which may lack the wasm target) runs no guest.
    if std::env::var_os("CARGO_FEATURE_FUZZING").is_some() {
        println!("cargo:rustc-env=VOICEHOST_GUESTS={}", guests.display());
        return;
    }
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
        .arg(root.join("examples").join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
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
        .expect("cannot run cargo to build the example agents");
    if !status.success() {
        panic!(
            "building the example agents failed; is the target installed? `rustup target add wasm32-wasip2`"
        );
    }
    println!("cargo:rustc-env=VOICEHOST_GUESTS={}", guests.display());
}
