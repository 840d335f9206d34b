"""A consumer worker stops on SIGTERM or SIGINT only: a pause (SIGSTOP, SIGCONT), which a
debugger, a container runtime or an operator may cause, must not stop it. Real processes and
real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

CHILD = """
import sys, types
from loghub.consumer.worker import run_until_signal

class Worker:
    config = types.SimpleNamespace(worker_name="w")
    def start(self): print("started", flush=True)
    def is_alive(self): return True
    def shutdown(self): print("shutdown", flush=True)

run_until_signal(Worker())
"""


def _start() -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "started"
    return child


def test_a_paused_worker_keeps_running_after_sigcont_and_stops_on_sigterm() -> None:
    child = _start()
    try:
        for _ in range(3):
            os.kill(child.pid, signal.SIGSTOP)
            time.sleep(0.3)
            os.kill(child.pid, signal.SIGCONT)
            time.sleep(0.5)
            assert child.poll() is None, "the worker stopped after a pause"
        os.kill(child.pid, signal.SIGTERM)
        out, _ = child.communicate(timeout=10)
        assert child.returncode == 0
        assert "shutdown" in out
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
