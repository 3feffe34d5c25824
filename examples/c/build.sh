#!/usr/bin/env bash
# Builds the C conformance agent (examples/c/agent.c) into target/guests/c/conformance.wasm.
#
# Idempotent and runnable from any directory. It installs what is missing, and only that:
#   * Debian packages: clang-19, lld-19, wasi-libc, libclang-rt-19-dev-wasm32 (apt-get; root or sudo);
#   * wit-bindgen-cli and wasm-tools, with `cargo install --locked` into target/tools (not on your PATH);
#   * the WASI preview 1 reactor adapter, taken from the crate wasi-preview1-component-adapter-provider.
# Generated bindings go to target/c-bindings; nothing is written outside target/ except by apt-get.
#
# Environment: CC (default clang-19) and CFLAGS_EXTRA (extra compiler flags, e.g. -g) may be set.
set -euo pipefail

# Versions, pinned. The adapter matches the host's wasmtime (48.0.8), wasm-tools its wasmparser (0.263).
readonly WIT_BINDGEN_VERSION=0.63.0
readonly WASM_TOOLS_VERSION=1.263.0
readonly ADAPTER_VERSION=48.0.8
readonly LLVM_MAJOR=19
readonly APT_PACKAGES=("clang-$LLVM_MAJOR" "lld-$LLVM_MAJOR" wasi-libc "libclang-rt-$LLVM_MAJOR-dev-wasm32")

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tools="$root/target/tools"
bindings="$root/target/c-bindings"
out_dir="$root/target/guests/c"
out="$out_dir/conformance.wasm"
adapter="$tools/wasi_snapshot_preview1.reactor-$ADAPTER_VERSION.wasm"
cc="${CC:-clang-$LLVM_MAJOR}"

log() { printf '==> %s\n' "$*" >&2; }

as_root() {
    if [[ $EUID -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "error: '$*' needs root (or sudo)" >&2
        exit 1
    fi
}

install_apt_packages() {
    local missing=() pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]]; then
            missing+=("$pkg")
        fi
    done
    if ((${#missing[@]})); then
        log "apt-get install ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

# cargo_tool BINARY CRATE VERSION: installs CRATE@VERSION into target/tools unless BINARY is that version.
cargo_tool() {
    local binary="$1" crate="$2" version="$3"
    local path="$tools/bin/$binary"
    if [[ -x "$path" ]] && [[ "$("$path" --version 2>/dev/null)" == *" $version"* ]]; then
        return
    fi
    log "cargo install $crate $version into $tools (a few minutes, once)"
    cargo install "$crate" --version "=$version" --locked --root "$tools" --quiet
}

# The adapter ships inside a crate: a throwaway manifest that depends on it makes cargo download it, and
# `cargo metadata` says where its source (with artefacts/) landed in the registry.
fetch_adapter() {
    [[ -f "$adapter" ]] && return
    log "fetching wasi-preview1-component-adapter-provider $ADAPTER_VERSION"
    local project="$tools/adapter-provider"
    mkdir -p "$project/src"
    : >"$project/src/lib.rs"
    cat >"$project/Cargo.toml" <<EOF
# Throwaway: only here so that cargo downloads the adapter crate (see examples/c/build.sh).
[package]
name = "adapter-provider"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
wasi-preview1-component-adapter-provider = "=$ADAPTER_VERSION"

[workspace]
EOF
    local manifest
    manifest="$(cargo metadata --format-version 1 --quiet --manifest-path "$project/Cargo.toml" |
        grep -o "\"manifest_path\":\"[^\"]*/wasi-preview1-component-adapter-provider-$ADAPTER_VERSION/Cargo.toml\"" |
        head -n 1 | cut -d '"' -f 4)"
    if [[ -z "$manifest" ]]; then
        echo "error: cargo metadata did not locate wasi-preview1-component-adapter-provider $ADAPTER_VERSION" >&2
        exit 1
    fi
    cp "$(dirname "$manifest")/artefacts/wasi_snapshot_preview1.reactor.wasm" "$adapter.tmp"
    mv "$adapter.tmp" "$adapter"
}

install_apt_packages
mkdir -p "$tools"
cargo_tool wit-bindgen wit-bindgen-cli "$WIT_BINDGEN_VERSION"
cargo_tool wasm-tools wasm-tools "$WASM_TOOLS_VERSION"
fetch_adapter

log "generating C bindings for wit/agent.wit into $bindings"
rm -rf "$bindings"
"$tools/bin/wit-bindgen" c "$root/wit" --world agent --out-dir "$bindings" >/dev/null

work="$(mktemp -d "$root/target/tmp-c-agent.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log "compiling agent.c"
# shellcheck disable=SC2086 # CFLAGS_EXTRA is a list of flags
"$cc" --target=wasm32-wasi -mexec-model=reactor -O2 -std=c11 -Wall -Wextra -Werror \
    ${CFLAGS_EXTRA:-} -I "$bindings" -Wl,--strip-debug \
    -o "$work/core.wasm" \
    "$here/agent.c" "$bindings/agent.c" "$bindings/agent_component_type.o"

log "making the component (with the preview 1 reactor adapter)"
"$tools/bin/wasm-tools" component new "$work/core.wasm" \
    --adapt "wasi_snapshot_preview1=$adapter" -o "$work/conformance.wasm"
"$tools/bin/wasm-tools" validate "$work/conformance.wasm"

mkdir -p "$out_dir"
mv "$work/conformance.wasm" "$out"
log "wrote $out ($(stat -c %s "$out") bytes)"
