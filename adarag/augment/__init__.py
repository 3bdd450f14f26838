"""adarag.augment."""
