#!/usr/bin/env bash
# Builds the JavaScript agent (app.js) into voicehost components:
#   target/guests/js/conformance.wasm      StarlingMonkey (SpiderMonkey), via componentize-js
#   target/guests/js/conformance-qjs.wasm  QuickJS, via componentize-qjs
# in the repository (examples/js/), from the repository's wit/; in a project `voicehost new --lang js` made
# (it has wit/ of its own), target/agent.wasm and target/agent-qjs.wasm.
# Usage: build.sh [all|starlingmonkey|quickjs]   (default: all; runnable from any directory)
# The toolchains come from package-lock.json (npm ci into node_modules beside this script, once).
set -euo pipefail

variant=${1:-all}
case "$variant" in
    all | starlingmonkey | quickjs) ;;
    *) echo "usage: $0 [all|starlingmonkey|quickjs]" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f "$here/wit/agent.wit" ]]; then
    root="$here" out="$here/target" name=agent
else
    root=$(cd "$here/../.." && pwd) out="$root/target/guests/js" name=conformance
fi
wit="$root/wit"
bin="$here/node_modules/.bin"

command -v npm > /dev/null || { echo "build.sh: node and npm are needed (Node 18 or later)" >&2; exit 1; }

# Install the pinned toolchains when they are missing or older than the lockfile.
if [[ ! -x "$bin/componentize-js" || ! -x "$bin/componentize-qjs" \
    || "$here/package-lock.json" -nt "$here/node_modules/.package-lock.json" ]]; then
    (cd "$here" && npm ci --no-audit --no-fund)
fi

mkdir -p "$out"
cd "$here"

# Each tool writes to a temporary file first, so a failed build never leaves a half-written component.
if [[ "$variant" != quickjs ]]; then
    # -d http fetch-event: voicehost does not provide wasi:http, so StarlingMonkey must not import it.
    "$bin/componentize-js" app.js --wit "$wit" --world-name agent --disable http fetch-event \
        --out "$out/$name.wasm.tmp"
    mv "$out/$name.wasm.tmp" "$out/$name.wasm"
    echo "wrote $out/$name.wasm ($(wc -c < "$out/$name.wasm") bytes)"
fi
if [[ "$variant" != starlingmonkey ]]; then
    # --sync: voicehost's wasmtime has no component-model-async, which the default QuickJS runtime needs.
    # agent-without-http: componentize-qjs 0.4.5 cannot initialise a world that imports wasi:http.
    "$bin/componentize-qjs" --wit "$wit" --js app.js --world agent-without-http --sync \
        --output "$out/$name-qjs.wasm.tmp" > /dev/null
    mv "$out/$name-qjs.wasm.tmp" "$out/$name-qjs.wasm"
    echo "wrote $out/$name-qjs.wasm ($(wc -c < "$out/$name-qjs.wasm") bytes)"
fi
