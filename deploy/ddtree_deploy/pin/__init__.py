"""The pin (what the series applies to) and the pinned wheel snapshot."""
