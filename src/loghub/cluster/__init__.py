"""The cluster: LogHub nodes on an etcd control plane (see docs/cluster.md).

``etcd_store`` is LogHub's interface to etcd (the only module that knows the client library);
``membership`` keeps a node's lease and campaigns for the controller role; ``controller``
runs the placement rule of ``loghub.coordination.placement`` and writes its result, fenced.
Import the modules by name: importing this package needs no etcd client.
"""

__all__: list[str] = []
