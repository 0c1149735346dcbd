"""Private broker servers that a fault test may really stop and start again.

The shared Redis and RabbitMQ on the standard ports are never touched: each test
starts its own ``redis-server`` or RabbitMQ node, as a child process in a session
of its own, on free ports, with its data under the test's temporary directory.
:meth:`BrokerServer.stop` ends the server (SIGTERM; the clients' connections
close); :meth:`BrokerServer.start` starts it again on the same port, with the same
data directory. Both run through the package's :class:`ChildProcess` harness, so a
server left running by a failed test is still killed when the interpreter exits.

The RabbitMQ node runs the server's own start script directly (not the Debian
wrapper, which switches to the ``rabbitmq`` user and writes into
``/var/lib/rabbitmq``): its node name, ports, Mnesia and log directories, config
file, enabled-plugins file, Erlang cookie (``HOME``) and crash dump are all the
test's own. Only epmd, the Erlang port mapper, is shared (a node registers its
name there and unregisters it when it stops).
"""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

from celery_elarion_beat.testing._harness import ChildProcess, clean_env, wait_until
from tests.helpers.ports import free_port

__all__ = ["BrokerServer", "RabbitNode", "RedisServer", "free_port", "port_open"]

#: the RabbitMQ start script (Debian's package); the wrapper in /usr/sbin is not used
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
#: generous: a RabbitMQ node boots in about 5 s on an idle machine, far longer on a
#: loaded 2-core one
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0



def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


class BrokerServer:
    """A broker server of one test: started, stopped and started again on one port."""

    name = "broker"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.process: ChildProcess | None = None
        self.starts = 0
        #: time.time() of each stop request, each start request, and each start found
        #: serving (a moment after the server started to accept connections)
        self.stopped_at: list[float] = []
        self.started_at: list[float] = []
        self.up_at: list[float] = []

    @property
    def url(self) -> str:
        raise NotImplementedError

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return clean_env()

    def ready(self) -> bool:
        """Whether the server serves clients (by default: it accepts connections)."""
        return port_open(self.port)

    def start(self) -> BrokerServer:
        """Start the server (again) and wait until it serves clients."""
        if port_open(self.port):
            raise AssertionError(f"port {self.port} is taken: cannot start {self.name} on it")
        self.starts += 1
        self.started_at.append(time.time())
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = ChildProcess(f"{self.name}-{self.starts}", self.argv(), self.env(),
                                    self.workdir / f"{self.name}-{self.starts}.log",
                                    self.workdir)
        self.process.start()
        self.process.wait_ready(self.ready, START_TIMEOUT, f"{self.name} serving on {self.port}")
        self.up_at.append(time.time())
        return self

    def stop(self) -> float:
        """Stop the server (SIGTERM to its process group, SIGKILL after a timeout) and
        wait until its port refuses connections; the instant the stop was asked."""
        asked = time.time()
        self.stopped_at.append(asked)
        if self.process is not None:
            self.process.terminate(STOP_TIMEOUT)
        wait_until(lambda: not port_open(self.port), STOP_TIMEOUT,
                   message=f"{self.name} to close port {self.port}")
        return asked

    def close(self) -> None:
        """Stop the server if it runs (cleanup: never raises)."""
        if self.process is not None and self.process.alive():
            self.process.terminate(STOP_TIMEOUT)

    def tail(self) -> str:
        return self.process.tail() if self.process is not None else f"{self.name}: never started"

    def __enter__(self) -> BrokerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisServer(BrokerServer):
    """``redis-server`` in the foreground, without persistence."""

    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        binary = shutil.which("redis-server") or "redis-server"
        return [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--dir", str(self.workdir)]


class RabbitNode(BrokerServer):
    """A RabbitMQ node of its own (``elarion<run>@localhost``), without plugins."""

    name = "rabbitmq"

    def __init__(self, workdir: Path, run_id: str, port: int | None = None) -> None:
        super().__init__(workdir, port)
        self.node = f"elarion{run_id}@localhost"
        self.dist_port = free_port()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def argv(self) -> list[str]:
        return [RABBITMQ_SERVER]

    def env(self) -> dict[str, str]:
        home = self.workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "rabbitmq.conf"
        config.write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
                          "loopback_users = none\n")
        plugins = self.workdir / "enabled_plugins"
        plugins.write_text("[].\n")
        return clean_env({
            "HOME": str(home),  # the node's Erlang cookie goes here
            "ERL_CRASH_DUMP": str(self.workdir / "erl_crash.dump"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.workdir / "log"),
            "RABBITMQ_CONFIG_FILE": str(config),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_PID_FILE": str(self.workdir / "rabbitmq.pid"),
            # not /etc/rabbitmq/rabbitmq-env.conf, which names the shared node
            "RABBITMQ_CONF_ENV_FILE": str(self.workdir / "rabbitmq-env.conf"),
        })

    def ready(self) -> bool:
        """Listening is not enough: a client must be able to log in."""
        if not port_open(self.port):
            return False
        from kombu.connection import Connection

        try:
            with Connection(self.url, connect_timeout=2) as conn:
                conn.connect()
            return True
        except Exception:  # noqa: BLE001 - not up yet
            return False
