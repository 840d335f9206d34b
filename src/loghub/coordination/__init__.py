"""How shards are shared among consumers: pure logic, time passed in.

``balance`` decides who should hold what (shared by the server's consumer groups and the
client-side lease protocol); ``shard_state`` is the server-side per-shard state machine;
``group`` turns heartbeats into assignments; ``lease`` is the client-side lease protocol over
a compare-and-set ``LeaseStore`` (``lease_sql`` is that store on SQLite or PostgreSQL, the
one module here that does I/O; import it by name); ``placement`` decides which node of a
cluster holds which shard, and ``replica`` how a shard's replicas stay in sync (epochs,
fetch, high watermark, ISR, elections); import those two by name. The rest does
no I/O and takes time as an argument, so seeded simulations (``loghub.testing``) replay any
run exactly.
"""

from loghub.coordination.balance import loads, plan_moves, targets
from loghub.coordination.group import (
    ConsumerGroup,
    GroupStatistics,
    ShardView,
    consumer_name_chars_max,
    consumers_per_group_max,
    shards_per_group_max,
    timeout_ms_max,
)
from loghub.coordination.lease import (
    Decisions,
    LeaseCoordinator,
    LeaseStatistics,
    LeaseStore,
    lease_timeout_ms_default,
)
from loghub.coordination.shard_state import (
    ENTRY_STATES,
    PREVIOUS_STATES,
    ShardSlot,
    ShardState,
)

__all__ = [
    "ENTRY_STATES",
    "PREVIOUS_STATES",
    "ConsumerGroup",
    "Decisions",
    "GroupStatistics",
    "LeaseCoordinator",
    "LeaseStatistics",
    "LeaseStore",
    "ShardSlot",
    "ShardState",
    "ShardView",
    "consumer_name_chars_max",
    "consumers_per_group_max",
    "lease_timeout_ms_default",
    "loads",
    "plan_moves",
    "shards_per_group_max",
    "targets",
    "timeout_ms_max",
]
