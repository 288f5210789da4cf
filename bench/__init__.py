"""Benchmarks and the scripts that render their results into ``docs/`` (``bench/README.md``):
a package, so that its scripts and the tests import its library modules (``bench.report``,
``bench.netemlib``, ...) by name. Run the scripts from the repository root with netcoll
importable (``pip install -e .``, or ``PYTHONPATH=$PWD``)."""
