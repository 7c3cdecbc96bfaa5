# The native engine is built by cffi (out-of-line API mode); everything else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["zeroboot_kernel/_build_native.py:ffibuilder"])
