"""The compiled parts: the producer's encoder (src/loghub/client/_encode.c), the server's
check of PutLogs bodies (src/loghub/wire/_logcheck.c), the read path's record walk
(src/loghub/storage/_gather_c.c) and the Spark decoder's log scan
(src/loghub/spark/_scan.c).

Everything else is in pyproject.toml. The extensions are optional: where no C compiler is
found, the install goes on and each falls back to its pure-Python twin, which gives the same
answers (tests/unit/test_producer.py, test_logcheck.py, test_gather.py and
test_spark_decode_native.py hold
the pairs to that)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "loghub.client._encode",
            ["src/loghub/client/_encode.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        Extension(
            "loghub.wire._logcheck",
            ["src/loghub/wire/_logcheck.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        Extension(
            "loghub.storage._gather_c",
            ["src/loghub/storage/_gather_c.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        Extension(
            "loghub.spark._scan",
            ["src/loghub/spark/_scan.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
    ]
)
