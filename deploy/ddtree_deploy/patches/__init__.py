"""The patch series: parsing, the strict apply engine, authoring."""
