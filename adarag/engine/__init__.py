"""adarag.engine."""
