"""rsieve's benchmarks (bench/README.md). A package, run from the repository root as modules:
``python -m bench.bench_pipeline``; they import each other as ``bench.<name>``."""
