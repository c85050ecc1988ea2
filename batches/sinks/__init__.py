"""Sinks: where a batch's output lands, exactly once (the contract, and the Delta sinks)."""
