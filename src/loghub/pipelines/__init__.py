"""Spark jobs shipped with LogHub: the reference access-log pipeline
(``loghub.pipelines.access_log``) and the ``loghub pipeline`` commands
(``loghub.pipelines.cli``).

Nothing is imported here, so that ``loghub.pipelines.cli`` can be mounted in the ``loghub``
command without importing pyspark (an optional extra) until a pipeline runs.
"""

__all__: list[str] = []
