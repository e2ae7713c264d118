"""Collective bus bandwidth on this machine's CPU ranks (gloo) or GPUs (NCCL), as the probe measures it.

    python benchmarks/bench_probe.py [--ranks 2 4] [--iterations 5] [--budget-seconds 40]

Prints, per rank count, busbw per message size for all-reduce / all-gather / reduce-scatter (nccl-tests
formulas, docs/references.md section 6) and the fitted alpha-beta model, then the cost model's communication time for
the default scenario on the catalog cluster vs the measured one. Each launch is bounded (timeout 120 s).
"""

from __future__ import annotations

import argparse

from zeroplanner.probe import benchmark_collectives, cluster_from_probe


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--budget-seconds", type=float, default=40.0)
    args = p.parse_args()
    last = None
    for ranks in args.ranks:
        r = benchmark_collectives(ranks=ranks, iterations=args.iterations, budget_seconds=args.budget_seconds,
                                  timeout_seconds=120)
        if not r["ok"]:
            print(f"{ranks} ranks: {r['message']}")
            continue
        last = r
        print(f"{r['backend']} over {ranks} ranks ({r['elapsed_seconds']:.1f} s, truncated={r['truncated']})")
        for c in ("all_reduce", "all_gather", "reduce_scatter"):
            rows = [x for x in r["world"] if x["collective"] == c]
            f = r["fits"]["world"][c]
            sizes = "  ".join(f"{x['bytes'] >> 10:>6d} KiB {x['busbw_gb_per_s']:7.3f}" for x in rows)
            fit = (f"fit: busbw {f['busbw_gb_per_s']:.3f} GB/s, alpha {f['alpha_seconds'] * 1e6:.0f} us, "
                   f"max rel. error {f['max_relative_error']:.2f}" if f["ok"] else f"fit: {f['message']}")
            print(f"  {c:15s} busbw GB/s by size: {sizes}\n  {'':15s} {fit}")
    if last is not None:
        from zeroplanner.costmodel import estimate
        from zeroplanner.scenarios import default_scenario
        from zeroplanner.specs import replace

        s = default_scenario()
        cluster = cluster_from_probe({"cuda_available": False, "benchmarks": {"collectives": last}}, s.cluster)
        before, after = estimate(s), estimate(replace(s, cluster=cluster))
        print(f"default scenario communication per step: catalog {before.communication.seconds_per_step:.3f} s, "
              f"with the measured {last['backend']} fit {after.communication.seconds_per_step:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
