//! `voicehost.toml` under libFuzzer: the input is a config's text, parsed and checked as `serve` does
//! (`voicehost::fuzzing::config`). `scripts/fuzz config` runs it; the corpus is replayed by `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    voicehost::fuzzing::config::run(data);
});
