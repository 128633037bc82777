"""The compiled alignment core (keeper/matching/_dpcore.c). Everything else about the package is in pyproject.toml.

The extension is optional: where it cannot be built (no C compiler), keeper runs the same kernels under numba
(keeper/matching/kernels.py), with a one-time compile or cache load per process instead of none.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("keeper.matching._dpcore", ["keeper/matching/_dpcore.c"], extra_compile_args=["-O3"],
                             optional=True)])
