"""The consumer library: consume a logstore with a consumer group, one processor per shard.

``ConsumerWorker(MyProcessor, ConsumerConfig(...))`` runs in a thread (``start``) or as the
main loop (``run``); ``run_processes`` runs N of them as supervised processes on one machine;
``loghub consume`` does either from the command line. Shards are shared either by the
server's consumer group (heartbeats; works with the hosted service) or by leases in SQLite or
PostgreSQL. ``docs/consumer.md`` has a quick start, the guarantees and every setting.
"""

from loghub.consumer.checkpoint import Checkpointer
from loghub.consumer.config import ConsumerConfig, CoordinationMode, ProcessErrorPolicy
from loghub.consumer.multiprocess import WorkerSupervisor, run_processes
from loghub.consumer.processor import ConsumerProcessor, ProcessorFactory
from loghub.consumer.shard_consumer import ShardConsumer, ShardState
from loghub.consumer.worker import ConsumerWorker, WorkerStatistics, run_until_signal

__all__ = [
    "Checkpointer",
    "ConsumerConfig",
    "ConsumerProcessor",
    "ConsumerWorker",
    "CoordinationMode",
    "ProcessErrorPolicy",
    "ProcessorFactory",
    "ShardConsumer",
    "ShardState",
    "WorkerStatistics",
    "WorkerSupervisor",
    "run_processes",
    "run_until_signal",
]
