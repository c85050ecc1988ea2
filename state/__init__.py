"""lowmark's durable state: checkpoint tables kept as Delta tables.

Knows Spark and Delta; knows nothing of Dagster or of how a batch is computed.
"""
