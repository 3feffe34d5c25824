//! What voicehost's tests and benches share (as wasmtime's test utilities are a crate of their own): a host
//! serving one agent on the Sent simulator ([`Host`]), `voicehost serve` in-process with two tenants
//! ([`Hosting`]), one raw request to the admin API ([`admin::send`]), so error answers can be checked as
//! they are, a call that does nothing ([`Quiet`]) for driving an instance directly, and the conformance agent as host code ([`NativeConformance`]). Never a dependency of the shipped crate.

pub mod admin;
mod echo;
mod host;
mod hosting;
mod native;
pub mod nats;
mod quiet;

pub use echo::{audio_frame, echo_latencies, paced_frames, prober_call, quantile};
pub use host::{guest, init_tracing, sandbox, Host};
pub use hosting::{metric, request, Hosting, ACME_KEY, ACME_TOKEN, GLOBEX_KEY, GLOBEX_TOKEN};
pub use native::NativeConformance;
pub use quiet::Quiet;

/// The `voicehost` binary cargo built beside the running test or bench (it builds a package's binaries for
/// its integration tests and benches): uploads in the tests compile in its children, as in `serve`.
pub fn voicehost_binary() -> std::path::PathBuf {
    workspace_binary("voicehost", "voicehost")
}

/// The binary `name` of the workspace's package `package`, from the directory cargo built the running test
/// into (`target/<profile>/`). Only the package under test has its binaries built for it: `cargo test
/// --workspace` (what `scripts/test` runs) builds every package's.
pub fn workspace_binary(package: &str, name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let binary = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join(name))
        .filter(|binary| binary.is_file());
    binary.unwrap_or_else(|| {
        panic!(
            "no {name} binary beside {}: build it (cargo build -p {package}), or run cargo test --workspace",
            exe.display()
        )
    })
}

/// Where tests keep what they write (data directories, the compiled cache across runs): the repository's
/// `target/tmp`, as cargo's own `CARGO_TARGET_TMPDIR` would be for an integration test.
pub fn tmp_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tmp")
}

/// A fresh directory under [`tmp_dir`] named for the test (`name`) and this process, holding `files`
/// (name, contents): an agent author's working directory, for the CLI's commands run as they would be.
pub fn author_dir(name: &str, files: &[(&str, &[u8])]) -> std::path::PathBuf {
    let dir = tmp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, bytes) in files {
        std::fs::write(dir.join(file), bytes).unwrap();
    }
    dir
}
