"""Timing of the server's bearer-token check: does the answer's time depend on where a guess differs?

    .venv/bin/python packages/unirl-reward/benchmarks/bench_token_compare.py

Times ``BearerTokenMiddleware._authorized`` (the check every request passes through) on guesses
of the token's length that differ from it at the first byte, in the middle or at the last byte,
and the right token, interleaved round by round so drift hits all alike; the median ns per call of
each. A positive control runs the same measurement on a naive check (``==`` on the bytes, which
stops at the first differing byte): a leak the method can see shows up there as last-byte guesses
taking longer than first-byte ones. Reported per token length: the medians and the ratio
last / first for both checks (1.00 means no signal). The comparison of long tokens makes the
control's leak large enough to measure; the server's tokens are what the operator sets.
"""

from __future__ import annotations

import argparse
import hmac
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from unirl.reward.server.auth import BearerTokenMiddleware


def scope_for(guess: bytes) -> dict[str, Any]:
    return {"type": "http", "path": "/v1/score", "headers": [(b"authorization", b"Bearer " + guess)]}


class NaiveCheck(BearerTokenMiddleware):
    """The positive control: the same parsing, the compare done with ``==``."""

    def _authorized(self, scope: dict[str, Any]) -> bool:
        header = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, credentials = header.partition(b" ")
        return scheme.lower() == b"bearer" and credentials.strip() == self.token


def guesses(token: bytes) -> dict[str, bytes]:
    def flip(i: int) -> bytes:
        b = bytearray(token)
        b[i] ^= 0x01
        return bytes(b)

    return {"first": flip(0), "middle": flip(len(token) // 2), "last": flip(len(token) - 1), "right": token}


def measure(
    check: Callable[[dict[str, Any]], bool], cases: dict[str, bytes], rounds: int, calls: int
) -> dict:
    scopes = {k: scope_for(v) for k, v in cases.items()}
    per: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for k, scope in scopes.items():
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                check(scope)
            per[k].append((time.perf_counter_ns() - t0) / calls)
    med = {k: statistics.median(v) for k, v in per.items()}
    return {"median_ns": med, "last_over_first": med["last"] / med["first"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 4096, 65536], help="token lengths (bytes)")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    out = []
    for n in args.lengths:
        token = bytes((i * 7 + 3) % 94 + 33 for i in range(n))  # printable, no spaces
        cases = guesses(token)
        for name, mw in (
            ("compare_digest", BearerTokenMiddleware(None, token.decode())),
            ("naive ==", NaiveCheck(None, token.decode())),
        ):
            assert mw._authorized(scope_for(token)) and not mw._authorized(scope_for(cases["last"]))
            r = measure(mw._authorized, cases, args.rounds, args.calls)
            med = r["median_ns"]
            print(
                f"{n:6d} B  {name:15s} first {med['first']:9.0f} ns  middle {med['middle']:9.0f}  "
                f"last {med['last']:9.0f}  right {med['right']:9.0f}  last/first {r['last_over_first']:.3f}"
            )
            out.append({"length": n, "check": name, **r})
    print(f"(hmac.compare_digest from {hmac.__name__}; medians of {args.rounds} rounds x {args.calls} calls)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
