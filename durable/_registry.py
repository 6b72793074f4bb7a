"""Declaring workflows and activities, and the registry the worker runs them from."""

from __future__ import annotations

import functools
import inspect
import math
import random
from collections.abc import Awaitable, Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    TypeVar,
    cast,
    overload,
)

import attrs
import httpx

from ._errors import ConfigError, NonRetryableError, UnknownWorkflowError
from ._types import check_printable, check_seconds

if TYPE_CHECKING:
    from ._context import ActivityContext, WorkflowContext
    from ._schedules import ScheduleSpec

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
OnDoubt = Literal["retry", "fail"]


def _exception_types(value: Any) -> tuple[type[BaseException], ...]:
    """``RetryPolicy.non_retryable`` as the tuple ``isinstance`` takes: one class or a
    list of them accepted, anything else refused when the policy is made (at the worker,
    inside a step's failure, it left the step in doubt)."""
    found = ((value,) if isinstance(value, type)
             else tuple(value) if isinstance(value, list | tuple | set | frozenset) else None)
    if found is None or not all(isinstance(t, type) and issubclass(t, BaseException)
                                for t in found):
        raise ConfigError(f"RetryPolicy.non_retryable must be exception classes, not "
                          f"{value!r}")
    return found


@attrs.frozen
class RetryPolicy:
    """How an activity's step is retried: exponential backoff with jitter and a cap.

    ``max_tries`` counts the first try: ``max_tries=3`` executes the step at most three times
    in all, across the run's attempts (a worker that died, or lost its lease, while the step
    ran used a try; a try its own attempt interrupted, by a cancel or a shutdown, did not). A
    step whose tries ran out that way each time fails the run, naming the step, instead of
    killing workers forever. A replay gives a step it runs again a fresh budget. (Tries are
    a step's executions; attempts are a run's claims.) An exception of a type in
    ``non_retryable`` (or any :class:`durable.NonRetryableError`) fails the step at once. A
    429/503 answer's ``Retry-After`` (an ``httpx.HTTPStatusError`` or any exception with a
    ``retry_after`` attribute in seconds) is honoured, up to ``max_delay``.
    """

    max_tries: int = 3
    initial_delay: float = 0.5
    backoff: float = 2.0
    max_delay: float = 30.0
    jitter: float = 0.2
    non_retryable: tuple[type[BaseException], ...] = attrs.field(
        default=(), converter=_exception_types)

    def __attrs_post_init__(self) -> None:
        if isinstance(self.max_tries, bool) or not isinstance(self.max_tries, int):
            raise ConfigError(f"RetryPolicy.max_tries must be a whole number, not "
                              f"{self.max_tries!r}")
        if self.max_tries < 1:
            raise ConfigError("RetryPolicy.max_tries must be at least 1")
        check_seconds(self.initial_delay, "RetryPolicy.initial_delay", zero=True)
        check_seconds(self.max_delay, "RetryPolicy.max_delay", zero=True)
        if not (math.isfinite(self.backoff) and self.backoff >= 1):
            raise ConfigError(f"RetryPolicy.backoff must be a finite number >= 1, not "
                              f"{self.backoff!r}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"RetryPolicy.jitter must be between 0 and 1, not {self.jitter!r}")

    def retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, NonRetryableError):
            return False
        return not isinstance(exc, self.non_retryable)

    def delay(self, try_number: int, exc: BaseException | None = None,
              rng: random.Random | None = None) -> float:
        """Seconds to wait after failed try number ``try_number`` (1-based)."""
        retry_after = retry_after_of(exc) if exc is not None else None
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        base = min(self.initial_delay * self.backoff ** (try_number - 1), self.max_delay)
        spread = base * self.jitter
        return max(0.0, base + (rng or random).uniform(-spread, spread))


NO_RETRY = RetryPolicy(max_tries=1)


def retry_after_of(exc: BaseException) -> float | None:
    """The server-requested delay carried by an exception, if any."""
    value = getattr(exc, "retry_after", None)
    if value is None and isinstance(exc, httpx.HTTPStatusError):
        if exc.response.status_code in (429, 503):
            value = exc.response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class _NotDone:
    """The type of :data:`NOT_DONE`."""

    _instance: _NotDone | None = None

    def __new__(cls) -> _NotDone:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "durable.NOT_DONE"

    def __reduce__(self) -> str:
        return "NOT_DONE"


