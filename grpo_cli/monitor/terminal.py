"""The one stderr console every command prints through.

User text reaches it (paths, reward targets such as `pkg.mod:fn`, data values): rich would read
`:b:` in `a:b:c` as an emoji code and print a picture, so emoji codes are off everywhere. Markup is
escaped where a line mixes it with user text (`rich.markup.escape`).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console


def stderr_console(**options: Any) -> Console:
    """A console on stderr that prints user text as written (no emoji codes)."""
    return Console(stderr=True, emoji=False, **options)
