"""Errors raised by durable.

The tree::

    DurableError                      every error of this package
    ├── ConfigError                   bad configuration or arguments from the user
    │   ├── UnknownWorkflowError      no workflow is registered under that name
    │   ├── NotJsonError              arguments or results that are not JSON values
    │   └── RunConflictError          an id reused: a run's for another workflow or other
    │                                 arguments, a signal's for another name or payload
    ├── StoreError                    the store could not do what was asked
    │   ├── StoreUnavailableError     the database cannot be opened or reached
    │   │   └── NotSentError          ... before the statement was sent: nothing was written
    │   └── SchemaVersionError        the database was written by a newer durable
    ├── StaleRecordError              a record changed since the run read it (compare-and-set)
    ├── RunNotFoundError              no run has that id
    │   └── RunPrunedError            ... any more: it was finished, and pruned (retention)
    ├── InvalidStateError             the run is not in a state that allows the operation
    ├── NonDeterminismError           a replay met a journaled step under another name or arguments
    ├── StepInDoubtError              a step started but its outcome is unknown (on_doubt="fail")
    ├── ResultUnknownError            the workflow used the result of a step accepted without one
    ├── ActivityError                 an activity failed after its retries (wraps the cause)
    └── NonRetryableError             raise it in an activity to fail the step without retrying

Control-flow signals derive from ``BaseException`` so that a user's ``except Exception``
cannot swallow them::

    BaseException
    └── AttemptCancelled              this attempt must stop (cancel, shutdown, timeout)
        └── LeaseLostError            the attempt no longer holds its lease and epoch: a write
                                      or an HTTP request of it was refused, nothing was done

The engine translates foreign exceptions (sqlite3, psycopg, httpx) once, at its boundary.
"""

from __future__ import annotations


class DurableError(Exception):
    """Base class of every error raised by durable."""


class ConfigError(DurableError):
    """Bad configuration or arguments supplied by the user."""


class UnknownWorkflowError(ConfigError):
    """No workflow is registered under the given name."""


class NotJsonError(ConfigError):
    """A value that must be JSON (workflow arguments, results) is not."""


class RunConflictError(ConfigError):
    """An id was reused for something else: a run id for a different workflow, different
    arguments or another key; a signal id for another signal name or payload."""


class StoreError(DurableError):
    """The store failed."""


class StoreUnavailableError(StoreError):
    """The database cannot be opened or reached."""


class NotSentError(StoreUnavailableError):
    """The database could not be reached (or was busy) before the statement was sent or its
    transaction began, or it refused the transaction (a full disk, a server turned
    read-only, a deadlock broken): nothing was written, so the write may be tried again (a
    fenced write holds only while its lease does). Any other StoreError of a write leaves
    its outcome unknown."""


class SchemaVersionError(StoreError):
    """The database schema is newer than this version of durable understands, or older and
    the store was opened with ``upgrade=False`` (the operator's read and control commands:
    ``durable migrate`` upgrades it)."""


class StaleRecordError(DurableError):
    """A record write was conditioned on the version the run read, and the record changed.

    Nothing of the call was written (neither records nor journal entries). Not a
    StoreError: the store worked, and trying again cannot succeed without a new read.
    """

    def __init__(self, namespace: str, key: str, expected: int, actual: int,
                 consequence: str = "not overwritten; read it again and decide") -> None:
        read = "absent" if expected == 0 else f"version {expected}"
        now = "absent" if actual == 0 else f"now {actual}"
        super().__init__(
            f"record {namespace}/{key} changed since this run read it ({read}, {now}): "
            f"{consequence}")
        self.namespace = namespace
        self.key = key
        self.expected = expected
        self.actual = actual


class RunNotFoundError(DurableError):
    """No run exists with the given id."""


class RunPrunedError(RunNotFoundError):
    """The run with the given id finished and was pruned (``durable prune``): its journal is
    gone; ``pruned`` (a :class:`durable.PrunedRun`) says how it ended, and when it was
    pruned."""

    def __init__(self, message: str, pruned: object = None) -> None:
        super().__init__(message)
        self.pruned = pruned


class InvalidStateError(DurableError):
    """The run's state does not allow the requested operation."""


class NonDeterminismError(DurableError):
    """Workflow code called a journaled step as another activity, or with other arguments,
    than the journal recorded: its journaled outcome would answer another call."""


class StepInDoubtError(DurableError):
    """A step was started by an earlier attempt and its outcome is unknown."""

    def __init__(self, message: str, *, step: int, step_key: str, activity: str) -> None:
        super().__init__(message)
        self.step = step
        self.step_key = step_key
        self.activity = activity


class ResultUnknownError(DurableError):
    """The workflow used the result of a step an operator accepted as done without a result
    (its activity has no lookup to find it)."""


class ActivityError(DurableError):
    """An activity failed for good (retries exhausted or a non-retryable error)."""

    def __init__(self, message: str, *, step: int, activity: str, error_type: str) -> None:
        super().__init__(message)
        self.step = step
        self.activity = activity
        self.error_type = error_type


class SignalTimeout(DurableError):
    """``ctx.wait_for(name, timeout=...)`` saw no signal ``name`` in time. The workflow may
    catch it; its firing is journaled, so a re-execution raises it again at the same wait."""

    def __init__(self, message: str, *, name: str, timeout: float | None, step: int) -> None:
        super().__init__(message)
        self.name = name
        self.timeout = timeout
        self.step = step


class NonRetryableError(DurableError):
    """Raise (or subclass) in an activity to fail its step at once, without retrying."""


class AttemptCancelled(BaseException):
    """Raised inside an attempt that must stop. Derives from BaseException on purpose."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LeaseLostError(AttemptCancelled):
    """The attempt lost its lease (or was superseded): its writes and requests are refused."""
