"""The template sandbox: chat templates render in worker processes with a deadline, a memory cap and a size cap.

A template is Jinja code from a model file. Run in the engine's process it could freeze the engine thread with
nested loops or take gigabytes with a string bomb. Here each render goes to an idle worker (:mod:`.worker`); a
worker that passes its deadline is killed and replaced, one that runs out of memory ends itself, and the caller gets
a :class:`TemplateLimitError` saying which limit it broke. The workers are shared by every model in the process.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from pathlib import Path

from .frames import read_frame, write_frame
from .worker import FLAG

RENDER_TIMEOUT_S = 5.0  # a real template renders a long chat in milliseconds
STARTUP_TIMEOUT_S = 120.0  # a worker's imports, on a machine that is busy with something else
MEMORY_BYTES = 1024**3
POOL_SIZE = 2  # one slow template does not hold up every other conversation
ENGINE_ROOT = Path(__file__).resolve().parents[2]


class TemplateError(ValueError):
    """A chat template gave no text for this conversation; the message says why, in words."""


class TemplateLimitError(TemplateError):
    """A chat template ran past its time, memory or size limit."""


class SandboxError(TemplateError):
    """No template can be rendered: a worker did not start or stopped by itself, or the sandbox has closed."""


class TemplateTooLong(TemplateLimitError):
    """A chat template wrote more text than the caller allowed (``chars``: how much it wrote)."""

    def __init__(self, chars: int, max_chars: int) -> None:
        super().__init__(f"the model's chat template wrote {chars:,} characters, more than the {max_chars:,} allowed")
        self.chars = chars


class TemplateSandbox:
    """A small pool of template workers; :meth:`render` is safe to call from any thread."""

    def __init__(self, size: int = POOL_SIZE, timeout_s: float = RENDER_TIMEOUT_S,
                 memory_bytes: int = MEMORY_BYTES) -> None:
        self.size, self.timeout_s, self.memory_bytes = size, timeout_s, memory_bytes
        self._idle: list[_Worker] = []
        self._running = 0  # workers started and not yet discarded, idle or busy
        self._free = threading.Condition()
        self._closed = False

    def start(self) -> None:
        """Start the workers now (their imports take a second), so that the first chat does not wait."""
        with self._free:
            while self._running < self.size and not self._closed:
                self._idle.append(_Worker(self.memory_bytes))
                self._running += 1

    def render(self, template: str, messages: list[dict], *, variables: dict, add_generation_prompt: bool,
               continue_final_message: bool, max_chars: int, tools: list[dict] | None = None) -> str:
        """The template's text for ``messages``; :class:`TemplateError` if it refuses them or breaks a limit
        (``max_chars``: the most text it may write)."""
        request = {"template": template, "messages": messages, "variables": variables, "max_chars": max_chars,
                   "tools": tools or None,
                   "add_generation_prompt": add_generation_prompt,
                   "continue_final_message": continue_final_message, "cpu_s": self.timeout_s + 1}
        worker = self._acquire()
        try:
            reply = worker.exchange(request, self.timeout_s)
        except BaseException:
            self._discard(worker)
            raise
        if reply is None or worker.timed_out or reply.get("error") == "memory":
            self._discard(worker, replace=True)
        else:
            self._release(worker)
        return self._text(reply, worker, max_chars)

    def close(self) -> None:
        """Stop every worker (idle ones at once; busy ones as they finish)."""
        with self._free:
            self._closed = True
            idle, self._idle = self._idle, []
            self._free.notify_all()
        for worker in idle:
            worker.stop()

    def _text(self, reply: dict | None, worker: _Worker, max_chars: int) -> str:
        if reply is None:
            if worker.timed_out:
                raise TemplateLimitError(f"the model's chat template took longer than {self.timeout_s:g} s")
            raise SandboxError(f"the chat template's worker stopped ({worker.exit_description()})")
        error = reply.get("error")
        if error is None:
            return reply["text"]
        if error == "memory":
            raise TemplateLimitError(f"the model's chat template needed more than "
                                     f"{self.memory_bytes / 1024**3:g} GiB of memory")
        if error == "too_long":
            raise TemplateTooLong(reply["chars"], max_chars)
        raise TemplateError(f"the model's chat template refused these messages: {reply['message']}")

    def _acquire(self) -> _Worker:
        with self._free:
            while not self._idle and self._running >= self.size and not self._closed:
                self._free.wait()
            if self._closed:
                raise SandboxError("the chat template sandbox has shut down")
            worker = self._idle.pop() if self._idle else None
            if worker is not None and worker.process.poll() is not None:  # it ended while idle (killed, say)
                worker.stop()
                self._running -= 1
                worker = None
            if worker is None:
                worker = _Worker(self.memory_bytes)
                self._running += 1
        try:
            worker.wait_ready()
        except BaseException:
            self._discard(worker)
            raise
        return worker

    def _release(self, worker: _Worker) -> None:
        with self._free:
            if self._closed:
                worker.stop()
            else:
                self._idle.append(worker)
            self._free.notify()

    def _discard(self, worker: _Worker, replace: bool = False) -> None:
        """Stop ``worker``; ``replace`` starts its successor now, so that the next render finds it ready."""
        worker.stop()
        with self._free:
            if replace and not self._closed:
                self._idle.append(_Worker(self.memory_bytes))
            else:
                self._running -= 1
            self._free.notify()


class _Worker:
    """One worker process and the pipe to it."""

    def __init__(self, memory_bytes: int) -> None:
        self.process = subprocess.Popen(
            [*worker_command(), "--memory", str(memory_bytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=_worker_environment(),
            creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0))  # no console window flashing up on Windows
        self.ready = False
        self.timed_out = False

    def wait_ready(self) -> None:
        """Wait for the worker's imports; :class:`TemplateError` if it cannot start."""
        if self.ready:
            return
        reply = self.exchange(None, STARTUP_TIMEOUT_S)
        if reply is None or not reply.get("ready"):
            why = reply["message"] if reply else self.exit_description()
            raise SandboxError(f"chat templates cannot be rendered: their worker did not start ({why})")
        self.ready = True

    def exchange(self, request: dict | None, timeout_s: float) -> dict | None:
        """Send ``request`` (None: only read) and read the reply; None if the worker ended first, killed at
        ``timeout_s`` (:attr:`timed_out`) or by itself."""
        deadline = threading.Timer(timeout_s, self._kill_at_deadline)
        deadline.start()
        try:
            if request is not None:
                write_frame(self.process.stdin, request)
            return read_frame(self.process.stdout)
        except (OSError, ValueError):  # the pipe closed under us: the worker is gone
            return None
        finally:
            deadline.cancel()

    def exit_description(self) -> str:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        return f"exit code {code}"

    def stop(self) -> None:
        """End the worker: closing its input ends an idle one; anything else is killed."""
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _kill_at_deadline(self) -> None:
        self.timed_out = True
        self.process.kill()


def worker_command() -> list[str]:
    """How to start a worker: the frozen app runs itself with a flag, a checkout runs the module."""
    if getattr(sys, "frozen", False):
        return [sys.executable, FLAG]
    return [sys.executable, "-m", "engine.templates.worker"]


def _worker_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_ROOT), env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error",
               HF_HUB_OFFLINE="1")
    return env


_shared: TemplateSandbox | None = None
_shared_lock = threading.Lock()


def shared_sandbox() -> TemplateSandbox:
    """The process's sandbox, started on first use and stopped at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = TemplateSandbox()
            _shared.start()
            atexit.register(_shared.close)
        return _shared
