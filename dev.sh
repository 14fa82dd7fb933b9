#!/usr/bin/env bash
# One entry point for a fresh machine with python3 (>= 3.11) and gcc; the tests also need node (>= 20),
# go (1.26), Java 17 with Maven, Rust (rustc >= 1.85) and PostgreSQL's server (.ci/run installs what is missing):
#   ./dev.sh serve [flags]   set up, then run the sidecar (127.0.0.1:50051, LMDB in ./data)
#   ./dev.sh inspect [flags] set up, then serve the run inspector over ./data (http://127.0.0.1:7070)
#   ./dev.sh test            set up, lint (ruff), type-check (mypy), run every test: Python, TypeScript, Go, Java, Rust
#   ./dev.sh bench [name] [args]  set up, then run benchmarks/bench_<name>.py (default turn);
#                            ./dev.sh bench --smoke: every benchmark for one round
#   ./dev.sh setup           only set up: .venv with the package installed (fastcore compiled)
set -euo pipefail
cd "$(dirname "$0")"

VENV=.venv

say() { echo "dev.sh: $*" >&2; }

# What the venv was built from, as one hash: setup_python redoes a step only when its inputs changed.
inputs_hash() {
  { "$VENV/bin/python" -c 'import sys; print(sys.version)'; cat "$@"; } | sha256sum | cut -d' ' -f1
}

setup_python() {
  local extras=${1:-} stamps="$VENV/.dev-stamps"
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
      || { echo "dev.sh: Python 3.11 or newer is needed as python3" >&2; exit 1; }
    say "creating $VENV ($(python3 --version))"
    python3 -m venv "$VENV"
  fi
  mkdir -p "$stamps"
  # The Python client (clients/python), which the server depends on for the API's stubs: it is not
  # on PyPI, so it comes first, editable, from this tree.
  local client_hash
  client_hash=$(inputs_hash clients/python/pyproject.toml)
  if [ "$(cat "$stamps/client" 2>/dev/null)" != "$client_hash" ]; then
    say "installing the Python client (clients/python) editable"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e clients/python
    echo "$client_hash" >"$stamps/client"
  fi
  # The dependencies (serving's, plus the extras asked for) come from pyproject.toml alone.
  local deps_hash deps_stamp
  deps_hash=$(inputs_hash pyproject.toml)
  deps_stamp="$stamps/deps-${extras:-serve}"
  # Serving's own dependencies also came with any extras' install from the same pyproject.toml.
  local done_stamps=("$deps_stamp")
  [ -n "$extras" ] || done_stamps=("$stamps"/deps-*)
  if ! grep -qsx "$deps_hash" "${done_stamps[@]}"; then
    say "installing the dependencies${extras:+ with the extras $extras} (pip; a minute the first time)"
    "$VENV/bin/python" - "$extras" >"$stamps/requirements.txt" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = [name for name in sys.argv[1].split(",") if name]
print("\n".join(project["dependencies"] + [dep for name in extras for dep in project["optional-dependencies"][name]]))
PY
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$stamps/requirements.txt"
    echo "$deps_hash" >"$deps_stamp"
  fi
  # The package itself, editable: compiles fastcore/*.pyx with Cython in place (fastcore/*.so).
  local build_hash
  build_hash=$(inputs_hash pyproject.toml setup.py fastcore/*.pyx)
  if [ "$(cat "$stamps/build" 2>/dev/null)" != "$build_hash" ] || ! compgen -G "fastcore/_fastcore*.so" >/dev/null; then
    say "compiling the Cython core (fastcore/*.pyx) and installing the package editable"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e .
    echo "$build_hash" >"$stamps/build"
  fi
}

setup_go() {
  command -v go >/dev/null || { echo "dev.sh: Go 1.26 is needed for the Go client's tests" >&2; exit 1; }
  (cd clients/go && go mod download)
}

setup_java() {
  command -v mvn >/dev/null || { echo "dev.sh: Java 17 and Maven are needed for the Java client's tests" >&2; exit 1; }
  mvn -q -B -ntp -f clients/java/pom.xml test-compile
}

setup_rust() {
  command -v cargo >/dev/null || { echo "dev.sh: Rust (cargo, rustc 1.85 or newer) is needed for the Rust client's tests" >&2; exit 1; }
  local minor
  minor=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+).*/\1/')
  [ "$minor" -ge 85 ] 2>/dev/null \
    || { echo "dev.sh: the Rust client needs rustc 1.85 or newer (rustup's, or Debian trixie's), not $(rustc --version)" >&2; exit 1; }
  # Cargo.lock holds versions that build with rustc 1.85 (Debian trixie's): --locked keeps them.
  (cd clients/rust && cargo fetch --locked --quiet)
}

setup_node() {
  command -v npm >/dev/null || { echo "dev.sh: Node.js 20 and npm are needed for the client tests" >&2; exit 1; }
  # The TypeScript package: its dependencies, then its build (dist/), which the tests and the bench import.
  (cd clients/node && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build)
}

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  setup)
    setup_python test ;;
  serve)
    setup_python
    say "starting the sidecar (context-sidecar serve${*:+ $*})"
    exec "$VENV/bin/context-sidecar" serve "$@" ;;
  inspect)
    setup_python
    say "starting the run inspector (context-sidecar inspect${*:+ $*})"
    exec "$VENV/bin/context-sidecar" inspect "$@" ;;
  test)
    setup_python test
    setup_node
    setup_go
    setup_java
    setup_rust
    "$VENV/bin/ruff" check .
    "$VENV/bin/mypy"
    "$VENV/bin/python" -m pytest "$@"
    # The Node.js test starts its own sidecar with the python on PATH: the venv's.
    (cd clients/node && PATH="$PWD/../../$VENV/bin:$PATH" npm test)
    # -count=1: the results depend on the sidecar and the proto, which go test's cache cannot see.
    (cd clients/go && go vet ./... && PATH="$PWD/../../$VENV/bin:$PATH" go test -count=1 ./...)
    PATH="$PWD/$VENV/bin:$PATH" mvn -B -ntp -f clients/java/pom.xml test
    # The Rust tests start their own sidecars with the python on PATH too.
    (cd clients/rust && PATH="$PWD/../../$VENV/bin:$PATH" cargo test --locked) ;;
  bench)
    setup_python test,bench
    # --smoke alone: every registered bench for one round (benchmarks/README.md), as CI runs them.
    # The clients' smoke runs the Rust bench program too.
    if [ "${1:-}" = --smoke ]; then setup_rust; exec "$VENV/bin/python" -m benchmarks --smoke; fi
    benchmark=bench_turn
    if [ $# -gt 0 ] && [ -f "benchmarks/bench_${1#bench_}.py" ]; then benchmark=bench_${1#bench_}; shift; fi
    # The clients benchmark runs each client's bench program: Node.js needs its packages, Rust its crates.
    if [ "$benchmark" = bench_clients ]; then setup_node; setup_rust; fi
    exec "$VENV/bin/python" -m "benchmarks.$benchmark" "$@" ;;
  *)
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2 ;;
esac
