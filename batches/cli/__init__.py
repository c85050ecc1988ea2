"""The engine's ``lowmark`` command line: the typer app, how it shows things, its logs."""
