"""Builds fastcore's Cython extension; everything else is declared in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("fastcore._fastcore", ["fastcore/_fastcore.pyx"], extra_compile_args=["-O3"])],
        compiler_directives={"language_level": "3"},
    )
)
