import json
from pathlib import Path

import pytest

from agentrl.report import read_metrics, staleness_histogram, write_report


def test_report_writes_plots_and_html(tmp_path: Path) -> None:
    rows = [{"step": i, "reward_mean": 0.1 * i, "success_rate": 0.05 * i, "tokens_per_s": 50.0 + i,
             "staleness_hist": {"0": 3, "1": i}, "sandbox_exec_p50_ms": 9.0, "loss": 0.5 - 0.01 * i}
            for i in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.yaml").write_text("trainer:\n  steps: 5\n")
    out = write_report(tmp_path)
    for name in ["reward.png", "throughput.png", "staleness.png", "sandbox_latency.png", "index.html"]:
        assert (out / name).stat().st_size > 1000, name
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "index.html").read_text()
    assert "reward_mean" in page and "0.5" in page  # last reward_mean
    assert staleness_histogram(read_metrics(tmp_path)) == {0: 15, 1: 15}


def test_report_on_missing_run_is_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl"):
        write_report(tmp_path)
