#!/usr/bin/env bash
# Builds the Python agent (app.py) into a component: in the repository (examples/python/),
# target/guests/python/conformance.wasm from the repository's wit/; in a project `voicehost new --lang
# python` made (it has wit/ of its own), target/agent.wasm.
# Idempotent and runnable from any directory; needs python3 (3.9+) with venv and pip, and PyPI.
# VOICEHOST_TOOLS puts the toolchain's venv somewhere else than target/tools, to share it between agents.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -f "$here/wit/agent.wit" ]]; then
    root="$here" bindings="$here/target/bindings" out="$here/target/agent.wasm"
else
    root="$(cd "$here/../.." && pwd)" bindings="$root/target/guests/python/bindings"
    out="$root/target/guests/python/conformance.wasm"
fi
venv="${VOICEHOST_TOOLS:-$root/target/tools}/python-venv"
wit="$root/wit"
world="agent"

# The toolchain: a venv with the pinned componentize-py (installed again only when requirements.txt changes).
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
stamp="$venv/.voicehost-requirements"
if ! cmp -s "$here/requirements.txt" "$stamp"; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
    cp "$here/requirements.txt" "$stamp"
fi
componentize_py="$venv/bin/componentize-py"

# The bindings (the `wit_world` package) are generated from the WIT, never committed: always regenerate
# them, so a changed wit/agent.wit is picked up (it takes well under a second).
rm -rf "$bindings"
mkdir -p "$bindings" "$(dirname "$out")"
"$componentize_py" -d "$wit" -w "$world" bindings "$bindings"

# The component: app.py's `Handler` plus CPython, the bindings, the standard library and whatever
# pure-Python packages requirements.txt installed into the venv (VIRTUAL_ENV points componentize-py at its
# site-packages, and not at a venv the caller happens to have activated). componentize-py imports app.py
# at build time (pre-initialization), which leaves a __pycache__ here (ignored by .gitignore).
VIRTUAL_ENV="$venv" "$componentize_py" -d "$wit" -w "$world" componentize \
    -p "$here" -p "$bindings" app -o "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out ($(du -h "$out" | cut -f1))"
