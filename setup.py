"""The one compiled part: the producer's encoder (src/loghub/client/_encode.c).

Everything else is in pyproject.toml. The extension is optional: where no C compiler is
found, the install goes on and `loghub produce` uses its pure-Python path, which gives the
same bytes (tests/unit/test_producer.py holds the two to that)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "loghub.client._encode",
            ["src/loghub/client/_encode.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
