"""Writes BENCHMARKS.md from the figures of one `make bench` run: tables and PNG charts.

Reads every ``<name>.json`` that ``_results.save`` wrote in ``--results-dir`` (and
``run.json``, the runner's record of what ran, if there is one), draws one chart per
benchmark with matplotlib (Agg: no display needed) into the same directory as
``<name>.png``, and writes ``--out``: the machine, the date, the commit, a summary of the
figures that have a goal, then per benchmark a table (case, metric, runs, min / median / max,
the reference and its median, the ratio of medians, the goal) with its notes and chart.

    .venv/bin/python benchmarks/report.py [--results-dir benchmarks/results] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load(results_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    documents = []
    run: dict[str, Any] = {}
    for path in sorted(results_dir.glob("*.json")):
        document = json.loads(path.read_text())
        if path.name == "run.json":
            run = document
        elif isinstance(document, dict) and "rows" in document:
            document.setdefault("benchmark", path.stem)
            documents.append(document)
    order = [str(record.get("script")) for record in run.get("scripts", [])]
    documents.sort(
        key=lambda d: (order.index(d["benchmark"]) if d["benchmark"] in order else len(order),
                       d["benchmark"])
    )  # fmt: skip
    return documents, run


def number(value: float | None) -> str:
    """Figures as a reader wants them: 3 significant digits, thousands separated."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def goal_met(row: dict[str, Any]) -> str:
    """ "yes"/"no" for a goal written as ``≥ 2×`` (on the ratio) or ``≤ 20 ms`` / ``≥ 1,000,000
    logs/s`` (on the median); "" when the goal has no such form or there is no figure."""
    match = re.match(r"\s*([≥≤]|>=|<=)\s*([\d,.]+)\s*(×|x\b)?", row.get("goal") or "")
    if not match:
        return ""
    bound = float(match.group(2).replace(",", ""))
    value = row.get("ratio") if match.group(3) else median(row.get("values") or [])
    if value is None:
        return ""
    at_least = match.group(1) in ("≥", ">=")
    return "yes" if (value >= bound if at_least else value <= bound) else "no"


