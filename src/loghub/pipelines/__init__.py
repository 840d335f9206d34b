"""Spark jobs shipped with LogHub: the reference access-log pipeline
(``loghub.pipelines.access_log``) and the ``loghub pipeline`` commands
(``loghub.pipelines.cli``).

Nothing is imported here, so that ``loghub.pipelines.cli`` can be mounted in the ``loghub``
command without importing pyspark (an optional extra) until a pipeline runs.
"""

__all__ = ["SPARK_EXTRA_MISSING", "spark_is_missing"]

SPARK_EXTRA_MISSING = (
    "the Spark pipelines need PySpark and PyArrow, which come with the spark extra:"
    " pip install 'openloghub[spark]'"
)
"""What to tell someone who runs a pipeline where the extra is not installed."""

# The modules of the spark extra and what they import: missing any, a pipeline cannot run.
_SPARK_MODULES = frozenset(("pyspark", "pyarrow", "py4j"))


def spark_is_missing(exc: ImportError) -> bool:
    """Whether ``exc`` says a module of the spark extra is not installed (and not that
    something else is broken, which must not be explained away as a missing extra)."""
    return isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in (
        _SPARK_MODULES
    )
