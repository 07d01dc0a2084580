"""One-off tools (the example pool's generator, the tiny VLM's builder, the rows digest). A
package so that benches and tests import them as ``scripts.<name>``; each still runs as a
file (``python scripts/make_example_pool.py``) or a module (``python -m scripts.<name>``)."""
