//! Upload validation under libFuzzer: the input is an upload's bytes, checked and compiled as every upload is
//! (`voicehost::fuzzing::upload`). `scripts/fuzz upload` runs it; the corpus is replayed by `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    voicehost::fuzzing::upload::run(data);
});
