"""The event-time stage: windows and their state, aggregates, watermarks."""
