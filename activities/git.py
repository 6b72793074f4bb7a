"""Run the real ``git`` program, cancellably.

Each command runs in a process group of its own (:func:`durable.process_group`). When the
awaiting scope is cancelled (a deadline, a lost lease), the whole group is SIGKILLed and
reaped before the cancellation goes on: git, and whatever git started
(``git-receive-pack`` and hooks on a local push, ``ssh``, ``git-remote-https``), stop. A
push abandoned by its caller does not carry on in the background, and its connections that
still hold unsent or unacknowledged bytes are reset, not closed: a push request lying whole
in the kernel's send queue (the remote slow to read it) is dropped, where a plain kill left
the kernel to deliver it after the cancel. When the worker process dies, the group is
killed too: a dead worker's push does not go on while its run is taken over.

A force push only happens with a lease: :func:`force_push_with_lease` names the commit
the remote ref must still be at, and raises :class:`StaleLeaseError` if it moved. Retrying
a push that already landed answers ``UP_TO_DATE`` (git compares before it checks the
lease), so a retry after a lost answer is safe.

Error messages and commands are stripped of URL credentials.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping

import anyio
import attrs
from anyio.abc import ByteReceiveStream

import durable

from .errors import redact_url

__all__ = [
    "GitError",
    "GitOutput",
    "PushRejectedError",
    "PushResult",
    "PushStatus",
    "StaleLeaseError",
    "clone",
    "commit",
    "force_push_with_lease",
    "init",
    "push",
    "remote_sha",
    "rev_parse",
    "run_git",
]

StrPath = str | os.PathLike[str]
_BASE_ENV = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "LANGUAGE": "C"}


def _redact_command(parts: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(redact_url(str(part)) for part in parts)


@attrs.define(auto_exc=True, eq=False)
class GitError(Exception):
    """git exited non-zero."""

    command: tuple[str, ...] = attrs.field(converter=_redact_command)
    returncode: int
    stderr: str = attrs.field(default="", converter=redact_url)

    def __str__(self) -> str:
        tail = self.stderr.strip().splitlines()[-3:]
        text = f"{' '.join(self.command)} exited with {self.returncode}"
        return f"{text}: {' / '.join(tail)}" if tail else text


@attrs.define(auto_exc=True, eq=False)
class PushRejectedError(GitError):
    """The remote refused to update ``ref`` (e.g. not a fast-forward, hook declined)."""

    ref: str = ""
    reason: str = ""

    def __str__(self) -> str:
        return f"push to {self.ref} rejected: {self.reason}"


@attrs.define(auto_exc=True, eq=False)
class StaleLeaseError(PushRejectedError):
    """``--force-with-lease`` refused: the remote ref is no longer at the expected commit."""


@attrs.frozen
class GitOutput:
    returncode: int
    stdout: str
    stderr: str


class PushStatus(enum.StrEnum):
    UPDATED = "updated"  # fast-forward
    FORCED = "forced"
    CREATED = "created"
    UP_TO_DATE = "up_to_date"


@attrs.frozen
class PushResult:
    ref: str
    status: PushStatus
    sha: str
    """The commit the remote ref is at now."""


async def _drain(stream: ByteReceiveStream, into: bytearray) -> None:
    async for chunk in stream:
        into.extend(chunk)


async def run_git(
    *args: str,
    cwd: StrPath | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    ctx: durable.ActivityContext | None = None,
) -> GitOutput:
    """Run ``git *args``; raises :class:`GitError` on a non-zero exit if ``check``.

    Cancellation kills git's whole process group (resetting its connections that still
    have bytes on their way), then waits (shielded, bounded) for it; so does the worker's
    death. Given the step's ``ctx``, git runs for its attempt (``ctx.process_group``): not
    started once the lease is lost, and killed when the lease's deadline passes without a
    renewal even if the worker cannot act (frozen). ``FileNotFoundError`` if there is no
    ``git``.
    """
    command = ("git", *args)
    full_env = {**os.environ, **_BASE_ENV, **(env or {})}
    stdout, stderr = bytearray(), bytearray()
    group = durable.process_group if ctx is None else ctx.process_group
    async with group(command, cwd=cwd, env=full_env) as process:
        assert process.stdout is not None and process.stderr is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_drain, process.stdout, stdout)
            tg.start_soon(_drain, process.stderr, stderr)
            await process.wait()
    returncode = process.returncode
    assert returncode is not None
    output = GitOutput(returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace"))
    if check and returncode != 0:
        raise GitError(command, returncode, output.stderr or output.stdout)
    return output


def _identity(name: str, email: str) -> dict[str, str]:
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }


def _full_ref(ref: str) -> str:
    return ref if ref.startswith("refs/") else f"refs/heads/{ref}"


async def init(
    path: StrPath, *, branch: str = "main", bare: bool = False, env: Mapping[str, str] | None = None
) -> None:
    """``git init`` a new (or re-init an existing) repository at ``path``."""
    await run_git(
        "init", "--quiet", "-b", branch, *(["--bare"] if bare else []), str(path), env=env
    )


async def clone(
    url: str, path: StrPath, *, branch: str | None = None, env: Mapping[str, str] | None = None,
    ctx: durable.ActivityContext | None = None,
) -> None:
    """Clone ``url`` into the new directory ``path``."""
    extra = ["--branch", branch] if branch else []
    await run_git("clone", "--quiet", *extra, "--", url, str(path), env=env, ctx=ctx)


async def rev_parse(
    repo: StrPath, rev: str = "HEAD", *, env: Mapping[str, str] | None = None
) -> str:
    """The full commit id ``rev`` names in the working copy ``repo``."""
    result = await run_git(
        "rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}", cwd=repo, env=env
    )
    return result.stdout.strip()


async def commit(
    repo: StrPath,
    message: str,
    *,
    add_all: bool = True,
    allow_empty: bool = False,
    author_name: str = "durable",
    author_email: str = "durable@localhost",
    env: Mapping[str, str] | None = None,
) -> str:
    """Commit (everything, if ``add_all``) and return the new commit id."""
    full_env = {**_identity(author_name, author_email), **(env or {})}
    if add_all:
        await run_git("add", "--all", cwd=repo, env=full_env)
    extra = ["--allow-empty"] if allow_empty else []
    await run_git("commit", "--quiet", "--no-verify", *extra, "-m", message, cwd=repo, env=full_env)
    return await rev_parse(repo, env=env)


async def remote_sha(
    remote: str, ref: str, *, cwd: StrPath | None = None, env: Mapping[str, str] | None = None,
    ctx: durable.ActivityContext | None = None,
) -> str | None:
    """The commit ``ref`` is at on ``remote`` (``git ls-remote``), or None if it has no such ref.

    An unreachable remote raises :class:`GitError`: it is not reported as "no ref".
    """
    full = _full_ref(ref)
    result = await run_git(
        "ls-remote", "--exit-code", "--", remote, full, cwd=cwd, env=env, check=False, ctx=ctx
    )
    if result.returncode == 2:
        return None
    if result.returncode != 0:
        raise GitError(("git", "ls-remote", remote, full), result.returncode, result.stderr)
    for line in result.stdout.splitlines():
        sha, _, name = line.partition("\t")
        if name == full:
            return sha
    return None


async def push(
    repo: StrPath,
    remote: str,
    ref: str,
    *,
    src: str = "HEAD",
    env: Mapping[str, str] | None = None,
    ctx: durable.ActivityContext | None = None,
) -> PushResult:
    """Push ``src`` to ``ref`` without force; raises :class:`PushRejectedError` if refused.
    Given the step's ``ctx``, git runs for its attempt (:func:`run_git`)."""
    return await _push(repo, remote, ref, src, [], env, ctx)


