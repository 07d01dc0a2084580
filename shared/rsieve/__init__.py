"""rsieve: rejection-sampled supervised fine-tuning data for vision-language models.

The package is a functional core (schemas, protocols, cleaning rules, prompts, think and
verdict parsing, row assembly, run accounting: pure functions, no I/O) plus thin adapters
(`rsieve.adapters`: S3 storage, Celery queues, the Triton model client) and the local
process stack (`rsieve_cli.local`). Services in `services/` are shells around the core.
"""

__version__ = "0.1.0"
