"""`agentrl report RUN_DIR`: PNG plots and a one-page HTML summary of a run (architecture.md §10).

Reads `metrics.jsonl` (one JSON object per training step) and writes into `RUN_DIR/report/`:
reward.png (reward and success over steps), throughput.png, staleness.png (histogram),
sandbox_latency.png and index.html.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path
from typing import Any

from agentrl.evaluate import gain_line, group_changes, rl_gain, rl_span, tasks_label


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} an agentrl run directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def staleness_histogram(rows: list[dict[str, Any]]) -> dict[int, int]:
    """Sum the per-step `staleness_hist` dicts ({staleness: count}) over the run."""
    total: Counter[int] = Counter()
    for r in rows:
        for k, v in (r.get("staleness_hist") or {}).items():
            total[int(k)] += int(v)
    return dict(sorted(total.items()))


def _line_plot(path: Path, rows: list[dict[str, Any]], keys: list[str], title: str, ylabel: str) -> bool:
    import matplotlib  # heavy lazy load: only when a report draws its plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy lazy load: a report only

    fig, ax = plt.subplots(figsize=(6, 3.5))
    drawn = False
    for key in keys:
        xs, ys = _series(rows, key)
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3, label=key)
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def _hist_plot(path: Path, hist: dict[int, int]) -> None:
    import matplotlib  # heavy lazy load: only when a report draws its plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy lazy load: a report only

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if hist:
        ax.bar([str(k) for k in hist], list(hist.values()))
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("staleness at consumption (trainer version − generating version)")
    ax.set_xlabel("staleness")
    ax.set_ylabel("trajectories")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _heldout_plot(path: Path, evals: list[dict[str, Any]]) -> None:
    """Held-out success (Wilson 95% CI bars) over wall-clock time; the dashed line marks the end
    of the warm start (the evaluation that follows it starts there)."""
    import matplotlib  # heavy lazy load: only when a report draws its plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy lazy load: a report only

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if evals:
        xs = [r["wall_s"] / 60 for r in evals]
        ys = [r["heldout_success"] for r in evals]
        err = [[y - r["heldout_ci_low"] for y, r in zip(ys, evals)], [r["heldout_ci_high"] - y for y, r in zip(ys, evals)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label="held-out success (95% CI)")
        ax.plot(xs, [r["heldout_valid_call_rate"] for r in evals], marker="x", linestyle=":", label="valid-call rate")
        for r in evals:
            if r["phase"] == "warm_start":
                ax.axvline((r["wall_s"] - r["eval_s"]) / 60, color="grey", linestyle="--", label="warm start ends")
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no held-out evaluation (eval.enabled=false)", ha="center", va="center",
                transform=ax.transAxes)
    n = tasks_label(evals[0]["heldout_n"], evals[0].get("heldout_samples", 1)) if evals else "0"
    ax.set_title(f"held-out success ({evals[0]['split'] if evals else 'test'} split, n={n})")
    ax.set_xlabel("wall-clock (min)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


PLOTS: list[tuple[str, list[str], str, str]] = [
    ("reward.png", ["reward_mean", "success_rate"], "reward and success", "value"),
    ("throughput.png", ["tokens_per_s", "trajs_per_min"], "rollout throughput", "per second / minute"),
    ("sandbox_latency.png", ["sandbox_exec_p50_ms", "sandbox_exec_p99_ms"], "sandbox exec latency", "ms"),
    ("loss.png", ["loss", "kl_old_roll", "entropy", "clip_frac", "trm_masked_frac"], "trainer", "value"),
]


def write_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    for name, keys, title, ylabel in PLOTS:
        _line_plot(out / name, rows, keys, title, ylabel)
    hist = staleness_histogram(rows)
    _hist_plot(out / "staleness.png", hist)
    evals = _read_jsonl(run_dir / "eval.jsonl")
    _heldout_plot(out / "heldout.png", evals)
    warm = _read_jsonl(run_dir / "warm_start.jsonl")
    if warm:
        _line_plot(out / "warm_start.png", warm, ["sft_loss"], "warm start (SFT) loss", "cross-entropy")
    heldout = "".join(
        f"<tr><td>{html.escape(r['phase'])}</td><td>{r['step']}</td><td>{r['heldout_success']:.3f}</td>"
        f"<td>{r['heldout_ci_low']:.3f}–{r['heldout_ci_high']:.3f}</td><td>{tasks_label(r['heldout_n'], r.get('heldout_samples', 1))}</td>"
        f"<td>{r['heldout_turns_mean']:.2f}</td><td>{r['heldout_valid_call_rate']:.2f}</td></tr>" for r in evals)
    if heldout:
        heldout = ("<h2>held-out evaluation</h2><table><tr><td>phase</td><td>step</td><td>success</td>"
                   f"<td>95% CI</td><td>n</td><td>turns</td><td>valid calls</td></tr>{heldout}</table>")
        heldout += _gain_paragraph(evals) + _group_table(evals)

    summary_keys = ["step", "reward_mean", "success_rate", "turns_mean", "policy_tokens", "tokens_per_s",
                    "staleness_mean", "loss", "grad_norm", "wall_s"]
    last = rows[-1] if rows else {}
    first = rows[0] if rows else {}
    table = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{_fmt(first.get(k))}</td><td>{_fmt(last.get(k))}</td></tr>"
        for k in summary_keys)
    config = (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").exists() else ""
    images = "".join(f'<img src="{name}" alt="{name}">' for name in
                     ["heldout.png", "reward.png", "throughput.png", "staleness.png", "sandbox_latency.png",
                      "loss.png", *(["warm_start.png"] if warm else [])])
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>agentrl run {html.escape(run_dir.name)}</title>
<style>body{{font-family:sans-serif;max-width:1250px;margin:auto}}img{{width:600px;margin:4px}}
table{{border-collapse:collapse}}td{{border:1px solid #ccc;padding:2px 8px}}</style></head><body>
<h1>{html.escape(run_dir.name)}</h1><p>{len(rows)} steps. Staleness histogram: {html.escape(json.dumps(hist))}</p>
{heldout}<table><tr><td>metric</td><td>first step</td><td>last step</td></tr>{table}</table>
{images}<h2>config</h2><pre>{html.escape(config)}</pre></body></html>"""
    (out / "index.html").write_text(page)
    return out


