"""The suite's tables and its goals (the figures the project aims for), printed from the JSON result."""

from __future__ import annotations

import sys

_COLUMNS = (
    ("target_only", "k=0"),
    ("ngram", "ngram"),
    ("model", "model"),
    ("hybrid", "hybrid"),
    ("hf_greedy", "hf"),
    ("hf_pld", "hf pld"),
    ("hf_assisted", "hf asst"),
)
_DRAFTERS = ("ngram", "model", "hybrid")


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def batch1_table(batch1: dict, repeats: int, out=None) -> None:
    out = out or sys.stdout  # looked up per call: a captured stdout may have closed since import
    for workload, summary in batch1["summary"].items():
        cols = [(m, name) for m, name in _COLUMNS if m in summary["tokens_per_s"]]
        print(f"\n== batch 1, workload {workload} (tokens/s, median of {repeats} repeats) ==", file=out)
        header = f"{'prompt':<34}" + "".join(f"{name:>8}" for _, name in cols)
        header += f"{'ng x':>7}{'pld x':>7}{'ng/pld':>7}{'md x':>7}{'accept':>7}{'ideal':>7}{'eff':>6}{'equal':>6}"
        print(header, file=out)
        rows = [(row["label"], row) for row in batch1["prompts"] if row["workload"] == workload] + [("median", summary)]
        for label, row in rows:
            ideal = row["ideal"].get("ngram", {})
            line = f"{label[:34]:<34}" + "".join(f"{_f(row['tokens_per_s'].get(m), '.2f'):>8}" for m, _ in cols)
            line += (
                f"{_f(row['speedup'].get('ngram'), '.2f'):>6}x{_f(row['speedup'].get('hf_pld'), '.2f'):>6}x"
                f"{_f(row['over_peer'].get('ngram'), '.2f'):>7}"
            )
            line += f"{_f(row['speedup'].get('model'), '.2f'):>6}x{_f(row['acceptance_rate'].get('ngram'), '.0%'):>7}"
            equal = "yes" if all(row["greedy_equal"].values()) else "NO"
            line += f"{_f(ideal.get('ideal_speedup'), '.2f'):>6}x{_f(ideal.get('efficiency'), '.2f'):>6}{equal:>6}"
            print(line, file=out)
        drafter_table(workload, summary, out)
        print(f"-- where a decode round's time goes (median ms), workload {workload} --", file=out)
        print(f"{'method':<14}{'draft':>8}{'forward':>9}{'transport':>10}{'coord':>8}{'round':>8}", file=out)
        for m, split in summary["time_split_ms"].items():
            print(
                f"{m:<14}{split['draft_wait']:>8.1f}{split['verify_compute']:>9.1f}"
                f"{split['verify_transport']:>10.1f}{split['coordination']:>8.2f}{split['round']:>8.1f}",
                file=out,
            )


def drafter_table(workload: str, summary: dict, out=None) -> None:
    """Each drafter beside its Leviathan ideal: speedup, per-token acceptance, acceptance by
    position, the cost ratio c and the ideal from them (medians over prompts)."""
    out = out or sys.stdout  # looked up per call: a captured stdout may have closed since import
    print(f"-- drafters, workload {workload}: measured vs the Leviathan ideal (medians over prompts) --", file=out)
    print(
        f"{'drafter':<8}{'x k=0':>7}{'accept':>8}{'alpha by position (1..6)':>32}"
        f"{'c':>7}{'mean k':>7}{'ideal':>7}{'eff':>6}",
        file=out,
    )
    for m in _DRAFTERS:
        if m not in summary["speedup"]:
            continue
        ideal = summary["ideal"].get(m, {})
        alphas = " ".join(f"{a:.2f}" for a in summary["alpha_by_position"].get(m, [])[:6]) or "-"
        print(
            f"{m:<8}{_f(summary['speedup'].get(m), '.2f'):>6}x{_f(summary['acceptance_rate'].get(m), '.0%'):>8}"
            f"{alphas:>32}{_f(ideal.get('c'), '.3f'):>7}{_f(ideal.get('mean_k'), '.1f'):>7}"
            f"{_f(ideal.get('ideal_speedup'), '.2f'):>6}x{_f(ideal.get('efficiency'), '.2f'):>6}",
            file=out,
        )


