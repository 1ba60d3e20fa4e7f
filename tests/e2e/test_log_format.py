"""One log format for coop and uvicorn: a real coordinator's output, uvicorn's own lines included."""
from __future__ import annotations

import re
import signal

from conftest import Coordinator, run_config

# coop.cli's LOG_FORMAT: "%(asctime)s %(levelname)s %(name)s: %(message)s"
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


def test_uvicorn_logs_in_coops_format(tmp_path, procs):
    coordinator = procs(Coordinator(tmp_path, run_config(rounds={"max_rounds": 1})))
    coordinator.status()  # it is up and serving
    coordinator.popen.send_signal(signal.SIGTERM)
    coordinator.popen.wait(30)
    lines = [line for line in coordinator.output().splitlines() if line.strip()]
    assert any(" uvicorn.error: " in line for line in lines), lines  # uvicorn's start-up and shutdown lines
    assert any(" coop.coordinator: " in line for line in lines), lines
    assert all(LINE.match(line) for line in lines), [line for line in lines if not LINE.match(line)]
