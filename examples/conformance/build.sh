#!/usr/bin/env bash
# Builds the Rust agent into a component: in the repository (examples/conformance/), with the other Rust
# examples, into target/guests/wasm32-wasip2/release/conformance.wasm (what scripts/build-agents runs); in a
# project `voicehost new --lang rust` made (it has wit/ of its own), into target/agent.wasm.
# Runnable from any directory; adds the wasm32-wasip2 target to the toolchain when it is missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rustup target add wasm32-wasip2 >/dev/null
if [[ -f "$here/wit/agent.wit" ]]; then
    # CARGO_TARGET_DIR, when set, is where cargo builds (several agents may share one); the component is
    # copied to target/agent.wasm either way.
    built="${CARGO_TARGET_DIR:-$here/target}"
    cargo build --manifest-path "$here/Cargo.toml" --target wasm32-wasip2 --release --target-dir "$built"
    crate="$(sed -n 's/^name = "\(.*\)"$/\1/p' "$here/Cargo.toml" | head -n 1 | tr - _)"
    mkdir -p "$here/target"
    cp "$built/wasm32-wasip2/release/$crate.wasm" "$here/target/agent.wasm.tmp"
    mv "$here/target/agent.wasm.tmp" "$here/target/agent.wasm"
    echo "wrote $here/target/agent.wasm ($(wc -c <"$here/target/agent.wasm") bytes)"
else
    root="$(cd "$here/../.." && pwd)"
    cargo build --manifest-path "$root/examples/Cargo.toml" --target wasm32-wasip2 --release \
        --target-dir "$root/target/guests" -p conformance
fi
