"""``context-sidecar bench``: its arguments, the order of its work, its exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from context_sidecar_client import ClientTls

from sidecar.bench import report
from sidecar.bench.progress import Progress
from sidecar.bench.run import RENDERINGS, BenchError, BenchSettings, run_bench
from sidecar.bench.workload import SIZES_GRAMMAR, Sizes

# 0: measured, every call answered, every window within its budget; 1: no sidecar at the target,
# a run refused, a failed call or an answer over budget; 2: the arguments (a --tls-* file that cannot be used,
# --plot without matplotlib).
OK, FAILED, USAGE = 0, 1, 2
INTERRUPTED = 130


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _at_least_zero(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _sizes(text: str) -> Sizes:
    try:
        return Sizes.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parser() -> argparse.ArgumentParser:
    bench = argparse.ArgumentParser(
        prog="context-sidecar bench",
        description="Measure a running sidecar with synthetic agent turns: each turn appends a user message, "
                    "a tool call and its result (and the previous answer) in one AssembleContext under the "
                    "budget, beside a health Check, the floor any RPC pays on this machine. Prints p50/p90/p99 "
                    "per RPC and each p50 over the floor's; the runs it opens are deleted afterwards.",
        epilog="Exit codes: 0 measured; 1 no sidecar at the target, a refused run, a failed call or an answer "
               "over its budget; 2 bad arguments (a --tls-* file that cannot be read), or --plot without matplotlib "
               "(the 'plot' extra).")
    bench.add_argument("--target", default="127.0.0.1:50051",
                       help="the sidecar: HOST:PORT or unix:///path/to.sock; default: %(default)s")
    bench.add_argument("--token", help="the tenant's bearer token, when the sidecar has tenants")
    bench.add_argument("--tls-ca-file", metavar="FILE",
                       help="connect over TLS, trusting the CA certificates in FILE (PEM); any of the --tls-* "
                            "flags turns TLS on, without this one trusting the system's roots")
    bench.add_argument("--tls-cert-file", metavar="FILE",
                       help="the client certificate (PEM) a sidecar with mTLS asks for; with --tls-key-file")
    bench.add_argument("--tls-key-file", metavar="FILE", help="the private key of --tls-cert-file (PEM)")
    bench.add_argument("--turns", type=_positive, default=200, help="measured turns per run; default: %(default)s")
    bench.add_argument("--runs", type=_positive, help="runs, each a transcript of its own; default: --concurrency")
    bench.add_argument("--concurrency", type=_positive, default=1,
                       help="threads playing runs at once over one channel; default: %(default)s")
    bench.add_argument("--warmup", type=_at_least_zero, default=20,
                       help="turns played first on runs of their own (one per thread), not counted; "
                            "default: %(default)s")
    bench.add_argument("--budget", type=_positive, default=8000,
                       help="each run's transcript_token_budget; default: %(default)s")
    bench.add_argument("--counter", default="o200k_base", help="each run's token counter; default: %(default)s")
    bench.add_argument("--render", choices=RENDERINGS, default="none",
                       help="also render each turn as a provider's request body; default: %(default)s")
    bench.add_argument("--result-tokens", type=_sizes, default=Sizes.parse("lognormal:300"), metavar="DIST",
                       help=f"tool results' sizes in tokens: {SIZES_GRAMMAR}; default: %(default)s")
    bench.add_argument("--seed", type=int, default=1, help="the same seed, the same turns; default: %(default)s")
    bench.add_argument("--timeout", type=float, default=30.0, help="seconds per call; default: %(default)s")
    bench.add_argument("--json", type=Path, metavar="FILE", help="write every sample and the settings as JSON")
    bench.add_argument("--plot", type=Path, metavar="FILE.png",
                       help="draw latency per turn and its distribution (needs matplotlib: the 'plot' extra)")
    bench.add_argument("--keep-runs", action="store_true", help="leave the runs on the sidecar (their ids are "
                                                                "in the JSON)")
    bench.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                       help="a progress bar on stderr; auto: when stderr is a terminal")
    return bench


def _fail(message: str, code: int) -> int:
    print(f"context-sidecar bench: {message}", file=sys.stderr)
    return code


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """The --tls-* flags as the client's option (None: plaintext); the files are read now."""
    if args.tls_ca_file is None and args.tls_cert_file is None and args.tls_key_file is None:
        return None
    return ClientTls(args.tls_ca_file, cert_file=args.tls_cert_file, key_file=args.tls_key_file)


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None and not path.resolve().parent.is_dir():
            return _fail(f"{option} {path}: the folder {path.resolve().parent} does not exist", USAGE)
    if args.plot is not None:
        try:
            report.pyplot()  # before the run, not after it: a long bench is not lost to a missing extra
        except report.PlotUnavailable as error:
            return _fail(str(error), USAGE)
    try:
        tls = client_tls(args)
    except (OSError, ValueError) as error:
        return _fail(str(error), USAGE)
    settings = BenchSettings(
        target=args.target, token=args.token, tls=tls, turns=args.turns, runs=args.runs or args.concurrency,
        concurrency=args.concurrency, warmup=args.warmup, budget=args.budget, counter=args.counter,
        render=args.render, result_tokens=args.result_tokens, seed=args.seed, timeout=args.timeout,
        keep_runs=args.keep_runs)
    enabled = {"auto": None, "on": True, "off": False}[args.progress]
    bars: list[Progress] = []

    def progress(label: str, total: int) -> Progress:
        bars.append(Progress(total, f"{label:<7}", enabled=enabled))
        return bars[-1]

    try:
        outcome = run_bench(settings, progress=lambda label, total: progress(label, total).update,
                            done=lambda: bars[-1].close())
    except BenchError as error:
        return _fail(str(error), FAILED)
    print(report.table(outcome))
    written = []
    if args.json is not None:
        report.write_json(outcome, args.json)
        written.append(args.json)
    if args.plot is not None and outcome.samples:
        report.plot(outcome, args.plot)
        written.append(args.plot)
    if written:
        print("\nwrote " + ", ".join(map(str, written)))
    if outcome.interrupted:
        return INTERRUPTED
    return FAILED if outcome.failures or outcome.over_budget or not outcome.samples else OK
