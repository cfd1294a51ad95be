"""Which runtime a tool call runs in, from ``x-tool-runtime`` or ``--tools-runtime``:

- none: the server's own machine;
- ``docker-container:ID``, ``podman-container:ID``: a container already running;
- ``ssh:TARGET``: a host over ssh;
- ``docker:IMAGE``, ``podman:IMAGE`` (``--tools-runtime`` only): a container the server
  starts from the image, keeps for every call, and removes when it stops.

A runtime that is not one of these is refused, never replaced by the host: the client
asked for an isolate. An ssh target or a container id beginning with ``-`` would reach
ssh's or the engine's own command line as an option (``-oProxyCommand=...`` runs on the
host, ``--privileged``...), so only plain names are taken."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .host_io import HostIO
from .isolate_io import ContainerIO, SshIO
from .tool_io import ToolIO

__all__ = [
    "ContainerSpec",
    "SpawnedContainer",
    "StaticRuntime",
    "ToolRuntimeError",
    "io_for",
    "make_io",
    "tools_runtime",
]

log = logging.getLogger("tensorplug.server")

ENGINES = ("docker", "podman")
_SSH_TARGET = re.compile(r"[A-Za-z0-9._@-]+")
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class ToolRuntimeError(RuntimeError):
    """A runtime that cannot be used (the server's 500, as llama-server's)."""


@dataclass(frozen=True)
class ContainerSpec:
    engine: str
    arg: str  # the image to start, or the id of a running container
    attach: bool

    @staticmethod
    def parse(spec: str) -> ContainerSpec | None:
        for engine in ENGINES:
            if spec.startswith(f"{engine}-container:"):
                return ContainerSpec(engine, spec[len(engine) + 11 :], True)
            if spec.startswith(f"{engine}:"):
                return ContainerSpec(engine, spec[len(engine) + 1 :], False)
        return None


def make_io(cwd: str = "", runtime: str = "") -> ToolIO:
    """The runtime ``runtime`` names (empty: the host), working in ``cwd``."""
    if not runtime:
        return HostIO(cwd)
    container = ContainerSpec.parse(runtime)
    if container is not None:
        if not container.attach:  # starting one belongs to --tools-runtime, not a call
            raise ToolRuntimeError(f"tool runtime must name a running container: {runtime}")
        if not _CONTAINER_ID.fullmatch(container.arg):
            raise ToolRuntimeError(f"invalid container id: {container.arg}")
        return ContainerIO(container.engine, container.arg, cwd)
    if runtime.startswith("ssh:"):
        target = runtime[4:]
        if not _SSH_TARGET.fullmatch(target) or target.startswith("-"):
            raise ToolRuntimeError(f"invalid ssh target: {target}")
        return SshIO(target, cwd)
    raise ToolRuntimeError(f"unknown tool runtime: {runtime}")


def io_for(params: Mapping[str, Any]) -> ToolIO:
    """The runtime of a call, from the ``cwd`` and ``runtime`` the route put in its
    parameters (taken from the request's headers)."""
    cwd, runtime = params.get("cwd"), params.get("runtime")
    return make_io(cwd if isinstance(cwd, str) else "", runtime if isinstance(runtime, str) else "")


class SpawnedContainer:
    """``--tools-runtime docker:IMAGE``: ``docker run --rm -i IMAGE sh``, whose shell
    waits on its stdin, so the container lives until the server closes that stdin
    (:meth:`close`; ``--rm`` then removes it). One that died on its own is started again
    at the next call."""

    def __init__(self, engine: str, image: str) -> None:
        if not image:
            raise ToolRuntimeError(f"--tools-runtime {engine}:<image> requires an image name")
        self.engine, self.image = engine, image
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.container = ""
        self._spawn()

    def spec(self) -> str:
        """The runtime of a call: this container, started again if it died."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                log.warning("%s tools runtime container %r died, starting another",
                            self.engine, self.container)  # fmt: skip
                self._spawn()
            return f"{self.engine}-container:{self.container}"

    def close(self) -> None:
        with self.lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # the container's shell ends; --rm removes the container
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _spawn(self) -> None:
        fd, cidfile = tempfile.mkstemp(prefix="tensorplug-tools-cid-", suffix=".tmp")
        os.close(fd)
        os.unlink(cidfile)  # the engine refuses a cidfile that exists
        args = [self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh"]
        try:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        except OSError as e:
            raise ToolRuntimeError(
                f"failed to spawn {self.engine} container for tools runtime "
                f"(image: {self.image}): {e}"
            ) from None
        cid = ""
        for _ in range(100):
            try:
                with open(cidfile, encoding="utf-8") as f:
                    cid = f.readline().strip()
            except OSError:
                cid = ""
            if cid or self.proc.poll() is not None:
                break
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            os.unlink(cidfile)
        if not cid:
            self.proc.kill()
            self.proc.wait()
            raise ToolRuntimeError(
                f"timed out waiting for {self.engine} container to start (image: {self.image})"
            )
        self.container = cid


class StaticRuntime:
    """A runtime that needs no keeping (a running container, an ssh host): checked once
    at start, then named as it is."""

    def __init__(self, spec: str) -> None:
        make_io("", spec)  # refuses a bad one now, not at the first call
        self._spec = spec

    def spec(self) -> str:
        return self._spec

    def close(self) -> None:
        pass


def tools_runtime(spec: str) -> SpawnedContainer | StaticRuntime:
    """``--tools-runtime SPEC``'s runtime (a :class:`ToolRuntimeError` for a bad one)."""
    container = ContainerSpec.parse(spec)
    if container is not None and not container.attach:
        return SpawnedContainer(container.engine, container.arg)
    return StaticRuntime(spec)
