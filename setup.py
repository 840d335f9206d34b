"""The compiled parts: the producer's encoder (src/loghub/client/_encode.c) and the server's
check of PutLogs bodies (src/loghub/wire/_logcheck.c).

Everything else is in pyproject.toml. The extensions are optional: where no C compiler is
found, the install goes on and each falls back to its pure-Python twin, which gives the same
answers (tests/unit/test_producer.py and tests/unit/test_logcheck.py hold them to that)."""

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
    ]
)
