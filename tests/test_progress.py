"""One progress mechanism: a stage's start, its heartbeat with share, rate and ETA, its end."""

import logging
import re
import time

import pytest

from tailaware.io.progress import Progress


def messages(caplog):
    return [r.getMessage() for r in caplog.records]


def test_progress_logs_the_start_the_beats_and_the_end(caplog):
    with caplog.at_level(logging.INFO), Progress("stage X", "of Y", every_s=0.05):
        time.sleep(0.4)
    got = messages(caplog)
    assert got[0] == "stage X of Y ..." and got[-1].startswith("stage X: done in")
    assert any(m.startswith("stage X: ") and m.endswith("s so far") for m in got[1:-1])


def test_counted_units_give_the_share_rate_and_eta(caplog, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.INFO):
        with Progress("embedding", total=8, unit="files", items="images", every_s=0) as p:
            clock[0] += 10.0
            p.update(items=300)
            p.update(1, items=100, name="shard 0")  # 1 of 8 files in 10 s: 70 s left
            clock[0] += 10.0
            p.update(1, name="shard 1")  # 2 of 8 in 20 s: 60 s left; 400 images in 20 s
    got = messages(caplog)
    assert got[1] == "embedding: shard 0 done, 1/8 files (12.5%), 40.0 images/s, ETA 70 s"
    assert got[2] == "embedding: shard 1 done, 2/8 files (25.0%), 20.0 images/s, ETA 60 s"
    assert got[-1] == "embedding: done in 20.0 s" and len(got) == 4  # no heartbeat at 0


def test_the_heartbeat_reports_units_without_a_name(caplog):
    with (
        caplog.at_level(logging.INFO),
        Progress("scoring", total=4, unit="rows", every_s=0.05) as p,
    ):
        p.update(1)
        time.sleep(0.3)
    beats = [m for m in messages(caplog) if m.startswith("scoring: 1/4 rows (25.0%)")]
    assert beats and all(re.search(r"rows/s, ETA \d+ s$", m) for m in beats)


def test_an_error_inside_ends_without_a_done_line(caplog):
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError):
        with Progress("stage", every_s=0.05):
            raise RuntimeError("boom")
    assert not any("done in" in m for m in messages(caplog))
