"""LogHub: a self-hosted log hub that speaks the LogHub (Alibaba Cloud Log Service) protocol."""

from loghub.errors import LogHubError

__all__ = ["LogHubError", "__version__"]

__version__ = "0.1.0"
