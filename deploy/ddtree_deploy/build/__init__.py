"""Building the patched tree: build/check, the manifest, the import overlay for tests and tools."""
