//! The core's intake, router and calls under libFuzzer: the input is a sequence of operations (what Sent sends,
//! connections, the clock, the guests' requests) that `voicehost_proto::fuzzing::intake` runs against the agent's router,
//! checking its rules after each. `scripts/fuzz` runs it; the corpus is replayed by `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    voicehost_proto::fuzzing::intake::run(data);
});
