"""The micro-batch loop: plan, run and commit batches.

Also catch-up, follow mode, backfills, poison batches, maintenance and fault injection.
"""
