"""The operator's desk: status, health and reset of a pipeline.

Plain functions and typed results; no typer, no rich (that is ``lowmark.batches.cli``).
"""
