"""slime.utils.startup_profile: marks are seconds since $SLIME_START_TIME, logged and appended to
$SLIME_STARTUP_PROFILE as JSON lines; without a clock a mark does nothing."""

import json
import logging
import time

from slime.utils import startup_profile as sp


def test_marks_since_the_command_started(monkeypatch, tmp_path, caplog):
    profile = tmp_path / "profile.jsonl"
    monkeypatch.setenv(sp.START_ENV, repr(time.time() - 2.0))
    monkeypatch.setenv(sp.PROFILE_ENV, str(profile))
    with caplog.at_level(logging.INFO, logger=sp.__name__):
        sp.mark("ray started")
        sp.mark("engines up")
    rows = [json.loads(line) for line in profile.read_text().splitlines()]
    assert [r["event"] for r in rows] == ["ray started", "engines up"]
    assert all(2.0 <= r["t"] < 60.0 for r in rows) and rows[0]["t"] <= rows[1]["t"]
    assert "startup +2." in caplog.text and "engines up" in caplog.text


def test_start_clock_keeps_the_launchers_zero(monkeypatch):
    import os

    monkeypatch.setenv(sp.START_ENV, "123.5")
    sp.start_clock()
    assert os.environ[sp.START_ENV] == "123.5"
    monkeypatch.delenv(sp.START_ENV)
    sp.start_clock()
    assert 0.0 <= sp.since_start() < 5.0


def test_no_clock_no_mark(monkeypatch, tmp_path):
    profile = tmp_path / "profile.jsonl"
    monkeypatch.delenv(sp.START_ENV, raising=False)
    monkeypatch.setenv(sp.PROFILE_ENV, str(profile))
    assert sp.since_start() is None
    sp.mark("anything")
    monkeypatch.setenv(sp.START_ENV, "not a time")
    sp.mark("anything")
    assert not profile.exists()
