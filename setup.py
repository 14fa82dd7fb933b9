"""Builds fastcore's Cython extensions; everything else is declared in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = ("_entries", "_fastcore", "_matcher", "_search")

setup(
    ext_modules=cythonize(
        [Extension(f"fastcore.{name}", [f"fastcore/{name}.pyx"], extra_compile_args=["-O3"]) for name in MODULES],
        compiler_directives={"language_level": "3"},
    )
)
