//! The guest programs that voicehost's tests, benches and demo run, as WebAssembly components built for
//! wasm32-wasip2 by this crate's build script (in the manner of wasmtime's `crates/test-programs`): the
//! example agents a user starts from and the faulty test guests. voicehost takes this crate as a
//! dev-dependency only, so building the host never builds a guest.
//!
//! Each program is a constant holding its component's path (`CONFORMANCE`, `PROBER`, …); [`path`] and
//! [`read`] find one by its name.

include!(concat!(env!("OUT_DIR"), "/programs.rs"));

/// The component's path of the program `name` (`"conformance"`, `"prober"`, …).
///
/// # Panics
/// If this crate builds no program of that name.
pub fn path(name: &str) -> &'static str {
    match ALL.iter().find(|(program, _)| *program == name) {
        Some((_, path)) => path,
        None => panic!(
            "no test program {name:?}; there are {:?}",
            ALL.iter().map(|(program, _)| program).collect::<Vec<_>>()
        ),
    }
}

/// The component of the program `name`.
///
/// # Panics
/// If this crate builds no program of that name, or its file cannot be read.
pub fn read(name: &str) -> Vec<u8> {
    let path = path(name);
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_program_is_built() {
        for (name, _) in super::ALL {
            assert!(super::read(name).starts_with(b"\0asm"), "{name}");
        }
    }
}
