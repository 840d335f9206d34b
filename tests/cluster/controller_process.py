"""A node that campaigns for the controller role and then writes, fenced, every 100 ms.

Run by tests/cluster/test_control_plane.py as a real process, so that the test can SIGSTOP it
past its lease and SIGCONT it: each write's outcome is printed on its own line ("wrote N",
"fenced", "refused N", "error ..."), so the test reads what the resumed old controller could do.

    python controller_process.py ETCD_URL NODE_ID TTL_S
"""

from __future__ import annotations

import asyncio
import sys

from loghub.cluster.etcd_store import EtcdStore
from loghub.cluster.membership import ControllerRole, NodeInfo, NodeMembership
from loghub.errors import ControlPlaneError, FencedError

KEY = "/loghub/test/controlled"


async def main(url: str, node_id: str, ttl_s: int) -> None:
    async with EtcdStore(url, call_timeout_s=1.0, retry_budget_s=2.0) as store:
        membership = NodeMembership(store, NodeInfo(node_id, "127.0.0.1:0"), ttl_s=ttl_s)
        await membership.start()
        role = ControllerRole(membership, poll_s=0.05)
        fence = await role.campaign()
        print(f"controller {fence.create_revision}", flush=True)
        count = 0
        while True:
            await asyncio.sleep(0.1)
            try:
                current = await store.get(KEY)
                expected = 0 if current is None else current.mod_revision
                count += 1
                value = f"{node_id} {count}".encode()
                if await store.compare_and_swap(KEY, value, expected, fence=fence):
                    print(f"wrote {count}", flush=True)
                else:
                    print(f"refused {count}", flush=True)
            except FencedError:
                print("fenced", flush=True)
                return
            except ControlPlaneError as exc:
                print(f"error {exc}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
