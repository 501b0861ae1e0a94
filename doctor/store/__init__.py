"""The run directory: the only code that knows its files."""
