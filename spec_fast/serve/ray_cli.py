"""``spec-fast serve --ray``: the same server as Ray Serve replicas behind Ray Serve's HTTP proxy.

This module adds the Ray flags to ``serve`` and runs the command; it imports nothing heavy until the flags
are checked, so ``--help`` and flag mistakes stay fast. :mod:`~spec_fast.serve.ray_app` holds the
deployment itself. Without ``--ray-address`` a local Ray instance is started (and stopped at the end);
with one, the command joins that cluster, deploys its application there and deletes it at the end.
docs/scale-out.md describes the set-up on one machine and on several.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from spec_fast.settings import GenerateSettings, SettingError

__all__ = ["add_ray_flags", "check_ray_flags", "serve_ray", "RayOptions"]

#: the Ray Serve application's name (``serve status`` shows it; the CLI deletes it on exit)
APP_NAME = "spec-fast"
_FLAGS_NEEDING_RAY = ("replicas", "ray_address", "autoscale")
#: what stopping Ray Serve may take beyond the replicas' grace period (the controller's own rounds)
_TEARDOWN_MARGIN_S = 15.0


@dataclass(frozen=True)
class RayOptions:
    """``replicas``: fixed count, or None with ``autoscale`` = (min, max); ``address``: None to start a
    local Ray instance; ``start_timeout_s``: how long the replicas get to start."""

    replicas: int | None
    autoscale: tuple[int, int] | None
    address: str | None
    start_timeout_s: float

    @property
    def most_replicas(self) -> int:
        return self.autoscale[1] if self.autoscale is not None else int(self.replicas or 1)


def add_ray_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Ray Serve (scale out: docs/scale-out.md; needs the ray extra, pip install 'spec-verify[ray]')")
    group.add_argument("--ray", action="store_true",
                       help="serve through Ray Serve replicas (each loads the model and runs its own engine "
                            "thread with --threads torch threads and as many Ray CPUs) behind Ray Serve's HTTP "
                            "proxy on --host:--port")
    group.add_argument("--replicas", type=int, default=None, help="number of replicas (default 1)")
    group.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                       help="let Ray vary the number of replicas between MIN and MAX with the load (about "
                            "--max-batch requests in flight per replica); instead of --replicas")
    group.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT",
                       help="the Ray cluster to join ('auto': the one this machine joined with 'ray start'); "
                            "default: start a local Ray instance for this command")
    group.add_argument("--ray-start-timeout", type=float, default=600.0, metavar="S",
                       help="seconds the replicas get to load the model and start (default 600)")


def check_ray_flags(args: argparse.Namespace) -> RayOptions | None:
    """The Ray options, or None without ``--ray``; :class:`SettingError` for a mistake."""
    if not args.ray:
        for dest in _FLAGS_NEEDING_RAY:
            if getattr(args, dest) is not None:
                raise SettingError(dest, "needs --ray")
        return None
    if args.replicas is not None and args.autoscale is not None:
        raise SettingError("autoscale", "and --replicas exclude each other (--autoscale MIN:MAX sets the range)")
    if args.replicas is not None and args.replicas < 1:
        raise SettingError("replicas", f"must be an integer >= 1, got {args.replicas}")
    autoscale = None
    if args.autoscale is not None:
        match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", args.autoscale)
        if match is None or not 1 <= int(match[1]) <= int(match[2]):
            raise SettingError("autoscale", f"must be MIN:MAX with 1 <= MIN <= MAX, got {args.autoscale!r}")
        autoscale = (int(match[1]), int(match[2]))
    address = args.ray_address
    if address is not None and address != "auto" and not re.fullmatch(r"(ray://)?[^\s:/]+:\d{1,5}", address):
        raise SettingError("ray_address", f"must be 'auto' or HOST:PORT, got {address!r}")
    if not args.ray_start_timeout > 0:
        raise SettingError("ray_start_timeout", f"must be a number of seconds > 0, got {args.ray_start_timeout}")
    return RayOptions(replicas=None if autoscale else (args.replicas or 1), autoscale=autoscale, address=address,
                      start_timeout_s=float(args.ray_start_timeout))


def serve_ray(args: argparse.Namespace, settings: GenerateSettings, options: RayOptions, model_name: str) -> int:
    """Deploy the replicas, wait for them, then serve until SIGTERM or Ctrl-C; the exit status."""
    # Ray reports usage statistics over the network unless told not to; a server should not phone home
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Serve kills its HTTP proxy after three readiness checks of 5 s each, which a busy small machine (the
    # replicas loading models beside it) can miss; a local instance inherits these, a running cluster keeps its own
    for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
        os.environ.setdefault(name, "30")
    if options.address is None or _is_loopback(options.address):
        # a local instance, or a cluster on the loopback address, serves this machine only: Ray's
        # single-machine mode (its default on macOS and Windows) keeps the node on the loopback address,
        # where on Linux Ray would replace it by the address that routes outwards and listen and connect
        # there; read by Ray when it is imported
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
        from ray import serve

        from spec_fast.serve.ray_app import ReplicaSpec, build_application
    except ImportError as err:
        print(f"spec-fast: error: --ray needs the ray extra ({err.name} is missing): "
              f"pip install 'spec-verify[ray]'", file=sys.stderr)
        return 2

    def note(message: str) -> None:
        if not args.quiet:
            print(f"spec-fast: {message}", file=sys.stderr, flush=True)

    stop = threading.Event()
    interrupted: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        stop.set()

    def catch_signals() -> dict[int, Any]:
        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    previous = catch_signals()
    started_ray = False
    try:
        if options.address is None:
            started_ray = True
            _export_source_root()
            local = _local_ray_options(options, settings)
            ray.init(**local)
            note(f"started a local Ray instance ({local['num_cpus']} CPUs)")
        else:
            try:
                ray.init(address=options.address, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as err:
                print(f"spec-fast: error: cannot join the Ray cluster at {options.address}: {_first_line(err)}",
                      file=sys.stderr)
                return 2
        catch_signals()  # again: Ray's core installs its own SIGTERM handler, which would end the process
        # -q: Serve's controller, proxy and replicas log warnings only (their access lines included)
        try:
            serve.start(proxy_location="HeadOnly", http_options={"host": args.host, "port": args.port},
                        logging_config={"log_level": "WARNING"} if args.quiet else None)
        except Exception as err:  # Ray's errors have no common base; one line, not a traceback
            print(f"spec-fast: error: Ray Serve did not start: {_first_line(err)}", file=sys.stderr)
            return 1
        spec = ReplicaSpec(settings=settings, model_name=model_name, max_batch=args.max_batch,
                           max_queue=args.max_queue, depth_policy=args.depth_policy, api_key=args.api_key,
                           quiet=bool(args.quiet),
                           shutdown_timeout_s=float(args.shutdown_timeout),
                           prefix_caching=bool(args.enable_prefix_caching))
        serve.run_many([serve.RunTarget(target=build_application(spec, options.replicas, options.autoscale),
                                        name=APP_NAME, route_prefix="/")],
                       wait_for_applications_running=False)
        failure = _wait_running(options, stop, note)
        if failure is not None and not interrupted:
            print(f"spec-fast: error: {failure}", file=sys.stderr)
            return 2
        if failure is None:
            note(f"serving on http://{args.host}:{args.port} ({_replica_summary(options)}, "
                 f"{settings.threads} thread(s) each)")
            stop.wait()
        note("stopping: the replicas finish their requests")
        # as the single-process server: 0 after SIGTERM, 130 after Ctrl-C
        return 130 if interrupted[0] == signal.SIGINT else 0
    finally:
        _tear_down(started_ray, float(args.shutdown_timeout))
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _local_ray_options(options: RayOptions, settings: GenerateSettings) -> dict[str, Any]:
    """A small local instance of its own (``address="local"``: a Ray instance already running on this machine
    is not joined, where ``ray.init`` would try to and then refuse ``num_cpus`` with a ValueError), CPUs enough
    for every replica (an oversubscribed machine still serves, more slowly), no dashboard, a small object store
    (requests and replies are small; Ray's default reserves 30% of the machine's memory), Ray's own logs at
    WARNING."""
    threads = int(settings.threads or 1)
    return {"address": "local", "num_cpus": max(os.cpu_count() or 1, options.most_replicas * threads),
            "include_dashboard": False,
            "object_store_memory": 100 * 1024 * 1024, "logging_level": logging.WARNING, "configure_logging": True}


def _is_loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rsplit(":", 1)[0]
    return host == "localhost" or host.startswith("127.")


def _export_source_root() -> None:
    """Put the folder of the ``spec_fast`` this command runs first on ``PYTHONPATH``, which the local Ray
    instance's workers inherit: they do not inherit the driver's ``sys.path``, so a replica would otherwise
    import whichever ``spec_fast`` is installed, not the source checkout the command came from."""
    import spec_fast

    root = os.path.dirname(os.path.dirname(os.path.abspath(spec_fast.__file__)))
    if os.path.basename(root) in ("site-packages", "dist-packages"):
        return  # an installed package: the workers import the same one
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def _wait_running(options: RayOptions, stop: threading.Event, note: Any) -> str | None:
    """Poll ``serve.status()`` until the application runs; a message if it failed, timed out or was
    interrupted."""
    from ray import serve

    deadline = time.monotonic() + options.start_timeout_s
    last = ""
    while not stop.is_set():
        app = serve.status().applications.get(APP_NAME)
        status = str(getattr(app.status, "value", app.status)) if app is not None else "NOT_STARTED"
        if status == "RUNNING":
            return None
        if status == "DEPLOY_FAILED" and app is not None:
            # the application's message is generic; the deployment's holds the replica's traceback
            messages = "\n".join([*(d.message for d in app.deployments.values()), app.message])
            return f"the replicas failed to start: {_replica_error(messages)}"
        if app is not None and app.message and app.message != last:
            last = app.message
            note(f"ray: {_first_line(last)}")
        if time.monotonic() > deadline:
            return (f"the replicas did not start within {options.start_timeout_s:g} s "
                    f"(status {status}: {_first_line(last) or 'no message'}); are there enough CPUs for "
                    f"{_replica_summary(options)}? (--ray-start-timeout)")
        stop.wait(0.5)
    return "interrupted while the replicas started"


def _replica_summary(options: RayOptions) -> str:
    if options.autoscale is not None:
        return f"{options.autoscale[0]} to {options.autoscale[1]} replicas"
    return f"{options.replicas} replica{'s' if options.replicas != 1 else ''}"


def _replica_error(message: str) -> str:
    """The model's own error line out of Ray's deployment message (which carries the replica's traceback)."""
    # the exception's own line comes last (the traceback before it quotes the source that raised it)
    found = re.findall(r"spec-fast replica: (.+)", message)
    return found[-1].strip() if found else _first_line(message)


def _first_line(err: object) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _tear_down(started_ray: bool, grace_s: float) -> None:
    """Delete this command's application (the replicas get ``grace_s`` to finish their requests); on a local
    instance also stop Serve and Ray, so that nothing this command started keeps running. Bounded: Ray's own
    calls wait forever if a part of Ray already died (a SIGTERM sent to the whole process group reaches the
    local raylet too), so they run on a helper thread that is given up on after ``grace_s`` plus a margin."""
    import ray

    if not ray.is_initialized():
        return

    def delete() -> None:
        from ray import serve

        try:
            serve.delete(APP_NAME)
            if started_ray:
                serve.shutdown()  # type: ignore[no-untyped-call]  # Ray leaves serve.shutdown unannotated
        except Exception as err:  # reported, never masks the exit status
            print(f"spec-fast: while stopping the replicas: {_first_line(err)}", file=sys.stderr)

    helper = threading.Thread(target=delete, name="spec-fast-ray-teardown", daemon=True)
    helper.start()
    helper.join(grace_s + _TEARDOWN_MARGIN_S)
    if helper.is_alive():
        print(f"spec-fast: the replicas did not stop within {grace_s + _TEARDOWN_MARGIN_S:g} s"
              + ("; stopping the local Ray instance" if started_ray else ""), file=sys.stderr)
    try:
        ray.shutdown()  # on a local instance this ends every process of it
    except Exception as err:
        print(f"spec-fast: while stopping Ray: {_first_line(err)}", file=sys.stderr)
