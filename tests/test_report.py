"""Writing a prediction: its stages logged as it runs; the demo's figure split at S."""

import logging

import numpy as np

from tailaware.protocol import plots, report
from tests.test_diagnostics import SETTINGS, sample


def messages(caplog):
    return [r.getMessage() for r in caplog.records]


def test_report_logs_each_stage(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        report.report(sample(), SETTINGS, 4000, str(tmp_path))
    got = messages(caplog)
    start = "estimating and predicting hardness of 6 queries by count"
    assert any(
        m.startswith(start) and "mAP@10 at N = 4,000" in m and m.endswith("...") for m in got
    )
    assert any(m.startswith("estimating and predicting: done in") for m in got), got
    assert (tmp_path / "prediction.json").exists()


def test_gallery_figure_never_joins_a_curve_across_the_sample_size():
    s = 1000.0
    grid = np.array([100.0, 300.0, 999.0, s, 3000.0, 1e4])
    # A curve with a jump at S, like the homogeneous estimator's two branches.
    curves = {"a": [0.5, 0.45, 0.4, 0.9, 0.7, 0.6], "b": [0.5, 0.5, 0.5, 0.5, 0.4, 0.3]}
    fig = plots.gallery_figure(([1e4], [0.3]), (grid, curves), (s, 0.9), 10)
    lines = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata())]
    solid = [ln for ln in lines if ln.get_linestyle() == "-"]
    dotted = [ln for ln in lines if ln.get_linestyle() == ":"]
    assert len(solid) == len(dotted) == len(curves)
    assert all(min(ln.get_xdata()) == s for ln in solid)
    assert all(max(ln.get_xdata()) < s for ln in dotted)
    for a, b in zip(solid, dotted, strict=True):
        assert a.get_color() == b.get_color()
