"""``python -m durable.worker``: claim and run workflows until SIGTERM or SIGINT."""

from ._cli import worker_main

if __name__ == "__main__":
    raise SystemExit(worker_main())