def concurrency_table(conc: dict, out=None) -> None:
    out = out or sys.stdout  # looked up per call: a captured stdout may have closed since import
    print("\n== concurrency (mixed workload) ==", file=out)
    print(
        f"{'streams':>7} {'arm':<11}{'tok/s':>8}{'x off':>7}{'x 1 str':>8}"
        f"{'tpot p50':>9}{'tpot p99':>9}{'ttft p50':>9}{'accept':>7}",
        file=out,
    )
    for level in sorted(conc["off"], key=int):
        for arm in conc:
            cell = conc[arm][level]
            over_off = cell["tokens_per_s"] / conc["off"][level]["tokens_per_s"]
            over_one = cell["tokens_per_s"] / conc[arm][min(conc[arm], key=int)]["tokens_per_s"]
            print(
                f"{level:>7} {arm:<11}{cell['tokens_per_s']:>8.1f}{over_off:>6.2f}x{over_one:>7.2f}x"
                f"{cell['tpot_ms_p50']:>7.0f}ms{cell['tpot_ms_p99']:>7.0f}ms{cell['ttft_ms_p50']:>7.0f}ms{cell['acceptance_rate']:>7.0%}",
                file=out,
            )


def goals(results: dict) -> list[dict]:
    """Each goal that this result measures: its figure, its target and whether it was met."""
    out = []

    def goal(name: str, figure: float | None, target: float, at_most: bool = False) -> None:
        if figure is not None:
            out.append(
                {
                    "goal": name,
                    "figure": figure,
                    "target": target,
                    "at_most": at_most,
                    "met": figure <= target if at_most else figure >= target,
                }
            )

    _batch1_goals(goal, results.get("batch1", {}).get("summary", {}))
    _concurrency_goals(goal, results.get("concurrency") or {})
    return out


def _batch1_goals(goal, summary: dict) -> None:
    if "copy" in summary:
        copy = summary["copy"]
        goal("copy, batch 1: ngram tokens/s over target-only", copy["speedup"].get("ngram"), 3.0)
        goal("copy, batch 1: ngram tokens/s over transformers' prompt lookup", copy["over_peer"].get("ngram"), 1.1)
    # The model drafters' goals: the distilled draft on free text, the hybrid on copies.
    if "free" in summary:
        free = summary["free"]
        best = max(
            (m for m in ("model", "hybrid") if m in free["speedup"]), key=lambda m: free["speedup"][m], default=None
        )
        if best:
            goal(f"free, batch 1: {best} drafter per-token acceptance", free["acceptance_rate"].get(best), 0.5)
            goal(f"free, batch 1: {best} drafter tokens/s over target-only", free["speedup"].get(best), 1.25)
    if "copy" in summary and {"hybrid", "ngram"} <= set(summary["copy"]["tokens_per_s"]):
        copy = summary["copy"]
        goal(
            "copy, batch 1: hybrid tokens/s over ngram's",
            copy["tokens_per_s"]["hybrid"] / copy["tokens_per_s"]["ngram"],
            1.0,
        )
    effs = [s["ideal"]["ngram"]["efficiency"] for s in summary.values() if "ngram" in s["ideal"]]
    if effs:
        goal("batch 1: efficiency (measured / Leviathan ideal), ngram, worst workload", min(effs), 0.9)
    if "free" in summary:
        goal("free, batch 1: ngram tokens/s over target-only", summary["free"]["speedup"].get("ngram"), 0.97)
    coord = [s["time_split_ms"]["ngram"]["coordination"] for s in summary.values() if "ngram" in s["time_split_ms"]]
    if coord:
        goal(
            "coordination per round, median ms (round minus draft and verify waits), worst workload",
            max(coord),
            2.0,
            at_most=True,
        )


def _concurrency_goals(goal, conc: dict) -> None:
    if conc and {"1", "16"} <= set(conc["load_aware"]):
        goal(
            "16 streams: aggregate tokens/s over one stream's (load-aware)",
            conc["load_aware"]["16"]["tokens_per_s"] / conc["load_aware"]["1"]["tokens_per_s"],
            4.0,
        )
    if conc and "64" in conc["load_aware"]:
        goal(
            "64 streams: load-aware tokens/s over speculation off",
            conc["load_aware"]["64"]["tokens_per_s"] / conc["off"]["64"]["tokens_per_s"],
            1.0,
        )


def print_report(results: dict, out=None) -> None:
    out = out or sys.stdout  # looked up per call: a captured stdout may have closed since import
    if results.get("batch1"):
        batch1_table(results["batch1"], results["config"]["repeats"], out)
    if results.get("concurrency"):
        concurrency_table(results["concurrency"], out)
    print("\n== goals ==", file=out)
    for g in results["goals"]:
        verdict, bound = "met " if g["met"] else "MISS", "<=" if g["at_most"] else ">="
        print(f"{verdict}  {g['goal']}: {g['figure']:.3g} (goal {bound} {g['target']})", file=out)
    if not results["greedy_equal"]:
        print("\nGREEDY EQUALITY FAILED: some output differs from target-only decoding", file=out)