async def force_push_with_lease(
    repo: StrPath,
    remote: str,
    ref: str,
    *,
    expected_sha: str | None,
    src: str = "HEAD",
    env: Mapping[str, str] | None = None,
    ctx: durable.ActivityContext | None = None,
) -> PushResult:
    """Force-push ``src`` to ``ref`` only if the remote ref is still at ``expected_sha``.

    ``expected_sha=None`` means the ref must not exist yet. Raises :class:`StaleLeaseError`
    if the remote moved; never forces blindly.
    """
    lease = f"--force-with-lease={_full_ref(ref)}:{expected_sha or ''}"
    return await _push(repo, remote, ref, src, [lease], env, ctx)


_PUSH_FLAGS = {
    " ": PushStatus.UPDATED,
    "+": PushStatus.FORCED,
    "*": PushStatus.CREATED,
    "=": PushStatus.UP_TO_DATE,
}


async def _push(
    repo: StrPath,
    remote: str,
    ref: str,
    src: str,
    options: list[str],
    env: Mapping[str, str] | None,
    ctx: durable.ActivityContext | None,
) -> PushResult:
    full = _full_ref(ref)
    sha = await rev_parse(repo, src, env=env)
    args = ["push", "--porcelain", *options, "--", remote, f"{sha}:{full}"]
    result = await run_git(*args, cwd=repo, env=env, check=False, ctx=ctx)
    for line in result.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[1].partition(":")[2] != full:
            continue
        flag, summary = parts[0], parts[2]
        if flag == "!":
            reason = summary.partition("(")[2].rstrip(")") or summary
            error = StaleLeaseError if reason == "stale info" else PushRejectedError
            raise error(("git", *args), result.returncode, result.stderr, full, reason)
        if flag in _PUSH_FLAGS and result.returncode == 0:
            return PushResult(full, _PUSH_FLAGS[flag], sha)
    raise GitError(("git", *args), result.returncode, result.stderr or result.stdout)
