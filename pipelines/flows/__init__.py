"""Prefect flows; each module exposes ``add_cli(subparsers)`` for the ``forgetful`` CLI."""
