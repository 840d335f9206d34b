"""LogHub imports httpx without httpx's command-line client (``loghub/_httpx.py``), and the
``httpx`` command still works. Each case runs in a fresh interpreter: the test process has
long imported everything."""

from __future__ import annotations

import subprocess
import sys


def fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_client_imports_no_command_line_packages() -> None:
    # the packages are installed (typer needs them), so httpx alone would import them
    assert fresh("import rich, click, pygments").returncode == 0
    proc = fresh(
        "import sys, loghub.client, loghub.spark._client\n"
        "print(sorted(m for m in ('rich', 'click', 'pygments', 'httpx._main')"
        " if m in sys.modules))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_httpx_main_still_runs_the_real_command_line_client() -> None:
    proc = fresh("import loghub.client, httpx\nhttpx.main(['--help'])")
    assert proc.returncode == 0, proc.stderr
    assert "--method" in proc.stdout  # the real client's help
    proc = fresh("import loghub.client, httpx._main as cli\nprint(cli.main.name)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "main"  # the real click command, not the stand-in


def test_an_httpx_imported_before_loghub_is_left_as_it_is() -> None:
    proc = fresh(
        "import httpx, sys\nreal = httpx.main\nimport loghub.client\n"
        "print(httpx.main is real, 'httpx._main' in sys.modules)"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True True"