NOT_DONE: Any = _NotDone()
"""What an activity's lookup returns when the step did not take effect (safe to run it)."""

Lookup = Callable[..., Awaitable[Any]]


_WORKFLOW_CONTEXT: list[type[WorkflowContext]] = []


def _workflow_context() -> type[WorkflowContext]:
    """:class:`durable.WorkflowContext` (imported once, on the first step: _context imports
    this module)."""
    if not _WORKFLOW_CONTEXT:
        from ._context import WorkflowContext

        _WORKFLOW_CONTEXT.append(WorkflowContext)
    return _WORKFLOW_CONTEXT[0]


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def check_arguments(fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> None:
    """Raise the TypeError that ``fn(ctx, *args)`` would (``"{what}: missing a required
    argument: 'name'"``), without calling it: a start's arguments are checked when it is
    queued, not at its run's first attempt."""
    try:
        _signature(fn).bind(None, *args)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None


def check_name(name: object, what: str) -> None:
    """A declaration's name: a string a start, a list and a line can give and show."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{what} must be a non-empty string, not {name!r}")
    check_printable(name, what)


def check_callable(fn: object, what: str) -> None:
    """Raise a ConfigError naming ``what`` unless the engine can call ``fn`` as it does:
    ``await fn(ctx, *args)``, arguments by position. Checked when an activity, a workflow or
    a lookup is declared: a plain function declared an activity ran its effect (a delete)
    before the engine's await of its result failed, a TypeError the retry policy retried,
    so the delete ran ``max_tries`` times; a missing context or a keyword-only argument
    failed only at the worker, on the run's first attempt."""
    if not callable(fn):
        raise ConfigError(f"{what} must be declared with async def: {fn!r} is not a function")
    label = getattr(fn, "__qualname__", None) or repr(fn)
    if inspect.isasyncgenfunction(inspect.unwrap(fn)):
        raise ConfigError(f"{what} must be declared with async def returning its result: "
                          f"{label} is an async generator (it yields)")
    call = type(fn).__call__  # an object's: async def __call__
    if not any(inspect.iscoroutinefunction(f) for f in (fn, inspect.unwrap(fn), call)):
        raise ConfigError(
            f"{what} must be declared with async def: {label} is a plain function (its "
            "effects would happen before the engine could time, retry or journal them); "
            "run blocking code from an async def with await ctx.to_thread(fn, ...)")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # not introspectable: called as it is
        return
    try:
        signature.bind_partial(None)
    except TypeError:
        raise ConfigError(f"{what} must take the context as its first argument: async def "
                          f"{getattr(fn, '__name__', label)}(ctx, ...)") from None
    required = [p.name for p in signature.parameters.values()
                if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if required:
        raise ConfigError(
            f"{what} takes keyword-only arguments without defaults ({', '.join(required)}); "
            "the journal keeps arguments as a list: make them positional")


def parameters_text(fn: Callable[..., Any]) -> str:
    """What ``fn(ctx, ...)`` takes after the context, for a message: ``(slot, dry_run=...)``."""
    shown = []
    for param in list(_signature(fn).parameters.values())[1:]:
        name = (f"*{param.name}" if param.kind is param.VAR_POSITIONAL
                else f"**{param.name}" if param.kind is param.VAR_KEYWORD else param.name)
        shown.append(name if param.default is param.empty else f"{name}=...")
    return f"({', '.join(shown)})"


def positional(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               what: str) -> tuple[Any, ...]:
    """``args`` and ``kwargs`` of a call of ``fn(ctx, ...)`` as positional arguments only:
    what the journal keeps (a run's or a step's arguments are a JSON list).

    The same as the call by position would give: ``f(ctx, "a")`` and ``f(ctx, text="a")``
    are both ``("a",)`` (a default is filled in only where a later argument needs its
    place), so a start by keyword is idempotent with one by position.
    """
    if not kwargs:
        return args
    try:
        bound = inspect.signature(fn).bind(None, *args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None
    given = bound.arguments
    out: list[Any] = []
    defaults: list[Any] = []  # of parameters not given, kept until a later one is
    keyword_only: list[str] = []
    for param in list(bound.signature.parameters.values())[1:]:
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            if param.name in given:
                out += [*defaults, given[param.name]]
                defaults = []
            else:
                defaults.append(param.default)
        elif param.kind is param.VAR_POSITIONAL:
            out += given.get(param.name, ())
        elif param.name in given:  # keyword-only, or **kwargs
            keyword_only += given[param.name] if param.kind is param.VAR_KEYWORD \
                else [param.name]
    if keyword_only:
        raise ConfigError(
            f"{what} takes keyword-only arguments ({', '.join(keyword_only)}); the journal "
            "keeps arguments as a list: make them positional")
    return tuple(out)


class Activity(Generic[P, R]):
    """A journaled operation: ``await act(ctx, *args)``, or ``await ctx.step(act, *args)``.

    Typed by the decorated function: ``Activity[P, R]`` takes the arguments ``P`` after the
    context and returns ``R``, so a type checker sees a wrong argument or a misused result
    in the workflow calling it. Arguments given by keyword are journaled by position.
    """

    def __init__(
        self,
        fn: Callable[Concatenate[ActivityContext, P], Awaitable[R]],
        *,
        name: str,
        timeout: float | None,
        retry: RetryPolicy,
        on_doubt: OnDoubt,
        lookup: Lookup | None = None,
    ) -> None:
        check_name(name, "an activity's name")
        check_callable(fn, f"activity {name!r}")
        if not isinstance(retry, RetryPolicy):
            raise ConfigError(f"activity {name!r}: retry must be a durable.RetryPolicy, not "
                              f"{retry!r}")
        if lookup is not None:
            check_callable(lookup, f"the lookup of activity {name!r}")
        if on_doubt not in ("retry", "fail"):
            raise ConfigError(f"on_doubt must be 'retry' or 'fail', not {on_doubt!r}")
        if timeout is not None:
            check_seconds(timeout, "an activity timeout")
        self.fn = fn
        self.name = name
        self.timeout = timeout
        self.retry = retry
        self.on_doubt: OnDoubt = on_doubt
        self.lookup_fn: Lookup | None = lookup
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def lookup(self, fn: Callable[Concatenate[ActivityContext, P], Awaitable[T]]
               ) -> Callable[Concatenate[ActivityContext, P], Awaitable[T]]:
        """Declare ``async def find(ctx, *args)``: what happened to a step of this activity.

        Called with the step's own arguments (and an :class:`ActivityContext` of the step:
        its idempotency key, the fenced ``ctx.http``) when a step is in doubt, and when an
        operator accepted an in-doubt step as done (``replay --accept-in-doubt``). It
        returns the step's result if the step took effect (journaled as the step's result,
        so the workflow goes on with it), :data:`durable.NOT_DONE` if it did not (the step
        runs), or raises if it cannot tell (the step stays in doubt: ``on_doubt`` applies).
        """
        check_callable(fn, f"the lookup of activity {self.name!r}")
        self.lookup_fn = fn
        return fn

    async def __call__(self, ctx: WorkflowContext | ActivityContext, *args: P.args,
                       **kwargs: P.kwargs) -> R:
        if isinstance(ctx, _workflow_context()):
            return await ctx.step(self, *args, **kwargs)
        return await self.fn(cast("ActivityContext", ctx), *args, **kwargs)

    def bind(self, *args: P.args, **kwargs: P.kwargs) -> BoundActivity[R]:
        """This activity with its arguments, checked by a type checker like a call:
        ``await ctx.step(act.bind(item), key=f"item-{item}")`` is a keyed step whose
        arguments are checked too (next to ``key``, ``ctx.step(act, item, key=...)``'s
        cannot be)."""
        return BoundActivity(self, positional(self.fn, args, kwargs, f"activity {self.name}"))

    def __repr__(self) -> str:
        return f"<durable.Activity {self.name}>"


@attrs.frozen
class BoundActivity(Generic[R]):
    """An activity and its arguments (:meth:`Activity.bind`), for :meth:`WorkflowContext.step`."""

    activity: Activity[..., R]
    args: tuple[Any, ...]


class Workflow(Generic[P, R]):
    """A registered workflow function, typed by it: ``Workflow[P, R]`` takes the arguments
    ``P`` after the context and returns ``R`` (:meth:`durable.Client.start` checks them)."""

    def __init__(
        self,
        fn: Callable[Concatenate[WorkflowContext, P], Awaitable[R]],
        *,
        name: str,
        timeout: float | None,
        start_within: float | None = None,
    ) -> None:
        check_name(name, "a workflow's name")
        check_callable(fn, f"workflow {name!r}")
        if timeout is not None:
            check_seconds(timeout, "a workflow timeout")
        if start_within is not None:
            check_seconds(start_within, "a workflow's start_within")
        self.fn = fn
        self.name = name
        self.timeout = timeout
        self.start_within = start_within
        """Its runs' first attempt must be claimed within this many seconds of their due
        time, or it fails them without running (a start's own ``start_within`` wins)."""
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    async def __call__(self, ctx: WorkflowContext, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self.fn(ctx, *args, **kwargs)

    def bind(self, *args: P.args, **kwargs: P.kwargs) -> BoundWorkflow[R]:
        """This workflow with its arguments, checked by a type checker like a call:
        ``await client.start(wf.bind(slot), id=..., key=slot)`` checks the arguments of a
        start with options too (next to them, ``client.start(wf, slot, key=...)``'s cannot
        be)."""
        return BoundWorkflow(self, self.arguments(args, kwargs))

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The arguments of a start, by position, as the journal keeps them; a TypeError if
        the function could not take them (:func:`check_arguments`)."""
        what = f"workflow {self.name}"
        found = positional(self.fn, args, kwargs, what)
        check_arguments(self.fn, found, what)
        return found

    def __repr__(self) -> str:
        return f"<durable.Workflow {self.name}>"


@attrs.frozen
class BoundWorkflow(Generic[R]):
    """A workflow and its arguments (:meth:`Workflow.bind`), for :meth:`Client.start`."""

    workflow: Workflow[..., R]
    args: tuple[Any, ...]


class Registry:
    """Workflows by name. The decorators register into :data:`default_registry`.

    A registry made with ``parent`` holds its own workflows and sees its parent's (a
    worker given explicit workflows besides the decorators' registry).
    """

    def __init__(self, parent: Registry | None = None) -> None:
        self._own: dict[str, Workflow[..., Any]] = {}
        self.parent = parent
        self.activities: dict[str, Activity[..., Any]] = {}
        self._schedules: dict[str, ScheduleSpec] = {}

    @property
    def schedules(self) -> dict[str, ScheduleSpec]:
        """Schedules declared in code (:func:`durable.schedule`), written by workers at
        start: this registry's own, and its parent's."""
        if self.parent is None:
            return self._schedules
        return {**self.parent.schedules, **self._schedules}

    def add_schedule(self, spec: ScheduleSpec) -> None:
        existing = self.schedules.get(spec.name)
        if existing is not None and not existing.same_definition(spec):
            raise ConfigError(f"two schedules are named {spec.name!r}")
        self._schedules[spec.name] = spec

    @property
    def workflows(self) -> dict[str, Workflow[..., Any]]:
        """Every workflow this registry knows, by name (its own, then its parent's)."""
        if self.parent is None:
            return self._own
        return {**self.parent.workflows, **self._own}

    def add_workflow(self, wf: Workflow[..., Any]) -> None:
        existing = self.workflows.get(wf.name)
        if existing is not None and existing.fn is not wf.fn:
            raise ConfigError(f"two workflows are named {wf.name!r}")
        self._own[wf.name] = wf

    def add_activity(self, act: Activity[..., Any]) -> None:
        existing = self.activities.get(act.name)
        if existing is not None and existing.fn is not act.fn:
            raise ConfigError(f"two activities are named {act.name!r}")
        self.activities[act.name] = act

    def workflow(self, name: str) -> Workflow[..., Any]:
        found = self._own.get(name)
        if found is not None:
            return found
        if self.parent is not None and name in self.parent.workflows:
            return self.parent.workflow(name)
        known = ", ".join(sorted(self.workflows)) or "none (did you pass --import?)"
        raise UnknownWorkflowError(f"unknown workflow {name!r}; known workflows: {known}")


default_registry = Registry()


def _name_of(fn: object) -> str:
    """A declaration's default name: its function's (a value that is none says itself)."""
    return str(getattr(fn, "__qualname__", None) or repr(fn))


WorkflowFn = Callable[Concatenate["WorkflowContext", P], Awaitable[R]]
ActivityFn = Callable[Concatenate["ActivityContext", P], Awaitable[R]]


@overload
def workflow(name: WorkflowFn[P, R], /) -> Workflow[P, R]: ...


@overload
def workflow(
    name: str | None = None, *, timeout: float | None = None,
    start_within: float | None = None, registry: Registry | None = None
) -> Callable[[WorkflowFn[P, R]], Workflow[P, R]]: ...


def workflow(
    name: str | WorkflowFn[P, R] | None = None, *, timeout: float | None = None,
    start_within: float | None = None, registry: Registry | None = None,
) -> Workflow[P, R] | Callable[[WorkflowFn[P, R]], Workflow[P, R]]:
    """Declare ``async def f(ctx, *args)`` a workflow named ``name`` (default: its name).

    ``@durable.workflow`` or ``@durable.workflow("name", timeout=...)``; the result is a
    :class:`Workflow` typed by ``f``. ``timeout``: seconds the run may take, counted from its
    first attempt's claim; ``start_within``: seconds after a run is due within which its
    first attempt must be claimed, or that attempt fails it without running any of its code
    (a deletion queued while no worker ran does not happen hours later). A start's own
    ``timeout`` and ``start_within`` take their places.
    """

    def decorate(fn: WorkflowFn[P, R]) -> Workflow[P, R]:
        wf = Workflow(fn, name=_name_of(fn) if label is None else label, timeout=timeout,
                      start_within=start_within)
        (registry or default_registry).add_workflow(wf)
        return wf

    if callable(name):
        label = None
        return decorate(name)
    label = name
    return decorate


@overload
def activity(name: ActivityFn[P, R], /) -> Activity[P, R]: ...


@overload
def activity(
    name: str | None = None,
    *,
    timeout: float | None = None,
    retry: RetryPolicy | None = None,
    on_doubt: OnDoubt = "retry",
    registry: Registry | None = None,
    lookup: Lookup | None = None,
) -> Callable[[ActivityFn[P, R]], Activity[P, R]]: ...


def activity(
    name: str | ActivityFn[P, R] | None = None,
    *,
    timeout: float | None = None,
    retry: RetryPolicy | None = None,
    on_doubt: OnDoubt = "retry",
    registry: Registry | None = None,
    lookup: Lookup | None = None,
) -> Activity[P, R] | Callable[[ActivityFn[P, R]], Activity[P, R]]:
    """Declare ``async def a(ctx, *args)`` an activity: journaled as a step in a workflow.

    ``@durable.activity`` or ``@durable.activity("name", ...)``; the result is an
    :class:`Activity` typed by ``a``. ``on_doubt`` says what a new attempt does with a step
    an earlier attempt started but never finished: ``"retry"`` runs it again (only for
    idempotent activities), ``"fail"`` fails the run and names the step, for an operator
    to resolve on replay. ``lookup`` (or ``@act.lookup``) finds out what happened to a step
    in doubt or accepted by an operator (see :meth:`Activity.lookup`).
    """

    def decorate(fn: ActivityFn[P, R]) -> Activity[P, R]:
        act = Activity(
            fn,
            name=_name_of(fn) if label is None else label,
            timeout=timeout,
            retry=retry if retry is not None else RetryPolicy(),
            on_doubt=on_doubt,
            lookup=lookup,
        )
        (registry or default_registry).add_activity(act)
        return act

    if callable(name):
        label = None
        return decorate(name)
    label = name
    return decorate
