# The native engine is built by cffi (out-of-line API mode); everything else is in pyproject.toml.
# cffi compiles it against CPython's limited API (zeroboot_kernel/_native.abi3.so), so the wheel is
# tagged abi3: one wheel serves every CPython from 3.11 on.
from setuptools import setup

setup(cffi_modules=["zeroboot_kernel/_build_native.py:ffibuilder"],
      options={"bdist_wheel": {"py_limited_api": "cp311"}})
