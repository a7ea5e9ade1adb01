"""What an unarmed fault-injection point costs (respire_actors/faults.py).

The completer calls two points per completion batch (before and after its commit), the promoter
one per pass that promoted something, the reliable queue two per ack call: each next to a Redis
round trip of tens to hundreds of microseconds. Prints ns per call: an unarmed point,
an empty function call (the floor), and a point armed for another name (the chaos worker's case).

    python benchmarks/bench_faults.py [--calls N]
"""

from __future__ import annotations

import argparse
import timeit

from respire_actors import faults


def _empty(name: str) -> None:
    return None


def ns_per_call(fn: object, calls: int, repeat: int = 7) -> float:
    timer = timeit.Timer("fn('completer.before-commit')", globals={"fn": fn})
    return min(timer.repeat(repeat, calls)) / calls * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2_000_000)
    args = parser.parse_args()
    faults.disarm()
    unarmed = ns_per_call(faults.point, args.calls)
    floor = ns_per_call(_empty, args.calls)
    faults.arm("reliable.after-ack:kill:1000000000")
    other = ns_per_call(faults.point, args.calls)
    faults.disarm()
    print(f"{'measure':<44}  ns per call")
    print(f"{'-' * 44}  {'-' * 11}")
    print(f"{'unarmed faults.point()':<44}  {unarmed:11.1f}")
    print(f"{'empty function call (floor)':<44}  {floor:11.1f}")
    print(f"{'faults.point() with another point armed':<44}  {other:11.1f}")
    print(f"\nper completion batch (2 points): {2 * unarmed:.0f} ns unarmed")


if __name__ == "__main__":
    main()
