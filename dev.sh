#!/usr/bin/env bash
# One entry point for a fresh machine with python3 (>= 3.11) and gcc; the tests also need node (>= 20),
# go (1.26), Java 17 with Maven and PostgreSQL's server (.ci/run installs what is missing):
#   ./dev.sh serve [flags]   set up, then run the sidecar (127.0.0.1:50051, LMDB in ./data)
#   ./dev.sh test            set up, lint (ruff), type-check (mypy), run every test: Python, Node.js, Go, Java
#   ./dev.sh bench [name] [args]  set up, then run benchmarks/bench_<name>.py (default turn);
#                            ./dev.sh bench --smoke: every benchmark for one round
#   ./dev.sh setup           only set up: .venv with the package installed (fastcore compiled)
set -euo pipefail
cd "$(dirname "$0")"

VENV=.venv

setup_python() {
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
      || { echo "dev.sh: Python 3.11 or newer is needed as python3" >&2; exit 1; }
    python3 -m venv "$VENV"
  fi
  # Editable install: compiles fastcore/_fastcore.pyx with Cython in place.
  # Extras: test by default; the benchmarks also install bench (matplotlib, for their plots).
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[${1:-test}]"
}

setup_go() {
  command -v go >/dev/null || { echo "dev.sh: Go 1.26 is needed for the Go client's tests" >&2; exit 1; }
  (cd clients/go && go mod download)
}

setup_java() {
  command -v mvn >/dev/null || { echo "dev.sh: Java 17 and Maven are needed for the Java client's tests" >&2; exit 1; }
  mvn -q -B -ntp -f clients/java/pom.xml test-compile
}

setup_node() {
  command -v npm >/dev/null || { echo "dev.sh: Node.js 20 and npm are needed for the client tests" >&2; exit 1; }
  (cd clients/node && npm ci --no-audit --no-fund --loglevel=error)
}

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  setup)
    setup_python ;;
  serve)
    setup_python
    exec "$VENV/bin/context-sidecar" serve "$@" ;;
  test)
    setup_python
    setup_node
    setup_go
    setup_java
    "$VENV/bin/ruff" check .
    "$VENV/bin/mypy"
    "$VENV/bin/python" -m pytest "$@"
    # The Node.js test starts its own sidecar with the python on PATH: the venv's.
    (cd clients/node && PATH="$PWD/../../$VENV/bin:$PATH" npm test)
    # -count=1: the results depend on the sidecar and the proto, which go test's cache cannot see.
    (cd clients/go && go vet ./... && PATH="$PWD/../../$VENV/bin:$PATH" go test -count=1 ./...)
    PATH="$PWD/$VENV/bin:$PATH" mvn -B -ntp -f clients/java/pom.xml test ;;
  bench)
    setup_python test,bench
    # --smoke alone: every registered bench for one round (benchmarks/README.md), as CI runs them.
    if [ "${1:-}" = --smoke ]; then exec "$VENV/bin/python" -m benchmarks --smoke; fi
    benchmark=bench_turn
    if [ $# -gt 0 ] && [ -f "benchmarks/bench_${1#bench_}.py" ]; then benchmark=bench_${1#bench_}; shift; fi
    # The clients benchmark runs each client's bench program: Node.js needs its packages.
    if [ "$benchmark" = bench_clients ]; then setup_node; fi
    exec "$VENV/bin/python" -m "benchmarks.$benchmark" "$@" ;;
  *)
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2 ;;
esac
