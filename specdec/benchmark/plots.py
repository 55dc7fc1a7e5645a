"""The suite's four PNG plots, drawn from its JSON result alone (so a result can be re-plotted:
`python -m specdec.benchmark.plots results.json`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

_ARM_STYLE = {
    "off": ("tab:gray", "speculation off (k = 0)"),
    "on": ("tab:orange", "speculation on"),
    "load_aware": ("tab:blue", "load-aware"),
}
_SPLIT = (
    ("draft_wait", "waiting for drafts"),
    ("verify_compute", "target forward pass"),
    ("verify_transport", "verify transport, queueing"),
    ("coordination", "coordinator"),
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, title: str, axes=()) -> None:
    """Grid and legend on `axes` (when something is labelled), the title, and the file."""
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def speedup_vs_concurrency(results: dict, path: Path) -> None:
    plt = _pyplot()
    conc = results["concurrency"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, (color, label) in _ARM_STYLE.items():
        levels = sorted(int(n) for n in conc[arm])
        left.plot(levels, [conc[arm][str(n)]["tokens_per_s"] for n in levels], "o-", color=color, label=label)
        right.plot(
            levels,
            [conc[arm][str(n)]["tokens_per_s"] / conc["off"][str(n)]["tokens_per_s"] for n in levels],
            "o-",
            color=color,
            label=label,
        )
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
    left.set_ylabel("aggregate tokens/s")
    right.set_ylabel("tokens/s over speculation off")
    right.axhline(1.0, color="black", lw=0.8)
    _save(fig, path, "Throughput under concurrency (mixed workload)", (left, right))


def acceptance_by_position(results: dict, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for workload, _summary in results["batch1"]["summary"].items():
        for method, style in (("ngram", "o-"), ("model", "s--"), ("hybrid", "^:")):
            curves = [
                row["acceptance_by_position"][method]
                for row in results["batch1"]["prompts"]
                if row["workload"] == workload and row["acceptance_by_position"].get(method)
            ]
            if not curves:
                continue
            depth = max(map(len, curves))
            mean = [
                sum(c[i] for c in curves if i < len(c)) / sum(1 for c in curves if i < len(c)) for i in range(depth)
            ]
            ax.plot(range(1, depth + 1), mean, style, label=f"{method}, {workload}")
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafted at this position")
    ax.set_ylim(0, 1.05)
    _save(fig, path, "Acceptance by position (batch 1, mean over prompts)", (ax,))


def time_split(results: dict, path: Path) -> None:
    plt = _pyplot()
    bars = [
        (f"{m}\n{w}", split) for w, s in results["batch1"]["summary"].items() for m, split in s["time_split_ms"].items()
    ]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(bars)), 4.5))
    bottom = [0.0] * len(bars)
    for part, label in _SPLIT:
        values = [split[part] for _, split in bars]
        ax.bar(range(len(bars)), values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(bars)), [name for name, _ in bars], fontsize=8)
    ax.set_ylabel("ms per decode round (median)")
    _save(fig, path, "Where a round's time goes (batch 1, through the stack)", (ax,))


def tokens_over_time(results: dict, path: Path, bin_s: float = 2.0) -> None:
    plt = _pyplot()
    conc = results["concurrency"]
    top = str(max(int(n) for n in conc["off"]))
    fig, ax = plt.subplots(figsize=(8, 4))
    for arm, (color, label) in _ARM_STYLE.items():
        events = conc[arm][top]["events"]
        bins = [0] * (int(conc[arm][top]["seconds"] / bin_s) + 1)
        for t, n in events:
            bins[int(t / bin_s)] += n
        ax.plot([i * bin_s for i in range(len(bins))], [b / bin_s for b in bins], color=color, label=label)
    ax.set_xlabel("seconds since the streams started")
    ax.set_ylabel(f"tokens/s ({bin_s} s bins)")
    _save(fig, path, f"Aggregate tokens/s over time, {top} concurrent streams", (ax,))


def draw_all(results: dict, out_dir: Path) -> list[Path]:
    paths = []
    if results.get("batch1"):
        for name, draw in (("acceptance_by_position.png", acceptance_by_position), ("time_split.png", time_split)):
            draw(results, out_dir / name)
            paths.append(out_dir / name)
    if results.get("concurrency"):
        for name, draw in (
            ("speedup_vs_concurrency.png", speedup_vs_concurrency),
            ("tokens_over_time.png", tokens_over_time),
        ):
            draw(results, out_dir / name)
            paths.append(out_dir / name)
    return paths


if __name__ == "__main__":
    source = Path(sys.argv[1])
    for p in draw_all(json.loads(source.read_text()), source.parent):
        print(p)
