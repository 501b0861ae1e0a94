"""Pure stages from recorded data to a verdict."""
