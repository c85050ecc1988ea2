"""lowmark's engine: pipelines, sources, sinks and the micro-batch loop.

Uses ``state`` for everything durable; knows nothing of Dagster.
"""