def table(document: dict[str, Any]) -> list[str]:
    lines = [
        "| case | metric | runs | min | median | max | reference | ref. median | ratio | goal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in document["rows"]:
        values = row.get("values") or []
        reference = row.get("reference") or {}
        ratio = row.get("ratio")
        met = goal_met(row)
        goal = row.get("goal") or ""
        if goal and met:
            goal = f"{goal} ({met})"
        better = "" if row.get("higher_is_better", True) else " (lower is better)"
        cells = [
            row.get("case", ""),
            f"{row.get('metric', '')}{better}",
            str(len(values)),
            number(min(values)) if values else "-",
            number(median(values)),
            number(max(values)) if values else "-",
            reference.get("name", ""),
            number(median(reference.get("values") or [])),
            f"{ratio:.2f}×" if ratio is not None else "",
            goal,
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return lines


def chart(document: dict[str, Any], path: Path) -> bool:
    """One panel per metric: per row, the median as a bar with the min-max range, and the
    reference's median beside it. Returns False when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in document["rows"] if row.get("values")]
    if not rows:
        return False
    metrics: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        metrics.setdefault(row.get("metric", ""), []).append(row)
    heights = [0.55 * (len(group) * 2) + 1.0 for group in metrics.values()]
    figure, axes = plt.subplots(
        len(metrics), 1, figsize=(10, sum(heights)), squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )  # fmt: skip
    for axis, (metric, group) in zip(axes[:, 0], metrics.items(), strict=True):
        labels, values, errors, colors = [], [], [[], []], []
        drawn = set()  # a case compared with several references is drawn once
        for row in group:
            for label, runs, color in (
                (row.get("case", ""), row["values"], "tab:blue"),
                (
                    (row.get("reference") or {}).get("name", ""),
                    (row.get("reference") or {}).get("values") or [],
                    "tab:gray",
                ),
            ):
                key = (label, tuple(runs))
                if not runs or key in drawn:
                    continue
                drawn.add(key)
                middle = statistics.median(runs)
                labels.append(textwrap.fill(label, 40))
                values.append(middle)
                errors[0].append(middle - min(runs))
                errors[1].append(max(runs) - middle)
                colors.append(color)
        positions = list(range(len(values)))[::-1]
        axis.barh(positions, values, xerr=errors, color=colors, capsize=3)
        axis.set_yticks(positions, labels, fontsize=7)
        axis.set_xlabel(f"{metric} (median of runs, bar: min-max; gray: the reference)")
        axis.grid(axis="x", alpha=0.3)
    figure.suptitle(document.get("title", document["benchmark"]))
    figure.tight_layout()
    figure.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(figure)
    return True


def summary(documents: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| benchmark | case | metric | median | ratio | goal | met |",
        "|---|---|---|---|---|---|---|",
    ]
    count = 0
    for document in documents:
        for row in document["rows"]:
            if not row.get("goal"):
                continue
            count += 1
            ratio = row.get("ratio")
            reference = (row.get("reference") or {}).get("name", "")
            cells = [
                document["benchmark"],
                row.get("case", ""),
                row.get("metric", ""),
                number(median(row.get("values") or [])),
                f"{ratio:.2f}× {reference}" if ratio is not None else "",
                row["goal"],
                goal_met(row),
            ]
            lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return lines if count else []


def render(results_dir: Path, out: Path) -> str:
    documents, run = load(results_dir)
    machines = sorted({d.get("machine", "") for d in documents if d.get("machine")})
    finished = sorted(d.get("finished_at", "") for d in documents)
    lines = [
        "# Benchmarks",
        "",
        "Written by `benchmarks/report.py` from the figures of one `make bench` run "
        "(`benchmarks/run_all.py`); run it again rather than editing this file. Every figure is "
        "the median of several runs with their min and max; a ratio is the median over its "
        "reference's median, measured in the same run on the same machine, which carries from "
        "machine to machine better than the absolute figures do. The scripts, their options "
        "and what each measures: [docs/benchmarks.md](docs/benchmarks.md).",
    ]
    if machines:
        lines += ["", f"- Machine: {'; '.join(machines)}"]
    if run:
        smoke = " (smoke: tiny sizes, not figures)" if run.get("smoke") else ""
        lines.append(
            f"- Run: {run.get('started_at', '?')} to {run.get('finished_at', '?')}, commit "
            f"`{run.get('commit') or '?'}`{smoke}; load average (1/5/15 min) "
            f"{run.get('load_before')} before, {run.get('load_after')} after"
        )
        for rerun in run.get("reruns", []):  # scripts run again later (run_all --only)
            lines.append(
                f"- Run again: {', '.join(rerun.get('scripts', []))}, "
                f"{rerun.get('started_at', '?')} to {rerun.get('finished_at', '?')}, commit "
                f"`{rerun.get('commit') or '?'}`; load average {rerun.get('load_before')} "
                f"before, {rerun.get('load_after')} after"
            )
    elif finished:
        lines.append(f"- Date: {finished[0]} to {finished[-1]}")
    if not documents:
        lines += ["", "No figures yet: `make bench` writes them here."]
    goals = summary(documents)
    if goals:
        lines += ["", "## Goals", "", *goals]
    for document in documents:
        name = document["benchmark"]
        lines += ["", f"## {document.get('title', name)}", ""]
        lines.append(f"`benchmarks/{name}.py`, finished {document.get('finished_at', '?')}.")
        lines += ["", *table(document)]
        notes = document.get("notes") or []
        if notes:
            lines += ["", *[f"- {note}" for note in notes]]
        png = results_dir / f"{name}.png"
        if chart(document, png):
            relative = os.path.relpath(png, out.parent)
            lines += ["", f"![{name}]({Path(relative).as_posix()})"]
    if run:
        lines += [
            "",
            "## The run",
            "",
            "| script | arguments | exit | seconds | load before | load after | saved |",
            "|---|---|---|---|---|---|---|",
        ]
        for record in run.get("scripts", []):
            cells = [
                record.get("script"),
                " ".join(record.get("args") or []),
                record.get("exit"),
                record.get("seconds", ""),
                record.get("load_before", ""),
                record.get("load_after", ""),
                ", ".join(record.get("wrote") or []),
            ]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", default=str(HERE / "results"))
    parser.add_argument("--out", default=str(HERE.parent / "BENCHMARKS.md"))
    args = parser.parse_args()
    out = Path(args.out).resolve()
    render(Path(args.results_dir).resolve(), out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
