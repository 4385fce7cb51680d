"""`agentrl report RUN_DIR`: PNG plots and a one-page HTML summary of a run (design §10).

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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

    summary_keys = ["step", "reward_mean", "success_rate", "turns_mean", "policy_tokens", "tokens_per_s",
                    "staleness_mean", "loss", "grad_norm", "wall_s"]
    last = rows[-1] if rows else {}
    first = rows[0] if rows else {}
    table = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{_fmt(first.get(k))}</td><td>{_fmt(last.get(k))}</td></tr>"
        for k in summary_keys)
    config = (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").exists() else ""
    images = "".join(f'<img src="{name}" alt="{name}">' for name in
                     ["reward.png", "throughput.png", "staleness.png", "sandbox_latency.png", "loss.png"])
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>agentrl run {html.escape(run_dir.name)}</title>
<style>body{{font-family:sans-serif;max-width:1250px;margin:auto}}img{{width:600px;margin:4px}}
table{{border-collapse:collapse}}td{{border:1px solid #ccc;padding:2px 8px}}</style></head><body>
<h1>{html.escape(run_dir.name)}</h1><p>{len(rows)} steps. Staleness histogram: {html.escape(json.dumps(hist))}</p>
<table><tr><td>metric</td><td>first step</td><td>last step</td></tr>{table}</table>
{images}<h2>config</h2><pre>{html.escape(config)}</pre></body></html>"""
    (out / "index.html").write_text(page)
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape("" if v is None else str(v))
