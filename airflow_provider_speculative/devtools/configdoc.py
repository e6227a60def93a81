"""Write the option table of docs/configuration.md from SpeculativeConfig's fields (``make docs``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from airflow_provider_speculative.core.config import options_table

BEGIN = "<!-- option table: generated from SpeculativeConfig's fields in core/config.py by `make docs`; edit there -->"
END = "<!-- end of the option table -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def with_table(text: str) -> str:
    """``text`` with the part between the markers replaced by the current option table."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"expected one {BEGIN!r} and, after it, one {END!r}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{options_table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Rewrite the table in place, or with ``--check`` exit 1 when it is out of date."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the table differs; write nothing")
    parser.add_argument("--path", type=Path, default=DOC)
    args = parser.parse_args(argv)
    text = args.path.read_text()
    new = with_table(text)
    if args.check:
        if new != text:
            print(f"{args.path}: the option table is out of date; run `make docs`", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
