"""Build the optional C hot path; all metadata lives in pyproject.toml.

``optional=True``: where there is no compiler or no Python headers the build prints a
warning and the package installs without ``collector._hotpath`` (pure-Python fallback).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("collector._hotpath", ["collector/_hotpath.c"], optional=True)])
