"""Placeholder: commands are registered here by the part of the project that owns them."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    return None
