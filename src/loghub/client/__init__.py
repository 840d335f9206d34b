"""A Python client of the LogHub REST API (httpx). Never imports the server."""

from loghub.client.client import LogHubClient, PullResult, RawPullResult, ShardInfo

__all__ = ["LogHubClient", "PullResult", "RawPullResult", "ShardInfo"]
