"""The web console at /console: a real server, a running consumer group, and Debian's
Chromium driven headless through chromedriver, reading what a person would see."""

from __future__ import annotations

import base64
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from heartbeat_members import HeartbeatMembers
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from server_process import ServerProcess

from loghub.client import LogHubClient
from loghub.wire.logs import make_log_group

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "console.png"


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("needs chromium and chromium-driver (scripts/ensure-system-deps.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1150",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def test_the_console_shows_each_shard_with_its_owner_and_lag_while_a_group_runs(
    tmp_path: Path, browser: webdriver.Chrome
) -> None:
    server = ServerProcess(tmp_path / "data").start()
    stop = threading.Event()
    try:
        with LogHubClient(server.endpoint) as client:
            client.create_project("shop")
            client.create_logstore("shop", "orders", shard_count=2)
            client.create_logstore("shop", "clicks", shard_count=1)
            client.split_shard("shop", "orders", 1)  # shard 1 -> 2 and 3: lineage to show
            shard_ids = [s.shard_id for s in client.list_shards("shop", "orders")]
            assert shard_ids == [0, 1, 2, 3]
            group = make_log_group([(1_700_000_000, {"order": "x" * 40})] * 4)
            written = {0: 7, 2: 5, 3: 3}
            for shard_id, count in written.items():
                for _ in range(count):
                    client.put_log_group("shop", "orders", group, shard_id=shard_id)
                    if shard_id == 0:
                        time.sleep(0.25)  # shard 0's data spans seconds: a lag in seconds
            client.create_consumer_group("shop", "orders", "billing", timeout_s=10)
            # billing has read 2 groups of shard 0 and all of shard 3
            cursor = client.get_cursor("shop", "orders", 0, "begin")
            client.update_checkpoint("shop", "orders", "billing", 0, _advance(cursor, 2))
            client.update_checkpoint(
                "shop", "orders", "billing", 3, client.get_cursor("shop", "orders", 3, "end")
            )
            expected_lag = {0: 5, 1: 0, 2: 5, 3: 0}

            def click_traffic() -> None:  # the ingest chart has something to draw
                with LogHubClient(server.endpoint) as producer:
                    while not stop.wait(0.1):
                        producer.put_log_group("shop", "clicks", group)

            threading.Thread(target=click_traffic, daemon=True).start()
            where = (server.endpoint, "shop", "orders", "billing")
            with HeartbeatMembers(*where, ["worker-a", "worker-b"]) as members:
                # shard 1 is read-only and empty: over; the other three are shared
                _wait_for(lambda: len(members.owners()) == 3)
                browser.get(f"http://{server.endpoint}/console")
                _wait_for(lambda: len(_group_rows(browser)) == 4)
                time.sleep(7)  # a few refreshes: the page updates itself, the chart fills
                owners = members.owners()
                rows = _group_rows(browser)
                shot = tmp_path / "console.png"
                assert browser.save_screenshot(str(shot))
            lineage = {
                row["data"]["shard"]: row["cells"]["lineage"]
                for row in _rows(browser, '#shards tr.shard[data-logstore="shop/orders"]')
            }
            rates = [
                row["cells"]["rate"]
                for row in _rows(browser, '#logstores tr[data-logstore="shop/clicks"]')
            ]
    finally:
        stop.set()
        server.stop()
    for shard_id in shard_ids:
        owner, state, lag_groups, lag_s = rows[shard_id]
        assert owner == owners.get(shard_id, "—"), (shard_id, rows)
        assert lag_groups == expected_lag[shard_id], (shard_id, rows)
        assert state == ("over" if shard_id == 1 else "already_alloc"), (shard_id, rows)
        if shard_id == 0:  # groups 2..6 of shard 0 were written 4 x 0.25 s apart
            assert 0.9 <= lag_s <= 10.0, rows
        else:
            assert lag_s < 1.0, rows
    assert set(owners.values()) == {"worker-a", "worker-b"}
    assert lineage == {"0": "—", "1": "into 2, 3", "2": "from 1", "3": "from 1"}
    assert len(rates) == 1 and float(rates[0]) > 0
    assert shot.stat().st_size > 10_000
    if os.environ.get("LOGHUB_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, DOCS_SCREENSHOT)


def _advance(cursor: str, by: int) -> str:
    return base64.b64encode(str(int(base64.b64decode(cursor)) + by).encode()).decode()


# Reads a table in one script call: the page replaces its rows on every refresh, so element
# references taken one by one could go stale between two reads.
_READ_ROWS = """
return Array.from(document.querySelectorAll(arguments[0])).map((row) => {
  const cells = {};
  for (const cell of row.children) for (const name of cell.classList) cells[name] = cell.innerText;
  return {data: Object.assign({}, row.dataset), cells: cells};
});
"""


def _rows(browser: webdriver.Chrome, selector: str) -> list[dict[str, dict[str, str]]]:
    rows: list[dict[str, dict[str, str]]] = browser.execute_script(_READ_ROWS, selector)
    return rows


def _group_rows(browser: webdriver.Chrome) -> dict[int, tuple[str, str, int, float]]:
    """Shard id -> (owner, state, lag in groups, lag in seconds), as the page shows them."""
    rows = {}
    for row in _rows(browser, '#groups tr.group-shard[data-group="billing"]'):
        cells = row["cells"]
        rows[int(row["data"]["shard"])] = (
            cells["owner"],
            cells["state"],
            int(cells["lag-groups"]),
            float(cells["lag-seconds"]),
        )
    return rows


def test_the_console_needs_a_key_when_keys_are_set(signed_server: ServerProcess) -> None:
    base = f"http://{signed_server.endpoint}"
    good = httpx.BasicAuth("ak", "sk")
    with httpx.Client(trust_env=False) as http:
        refused = http.get(f"{base}/console")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Basic ")
        assert refused.json()["errorCode"] == "Unauthorized"
        wrong = http.get(f"{base}/console/api/overview", auth=httpx.BasicAuth("ak", "nope"))
        assert wrong.status_code == 401
        assert http.get(f"{base}/console/static/console.js").status_code == 401
        page = http.get(f"{base}/console", auth=good)
        assert page.status_code == 200 and "LogHub console" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        script = http.get(f"{base}/console/static/console.js", auth=good)
        assert script.status_code == 200 and "/console/api/overview" in script.text
        overview = http.get(f"{base}/console/api/overview", auth=good)
        assert overview.status_code == 200 and "logstores" in overview.json()
        unknown = http.get(f"{base}/console/static/nope.js", auth=good)
        assert unknown.status_code == 400 and unknown.json()["errorCode"] == "ParameterInvalid"
        posted = http.post(f"{base}/console/api/overview", auth=good)
        assert posted.status_code == 400 and posted.json()["errorCode"] == "ParameterInvalid"
