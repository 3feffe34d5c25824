//! The harness of upload validation: the cargo-fuzz target `upload`. The input is an upload's bytes; they go
//! through [`Sandbox::load`], what every upload goes through before anything is stored (compiled on this
//! host, checked against the `agent` world with and without `wasi:http`). The kept corpus starts from small
//! valid agents (`write_seeds`), so libFuzzer's mutations of them reach past the parser into validation,
//! compilation and linking.
//!
//! What must hold: nothing panics; bytes that are not WebAssembly are `NotWasm`, a core module is
//! `CoreModule`, and only a component can be accepted; every refusal says why in a bounded message (it goes
//! back to the uploader and into the log).

use crate::sandbox::{LoadError, Sandbox};
use std::sync::OnceLock;

/// The longest refusal: wasmtime's reason is cut to 1024 bytes, and a prefix says which check refused.
const MAX_REASON: usize = 1200;

/// The engine, made once per process (as `serve` does): with the pooling allocator and its epoch ticker.
fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| Sandbox::new().expect("the engine"))
}

/// Runs one input; panics when a rule breaks.
pub fn run(data: &[u8]) {
    let outcome = sandbox().load(data);
    let magic = data.starts_with(b"\0asm");
    let layer = data.get(4..8);
    match &outcome {
        Ok(_) => assert_eq!(
            layer,
            Some(&[0x0d, 0, 0x01, 0][..]),
            "only a component is accepted"
        ),
        Err(LoadError::NotWasm) => assert!(!magic, "WebAssembly refused as not WebAssembly"),
        Err(LoadError::CoreModule) => assert_eq!(layer, Some(&[1, 0, 0, 0][..])),
        Err(
            LoadError::Invalid(_) | LoadError::WrongWorld(_) | LoadError::OverInstanceLimits(_),
        ) => {
            assert!(magic)
        }
        // Only a compiling child reports these; this loads in process.
        Err(error @ (LoadError::TooCostly(_) | LoadError::Compiler(_))) => {
            panic!("loading in process failed as a child would: {error}")
        }
    }
    if let Err(error) = outcome {
        let reason = error.to_string();
        assert!(!reason.is_empty());
        assert!(
            reason.len() <= MAX_REASON,
            "a refusal of {} bytes: {}…",
            reason.len(),
            &reason[..reason.floor_char_boundary(200)]
        );
    }
}

/// Tiny hand-made inputs for the corpus: not WebAssembly, a core module, an empty component, cut headers.
/// `write_seeds` adds the small valid agents.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    vec![
        ("seed-empty".into(), Vec::new()),
        ("seed-magic".into(), b"\0asm".to_vec()),
        ("seed-core-module".into(), b"\0asm\x01\0\0\0".to_vec()),
        ("seed-empty-component".into(), b"\0asm\x0d\0\x01\0".to_vec()),
        ("seed-text".into(), b"(component)".to_vec()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::corpus;

    /// The valid agents the corpus starts from: small ones, so the corpus stays small.
    const AGENTS: [&str; 2] = ["looper", "conformance"];

    #[test]
    fn the_seeds_and_the_valid_agents_pass_their_rules() {
        for (name, bytes) in seeds() {
            corpus::replay("upload", &name, &bytes, run);
        }
        for agent in AGENTS {
            let wasm = voicehost_test_programs::read(agent);
            assert!(sandbox().load(&wasm).is_ok(), "{agent} is a valid agent");
            corpus::replay("upload", agent, &wasm, run);
        }
    }

    /// The short version of the fuzzing, on every `cargo test`: the kept corpus replays cleanly, and so do
    /// 20 of its inputs changed a little (a fixed seed; each input is compiled, so not all of them).
    #[test]
    fn the_fuzz_corpus_replays_cleanly() {
        let files = corpus::files("upload");
        assert!(
            files.len() >= 5,
            "the corpus is missing: {}",
            corpus::dir("upload").display()
        );
        let mut rng = fastrand::Rng::with_seed(0x0a1d);
        for (path, bytes) in &files {
            corpus::replay("upload", &path.display().to_string(), bytes, run);
        }
        for _ in 0..20 {
            let (path, bytes) = &files[rng.usize(..files.len())];
            let name = path.display().to_string();
            corpus::replay("upload", &name, &corpus::mutate(bytes, &mut rng), run);
        }
    }

    /// A refusal that quotes a long name from the component is cut.
    #[test]
    fn a_refusal_quoting_a_long_name_is_cut() {
        let name = "x".repeat(100_000);
        let wasm = wat::parse_str(format!(r#"(component (import "{name}" (func)))"#)).unwrap();
        let reason = sandbox().load(&wasm).err().expect("refused").to_string();
        assert!(reason.len() <= MAX_REASON, "{} bytes", reason.len());
        assert!(reason.ends_with('…'), "{reason}");
    }

    /// Writes the seeds and the valid agents into the corpus: `cargo test -p voicehost --lib
    /// fuzzing::upload::tests::write_seeds -- --ignored`.
    #[test]
    #[ignore]
    fn write_seeds() {
        std::fs::create_dir_all(corpus::dir("upload")).unwrap();
        for (name, bytes) in seeds() {
            std::fs::write(corpus::dir("upload").join(name), bytes).unwrap();
        }
        for agent in AGENTS {
            let wasm = voicehost_test_programs::read(agent);
            std::fs::write(corpus::dir("upload").join(format!("seed-{agent}")), wasm).unwrap();
        }
    }
}
