"""The provider's version (one place: setup.cfg, provider info and the package read it)."""

from __future__ import annotations

__version__ = "0.1.0"
