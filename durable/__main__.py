"""``python -m durable``: start, list, show, cancel and replay runs."""

from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
