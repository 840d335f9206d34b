"""The cluster: LogHub nodes on an etcd control plane (see docs/cluster.md)."""

__all__: list[str] = []
