"""durable.process_group and durable.abort_process_group: a program an activity runs.

The abort: a real process group (a shell and the Python program it started, a grandchild
of the test) holds two loopback connections: on one it wrote 64 KiB that the service has
not taken in (its receive window shut), on the other a few bytes the service read. The
abort resets the first (the service gets a reset, never the whole request) and closes the
second as usual (a FIN: nothing was outstanding), and the group is dead; where it may not
borrow the sockets, it says so and kills plainly.

The group: nothing of it outlives the block, a cancel kills it before going on, a forked
child does not keep it alive, and bound to an attempt's lease it is refused once the lease
is lost and lives on while the lease is renewed. Its death with the worker and at the
lease's deadline: ``tests/test_processes.py``.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import anyio
import anyio.abc
import pytest

import durable
import durable._processes

from .helpers import poll, running_worker, tcp_queues
from .ops import alive

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux")]

REQUEST = 65536

PROGRAM = """
import socket, sys, time
stuck = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
idle = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
idle.sendall(b"hello")
stuck.sendall(b"x" * {length})
print(stuck.getsockname()[1], idle.getsockname()[1], flush=True)
time.sleep(60)
"""


def _listener(small: bool) -> socket.socket:
    listener = socket.socket()
    if small:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's least
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


async def _end(conn: socket.socket, length: int) -> tuple[str, int]:
    """Read ``conn`` to its end: ("reset" or "end of stream", bytes received)."""
    received = 0
    conn.setblocking(False)
    with anyio.fail_after(10):
        while True:
            await anyio.wait_readable(conn)
            try:
                data = conn.recv(length)
            except ConnectionResetError:
                return "reset", received
            if not data:
                return "end of stream", received
            received += len(data)


async def _line(stream: anyio.abc.ByteReceiveStream) -> bytes:
    """The next line a program writes (this test's programs write one at a time)."""
    line = b""
    while not line.endswith(b"\n"):
        line += await stream.receive()
    return line


def _whole_request_written(stuck: socket.socket, port: int) -> bool:
    """Whether the program's whole request is written: part taken in by the service's
    kernel (``stuck``, not read), the rest unacknowledged in the program's (from ``port``)."""
    queues = tcp_queues(("127.0.0.1", port), stuck.getsockname())
    try:
        taken = len(stuck.recv(REQUEST, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        taken = 0
    return queues is not None and queues[0] > 0 and queues[0] + taken == REQUEST


async def test_the_group_is_killed_and_only_its_connections_with_bytes_on_their_way_reset(
        tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(PROGRAM.replace("{length}", str(REQUEST)))
    with _listener(small=True) as service, _listener(small=False) as other:
        # the shell starts the program and waits: the sockets are a grandchild's
        process = await anyio.open_process(
            ["sh", "-c", f'"{sys.executable}" "{script}" {service.getsockname()[1]} '
                         f'{other.getsockname()[1]} & wait'],
            stdin=subprocess.DEVNULL, start_new_session=True)
        async with process:
            with anyio.fail_after(20):  # the program connects first thing
                await anyio.wait_readable(service)
            stuck, _ = service.accept()
            idle, _ = other.accept()
            with stuck, idle:
                assert idle.recv(5) == b"hello"
                assert process.stdout is not None
                ports = (await _line(process.stdout)).split()  # once it has written
                stuck_port, idle_port = int(ports[0]), int(ports[1])
                await poll(lambda: _whole_request_written(stuck, stuck_port))
                assert tcp_queues(("127.0.0.1", idle_port), other.getsockname()) == (0, 0)

                assert await durable.abort_process_group(process.pid) == 1

                assert await process.wait() == -9  # the shell: SIGKILLed with its group
                ended, received = await _end(stuck, REQUEST)
                assert (ended, received < REQUEST) == ("reset", True), (ended, received)
                assert await _end(idle, 16) == ("end of stream", 0)


async def test_a_group_already_gone_is_nothing_to_abort() -> None:
    process = await anyio.open_process(["true"], start_new_session=True)
    async with process:
        await process.wait()
    assert await durable.abort_process_group(process.pid) == 0


async def test_nothing_of_the_group_outlives_the_block(tmp_path: Path) -> None:
    """The command leaves a process of its group behind (a hook's background job, say):
    the block's end kills it (its watcher, once the block lets go of the pipe)."""
    pid_file = tmp_path / "left.pid"
    async with durable.process_group(
            ["sh", "-c", f"sleep 60 & echo $! > {pid_file}"]) as process:
        assert await process.wait() == 0
        left = int(pid_file.read_text())
        assert alive(left)
    await poll(lambda: not alive(left), timeout=5)


async def test_a_cancelled_block_kills_the_group_before_the_cancel_goes_on() -> None:
    with anyio.CancelScope() as scope:
        async with durable.process_group(["sleep", "60"]) as process:
            scope.cancel()
            await process.wait()
    assert process.returncode == -9  # SIGKILLed, and reaped before the block ended


async def test_a_cancelled_block_resets_its_programs_connections_with_bytes_on_their_way(
        tmp_path: Path) -> None:
    """A cancel (an operator's, a step's timeout) that ends the block while the program's
    request lies whole in the kernel's send queue: the group is aborted, so the service
    gets a reset, never the whole request. A plain kill at the end of the block (the
    reap's) would leave those bytes to the kernel, which goes on sending them."""
    script = tmp_path / "client.py"
    script.write_text(PROGRAM.replace("{length}", str(REQUEST)))
    with _listener(small=True) as service, _listener(small=False) as other:
        with anyio.CancelScope() as scope:
            async with durable.process_group(
                    [sys.executable, str(script), str(service.getsockname()[1]),
                     str(other.getsockname()[1])], stderr=None) as process:
                with anyio.fail_after(20):  # the program connects first thing
                    await anyio.wait_readable(service)
                stuck, _ = service.accept()
                idle, _ = other.accept()
                assert process.stdout is not None
                ports = (await _line(process.stdout)).split()  # once it has written
                await poll(lambda: _whole_request_written(stuck, int(ports[0])))
                scope.cancel()
                await process.wait()
        assert process.returncode == -9
        with stuck, idle:
            ended, received = await _end(stuck, REQUEST)
            assert (ended, received < REQUEST) == ("reset", True), (ended, received)


async def test_a_program_not_found_is_said_before_anything_runs() -> None:
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        async with durable.process_group(["no-such-program"]):
            pass


async def test_a_child_forked_without_exec_does_not_keep_the_groups_alive() -> None:
    """A copy of the worker's end of a watcher's pipe in a forked child (multiprocessing's
    fork) would keep the group alive after the worker died: the child closes its copies."""
    async with durable.process_group(["sleep", "60"]) as process:
        held = set(durable._processes._held)
        assert len(held) == 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: 3.12
            pid = os.fork()
        if pid == 0:  # the child: only checks its descriptors, then leaves at once
            open_fds = [fd for fd in held if _is_open(fd)]
            os._exit(len(open_fds))
        _, status = await anyio.to_thread.run_sync(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the forked child kept the pipe"
        process.terminate()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


async def test_a_program_outlives_the_first_lease_deadline_while_the_lease_is_renewed(
        client: durable.Client, registry: durable.Registry) -> None:
    """The watcher's deadline moves with each renewal: a program that runs for three leases
    ends by itself, not killed at the first lease's deadline (as it is when the worker
    stops renewing: ``test_a_push_does_not_outlive_its_worker_or_its_lease``)."""

    @durable.activity(registry=registry)
    async def long_program(ctx: durable.ActivityContext) -> int | None:
        async with ctx.process_group(["sleep", "1.5"]) as process:
            return await process.wait()

    @durable.workflow("proc.long", registry=registry)
    async def long(ctx: durable.WorkflowContext) -> int | None:
        return await long_program(ctx)

    async with running_worker(client, registry, lease=0.5):
        await client.start(long, id="long")
        run = await client.wait("long", timeout=20)
    assert (run.state, run.result) == (durable.RunState.COMPLETED, 0), run.error


async def test_a_program_is_not_started_for_an_attempt_that_lost_its_lease(
        client: durable.Client, registry: durable.Registry, tmp_path: Path) -> None:
    """As a request of ``ctx.http``: once the lease is lost, nothing more is started."""
    marker = tmp_path / "ran"
    refused: list[BaseException] = []

    @durable.activity(registry=registry)
    async def late(ctx: durable.ActivityContext) -> None:
        assert ctx._attempt is not None
        ctx._attempt.lose("a renewal found the run taken over")  # as the worker does
        try:
            async with ctx.process_group(["touch", str(marker)]) as process:
                await process.wait()
        except durable.LeaseLostError as exc:
            refused.append(exc)
            raise

    @durable.workflow("proc.late", registry=registry)
    async def late_run(ctx: durable.WorkflowContext) -> None:
        await late(ctx)

    async with running_worker(client, registry):
        await client.start(late_run, id="late")
        await poll(lambda: refused)
    assert "no longer holds its lease" in str(refused[0])
    assert not marker.exists()


UNBORROWABLE = """
import ctypes, socket, sys, time
ctypes.CDLL(None).prctl(4, 0)  # PR_SET_DUMPABLE 0: only a privileged process may ptrace it
stuck = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
stuck.sendall(b"x" * int(sys.argv[2]))
print(stuck.getsockname()[1], flush=True)
time.sleep(60)
"""

ABORTING = """
import json, logging, subprocess, sys
import anyio
import durable

events = []
handler = logging.Handler()
handler.emit = lambda record: events.append((record.getMessage(), record.fields))
logging.getLogger("durable").addHandler(handler)

async def main():
    process = await anyio.open_process(
        [sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]],
        stdin=subprocess.DEVNULL, stderr=None, start_new_session=True)
    async with process:
        line = b""
        while not line.endswith(b"\\n"):
            line += await process.stdout.receive()
        print(line.decode().strip(), flush=True)
        sys.stdin.readline()  # the test: the whole request is on its way
        reset = await durable.abort_process_group(process.pid)
        code = await process.wait()
    print(json.dumps({"reset": reset, "code": code, "events": events}, default=str),
          flush=True)

anyio.run(main)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv, to abort without CAP_SYS_PTRACE")
async def test_a_group_whose_sockets_cannot_be_borrowed_is_still_killed_and_says_so(
        ) -> None:
    """Where the program's sockets cannot be looked at or borrowed (here: it made itself
    non-dumpable, and the aborting process lacks CAP_SYS_PTRACE, so it may not ptrace it),
    the abort cannot reset its connections: it logs ``process_connections_unreachable``
    with the reason and kills the group plainly, and what the kernel held is delivered (the
    limit, shown here: the whole request, then the end of the stream). Before, a refused
    look at ``/proc/<pid>/fd`` was taken for a process gone, and nothing was said."""
    with _listener(small=True) as service:
        process = await anyio.open_process(
            ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace",
             sys.executable, "-c", ABORTING, UNBORROWABLE, str(service.getsockname()[1]),
             str(REQUEST)],
            cwd=str(Path(durable.__file__).parent.parent), stderr=None)
        async with process:
            assert process.stdout is not None and process.stdin is not None
            with anyio.fail_after(20):  # the program connects first thing
                await anyio.wait_readable(service)
            stuck, _ = service.accept()
            with stuck:
                port = int(await _line(process.stdout))
                await poll(lambda: _whole_request_written(stuck, port))
                await process.stdin.send(b"abort\n")
                outcome = json.loads(await _line(process.stdout))
                assert (outcome["reset"], outcome["code"]) == (0, -9), outcome
                unreachable = [f for message, f in outcome["events"]
                               if message.startswith("process_connections_unreachable ")]
                assert unreachable, f"nothing said of what it could not reset: {outcome}"
                assert unreachable[0]["error"] in ("Permission denied",
                                                   "Operation not permitted")
                assert await _end(stuck, REQUEST) == ("end of stream", REQUEST)
