"""Starts the services as local processes and stops them again (used by `serve` and tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from plumbing.grpc_util import wait_healthy
from plumbing.lifecycle import PARENT_PID_ENV
from plumbing.security import ClientTLS, sync_channel


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports. The sockets stay bound until all are picked: the kernel may
    hand a just-closed port out again, and two services of one stack would then collide on it
    (ours refuse a port in use, plumbing/grpc_util.py; gRPC's default would share it)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass
class ServiceProcess:
    name: str
    command: list[str]
    address: str
    log_path: Path | None = None
    process: subprocess.Popen | None = None
    tls: ClientTLS | None = None  # how health checks reach a TLS port
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        out = None
        if self.log_path is not None:
            self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
            out = self._log
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        self.process = subprocess.Popen(
            self.command, stdout=out, stderr=subprocess.STDOUT if out else None, env=env
        )

    @property
    def started(self) -> subprocess.Popen:
        """The running process; asking before start() is a bug of the caller."""
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.process

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.process.returncode}{self._log_hint()}"
                )
            if wait_healthy(self.address, timeout_s=1.0, tls=self.tls):
                return
        raise TimeoutError(
            f"{self.name} not healthy at {self.address} after {timeout_s:.0f} s{self._log_hint()}"
        )

    def terminate(self) -> None:
        """SIGTERM without waiting: ``stop`` then waits for the exit."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL, as a crashed pod would die."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _log_hint(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        tail = self.log_path.read_text(errors="replace")[-2000:]
        return f"; log {self.log_path} ends with:\n{tail}"


def why_not(replicas: Iterable[Any]) -> str:
    """Each replica's address and the router's reason it is not serving (DraftReplicaStatus)."""
    return "; ".join(f"{r.address}: {r.error}" for r in replicas) or "none is registered"


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


class LocalStack:
    """A router, a target and optional draft replicas on 127.0.0.1, started in order."""

    def __init__(
        self,
        target_args: list[str],
        router_args: list[str],
        log_dir: Path | None = None,
        host: str = "127.0.0.1",
        draft_args: list[list[str]] | None = None,
        tls: ClientTLS | None = None,
        api_key: str | None = None,
        http: bool = False,
        router_port: int = 0,
    ) -> None:
        """``router_port``: the router's public port (0: a free one, like every other)."""
        self.host = host
        self.tls, self.api_key = tls, api_key  # what our own checks of the services present
        self.log_dir = log_dir
        self._launched_at = time.monotonic()
        draft_args = draft_args or []
        target_port, free_router_port, http_port, *draft_ports = free_ports(
            3 + len(draft_args), host
        )
        router_port = router_port or free_router_port
        # The router's OpenAI-compatible HTTP API and /metrics, when asked for.
        self.http_address = f"{host}:{http_port}" if http else ""
        if http:
            router_args = [*router_args, "--http-port", str(http_port)]
        self.drafts = [
            self._draft(i, port, args)
            for i, (port, args) in enumerate(zip(draft_ports, draft_args, strict=True))
        ]
        router_args = [*router_args, *(a for d in self.drafts for a in ("--draft", d.address))]
        self.target = self._service("target", "target_service", target_port, target_args)
        self.router = self._service(
            "router", "router", router_port, ["--target", self.target.address, *router_args]
        )

    @property
    def target_address(self) -> str:
        return self.target.address

    @property
    def router_address(self) -> str:
        return self.router.address

    def _draft(self, index: int, port: int, args: list[str]) -> ServiceProcess:
        return self._service(f"draft-{index}", "draft_service", port, args)

    def _service(self, name: str, module: str, port: int, args: list[str]) -> ServiceProcess:
        """``python -m module`` on ``self.host:port``, logging to the stack's log dir."""
        return ServiceProcess(
            name,
            python_module(module, "--host", self.host, "--port", str(port), *args),
            f"{self.host}:{port}",
            self._log(name),
        )

    def _log(self, name: str) -> Path | None:
        return None if self.log_dir is None else self.log_dir / f"{name}.log"

    def services(self) -> list[ServiceProcess]:
        services = [self.target, *self.drafts, self.router]
        for service in services:
            service.tls = self.tls
        return services

    def start(
        self, timeout_s: float = 600.0, on_ready: Callable[[str, float], None] | None = None
    ) -> LocalStack:
        """Starts every service and waits until all are healthy; ``on_ready(name, seconds)``
        hears of each as it turns healthy."""
        self.launch()
        return self.wait_ready(timeout_s, on_ready)

    def launch(self) -> None:
        """Spawns every service without waiting. Call it from a thread that outlives the stack:
        the services' parent-death signal fires when the spawning *thread* exits."""
        self._launched_at = time.monotonic()
        try:
            for service in self.services():
                service.start()
        except BaseException:
            self.stop()
            raise

    def wait_ready(
        self, timeout_s: float = 600.0, on_ready: Callable[[str, float], None] | None = None
    ) -> LocalStack:
        """Waits for the launched services (stopping them all if one fails)."""
        try:
            for service in self.services():
                service.wait_healthy(timeout_s)
                if on_ready is not None:
                    on_ready(service.name, time.monotonic() - self._launched_at)
            if self.drafts:
                self.wait_drafts_serving(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_drafts_serving(self, timeout_s: float, count: int | None = None) -> None:
        """Waits until the router reports ``count`` (default: all) draft replicas healthy."""
        from protos import generation_pb2, generation_pb2_grpc  # no grpc stubs at import time
        from router.replica_check import MISFIT

        want = len(self.drafts) if count is None else count
        deadline = time.monotonic() + timeout_s
        key = [("authorization", f"Bearer {self.api_key}")] if self.api_key else None
        with sync_channel(self.router_address, self.tls, []) as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            while time.monotonic() < deadline:
                status = stub.GetServerStatus(
                    generation_pb2.GetServerStatusRequest(), timeout=5, metadata=key
                )
                if sum(r.healthy for r in status.draft_replicas) >= want:
                    return
                misfits = [r for r in status.draft_replicas if MISFIT in r.error]
                if misfits:  # waiting cannot mend it: the draft must be started otherwise
                    raise RuntimeError(f"a draft replica cannot serve: {why_not(misfits)}")
                time.sleep(0.2)
        why = why_not(r for r in status.draft_replicas if not r.healthy)
        raise TimeoutError(
            f"router did not see {want} healthy draft replicas in {timeout_s:.0f} s: {why}"
        )

    def stop(self) -> None:
        """The router first (it stops taking work), then the model services together: their
        exits (the target's takes about a second, most of it interpreter teardown) need not
        wait for each other."""
        self.router.stop()
        model_services = [self.target, *self.drafts]
        for service in model_services:
            service.terminate()
        for service in model_services:
            service.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
