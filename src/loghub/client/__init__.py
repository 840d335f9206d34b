"""A Python client of the LogHub REST API (httpx). Never imports the server."""

from loghub.client.client import LogHubClient, PulledBody, PullResult, RawPullResult, ShardInfo

__all__ = ["LogHubClient", "PullResult", "PulledBody", "RawPullResult", "ShardInfo"]
