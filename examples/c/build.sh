#!/usr/bin/env bash
# Builds the C agent (agent.c) into a component:
#   in the repository (examples/c/): target/guests/c/conformance.wasm, from the repository's wit/;
#   in a project `voicehost new --lang c` made (it has wit/ of its own): target/agent.wasm.
#
# Idempotent and runnable from any directory. It installs what is missing, and only that:
#   * Debian packages: clang-19, lld-19, wasi-libc, libclang-rt-19-dev-wasm32 (apt-get; root or sudo);
#   * wit-bindgen-cli and wasm-tools, with `cargo install --locked` into target/tools (not on your PATH),
#     with only the features this script uses and unoptimised (see cargo_tool);
#   * the WASI preview 1 reactor adapter, taken from the crate wasi-preview1-component-adapter-provider.
# Generated bindings go to target/c-bindings; nothing is written outside target/ except by apt-get (and
# cargo's own download cache).
#
# Environment: CC (default clang-19) and CFLAGS_EXTRA (extra compiler flags, e.g. -g) may be set;
# VOICEHOST_TOOLS puts the tools somewhere else than target/tools, to share them between agents.
set -euo pipefail

# Versions, pinned. The adapter matches the host's wasmtime (48.0.8), wasm-tools its wasmparser (0.263).
readonly WIT_BINDGEN_VERSION=0.63.0
readonly WASM_TOOLS_VERSION=1.263.0
# Their cargo features: only what this script runs (`wit-bindgen c`, `wasm-tools component new` and
# `validate`); the defaults add every other generator and subcommand and take minutes longer to build.
readonly WIT_BINDGEN_FEATURES=c
readonly WASM_TOOLS_FEATURES=component,validate
readonly ADAPTER_VERSION=48.0.8
readonly LLVM_MAJOR=19
readonly APT_PACKAGES=("clang-$LLVM_MAJOR" "lld-$LLVM_MAJOR" wasi-libc "libclang-rt-$LLVM_MAJOR-dev-wasm32")

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -f "$here/wit/agent.wit" ]]; then
    root="$here" out_dir="$here/target" out="$here/target/agent.wasm"
else
    root="$(cd "$here/../.." && pwd)" out_dir="$root/target/guests/c"
    out="$out_dir/conformance.wasm"
fi
tools="${VOICEHOST_TOOLS:-$root/target/tools}"
tools_build="$tools-build"
bindings="$root/target/c-bindings"
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

# cargo_tool BINARY CRATE VERSION FEATURES: installs CRATE@VERSION with FEATURES into target/tools unless
# BINARY is that version, installed with those features (its stamp says so) or with every feature (no
# stamp: an older build.sh's install, which has what this script runs). Unoptimised and without debug info
# (the tools only ever see one small module, and an optimised build takes several times longer), in
# target/tools-build, which a successful run deletes and the next run clears if one failed.
cargo_tool() {
    local binary="$1" crate="$2" version="$3" features="$4"
    local path="$tools/bin/$binary" stamp="$tools/$binary.features"
    if [[ -x "$path" ]] && [[ "$("$path" --version 2>/dev/null)" == *" $version"* ]] &&
        { [[ ! -e "$stamp" ]] || [[ "$(cat "$stamp")" == "$version $features" ]]; }; then
        return
    fi
    log "cargo install $crate $version (features: $features) into $tools (a minute or two, once)"
    CARGO_PROFILE_DEV_DEBUG=0 cargo install "$crate" --version "=$version" --locked --force --quiet \
        --no-default-features --features "$features" --debug --target-dir "$tools_build" --root "$tools"
    echo "$version $features" >"$stamp"
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
rm -rf "$tools_build"
cargo_tool wit-bindgen wit-bindgen-cli "$WIT_BINDGEN_VERSION" "$WIT_BINDGEN_FEATURES"
cargo_tool wasm-tools wasm-tools "$WASM_TOOLS_VERSION" "$WASM_TOOLS_FEATURES"
rm -rf "$tools_build"
fetch_adapter

log "generating C bindings for wit/agent.wit into $bindings"
rm -rf "$bindings"
"$tools/bin/wit-bindgen" c "$root/wit" --world agent --out-dir "$bindings" >/dev/null

mkdir -p "$out_dir"
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
    --adapt "wasi_snapshot_preview1=$adapter" -o "$work/agent.wasm"
"$tools/bin/wasm-tools" validate "$work/agent.wasm"

mv "$work/agent.wasm" "$out"
log "wrote $out ($(stat -c %s "$out") bytes)"