def _gain_paragraph(evals: list[dict[str, Any]]) -> str:
    """RL's held-out gain (final against the warm start, or base) with its paired 95% CI, and the
    `eval.group_by` values whose successes it changed."""
    gain = rl_gain(evals)
    if gain is None:
        return ""
    start, final = rl_span(evals)
    changes = group_changes(start, final)
    moved = f"<p>by {html.escape(final['group_by'])}: {html.escape(', '.join(changes))}</p>" if changes else ""
    return f"<p>{html.escape(gain_line(gain))}</p>{moved}"


def _group_table(evals: list[dict[str, Any]]) -> str:
    """Held-out successes per value of `eval.group_by`, one column per evaluation."""
    counted = [r for r in evals if r.get("heldout_by_group")]
    if not counted:
        return ""
    key = html.escape(counted[-1]["group_by"])
    groups = sorted({g for r in counted for g in r["heldout_by_group"]})

    def cell(counts: dict[str, int] | None) -> str:
        return "" if counts is None else f"{counts['successes']}/{counts['n']}"

    head = "".join(f"<td>{html.escape(r['phase'])} ({r['step']})</td>" for r in counted)
    rows = "".join(f"<tr><td>{html.escape(g)}</td>"
                   + "".join(f"<td>{cell(r['heldout_by_group'].get(g))}</td>" for r in counted) + "</tr>"
                   for g in groups)
    return f"<h3>held-out successes per {key}</h3><table><tr><td>{key}</td>{head}</tr>{rows}</table>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape("" if v is None else str(v))
