"""cortiq on Ray Serve: replicas of one model behind one OpenAI-compatible endpoint
(needs the `ray` extra: pip install 'cortiq[ray]').

    import cortiq.serve.ray
    from ray import serve
    serve.run(cortiq.serve.ray.deployment("/models/m.cmf", replicas=2, threads_per_replica=4),
              name="cortiq", route_prefix="/")

or from the command line, `cortiq serve MODEL --ray --replicas 2`, or in a Serve config
file / KubeRay RayService: `import_path: cortiq.serve.ray:build` with `args:` (see
`build` and docs/scaling.md). `cortiq.ray` re-exports this module under a shorter name.

Each replica is a Ray actor that opens one `cortiq.LLM` (the model file mapped once per
replica; replicas on one host share its page cache unless `preload` copies it) and
serves `cortiq.serve.create_app` through Serve's ASGI ingress, so the routes, the
streaming and the error bodies are exactly those of `cortiq serve`. On top of them:

* every response carries `x-cortiq-replica: <Serve replica id>` (which replica served);
* GET /healthz adds the deployment's view from the Serve controller to the replica's
  own answer: `"replicas": {"RUNNING": 2, ...}`, the deployment status and its message
  (where Serve reports a replica that failed to start), and `"status": "degraded"` while
  fewer replicas run than wanted;
* a replica whose model fails to load (a damaged or missing file, `verify=True` hash
  mismatches) raises `ReplicaLoadError` naming the host, the path and the CMF error:
  Serve never routes to it, retries it, and fails the deployment when no replica ever
  starts -- `serve_until_stopped` then raises that error;
* Serve's health check fails a replica whose model file was replaced or truncated on
  disk since it was mapped, so Serve starts a new replica that maps the current file.

Ray's router sends a replica at most `max_concurrency + max_queue` requests (the
replica's own 429 gate never trips before Serve has tried the other replicas);
autoscaling targets `max_concurrency` ongoing requests per replica.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import socket

try:
    import ray
    from ray import serve
except ImportError as e:  # pragma: no cover - the ray extra
    raise ImportError("cortiq.serve.ray needs the 'ray' extra: pip install 'cortiq[ray]' "
                      f"(ray[serve]): {e}") from e

from ..errors import ConfigError, CortiqError, FormatError

__all__ = ["REPLICA_HEADER", "CortiqReplica", "ReplicaLoadError", "build", "deployment",
           "open_model", "serve_until_stopped"]

REPLICA_HEADER = "x-cortiq-replica"
DEFAULT_APP_NAME = "cortiq"
_LOAD_ERROR_PREFIX = "cortiq replica on "
# Options passed through to cortiq.LLM and to cortiq.serve.create_app.
_LLM_OPTIONS = ("seed", "skill", "task", "n_ctx", "max_sessions", "preload")
_APP_OPTIONS = ("max_concurrency", "max_queue", "max_body_bytes", "max_prompt_tokens",
                "model_name", "api_keys", "metrics_auth", "cors_origins", "cors_methods",
                "cors_headers")


class ReplicaLoadError(CortiqError):
    """A replica could not open its model (message: host, path, the CMF error)."""


# ---------------------------------------------------------------- the replica

class _ReplicaApp:
    """ASGI wrapper of one replica's server app: tags every response with the replica
    id and answers GET /healthz with the replica's own health plus Serve's view."""

    def __init__(self, app, replica):
        self.app = app
        self.replica = replica
        self._tag = (REPLICA_HEADER.encode(), replica.replica_id.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):    # Serve keeps the route prefix in the path
            path = path[len(root):]
        if path == "/healthz" and scope["method"] in ("GET", "HEAD"):
            return await self._healthz(scope, receive, send)

        async def tagged(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", ()), self._tag])
            await send(message)
        await self.app(scope, receive, tagged)

    async def _healthz(self, scope, receive, send):
        # The replica's own answer first (whatever fields the server reports)...
        sent = []

        async def capture(message):
            sent.append(message)
        await self.app(scope, receive, capture)
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        raw = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"status": "error", "detail": raw.decode("utf-8", "replace")}
        # ...then the deployment's, from the controller (a blocking Ray call: off the loop).
        body["replica"] = self.replica.replica_id
        body["host"] = self.replica.host
        try:
            view = await asyncio.to_thread(self.replica.deployment_view)
        except Exception as e:  # noqa: BLE001 -- the controller's trouble is not this replica's
            view = {"deployment_status": "UNKNOWN", "message": f"{type(e).__name__}: {e}"}
        body.update(view)
        running = view.get("replicas", {}).get("RUNNING", 0)
        if status == 200 and body.get("status") == "ok" and (
                view["deployment_status"] in ("UNHEALTHY", "DEPLOY_FAILED", "UNKNOWN")
                or running < view.get("target", running)):
            body["status"] = "degraded"
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode()), self._tag]})
        await send({"type": "http.response.body",
                    "body": b"" if scope["method"] == "HEAD" else data})


def _file_identity(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def open_model(config: dict, host: str | None = None):
    """A replica's `cortiq.LLM` from its config (model path or None for the demo,
    threads, verify, LLM options); every failure is one ReplicaLoadError naming the
    host, the path and the CMF error."""
    from ..runtime.llm import LLM
    host = host or socket.gethostname()
    path = config.get("model")
    try:
        if path is None:
            from ..demo import demo_path
            path = demo_path()
        if config.get("verify"):
            from ..runtime.model_file import open_model_file
            with open_model_file(path) as cf:       # a CMF or GGUF file
                problems = cf.verify()
            if problems:
                raise FormatError(f"{len(problems)} hash problem(s): " + "; ".join(problems[:5]))
        return LLM(path, n_threads=config.get("threads"),
                   **{k: config[k] for k in _LLM_OPTIONS if k in config})
    except (CortiqError, OSError) as e:
        raise ReplicaLoadError(f"{_LOAD_ERROR_PREFIX}{host}: cannot load {path}: "
                               f"{type(e).__name__}: {e}") from None


@serve.deployment(name="CortiqReplica")
@serve.ingress()
class CortiqReplica:
    """One replica: one `cortiq.LLM` and the `cortiq serve` app over it."""

    def __init__(self, config: dict):
        ctx = serve.get_replica_context()
        self.replica_id = ctx.replica_id.to_full_id_str()
        self.app_name, self.deployment_name = ctx.app_name, ctx.deployment
        self.host = socket.gethostname()
        self.config = config
        self.llm = open_model(config, self.host)
        self.identity = _file_identity(self.llm.path)
        self.server_app = None             # (`app` is Serve's: the ingress ASGI app)

    def __serve_build_asgi_app__(self):
        from .app import create_app
        options = {k: self.config[k] for k in _APP_OPTIONS if k in self.config}
        self.server_app = create_app(self.llm, **options)
        return _ReplicaApp(self.server_app, self)

    def check_health(self):
        # The mapping is of the file as it was at load: a file replaced since (a new
        # model on a shared volume) or truncated (reads past its end would fault) makes
        # this replica unhealthy, and Serve replaces it with one that maps the new file.
        try:
            now = _file_identity(self.llm.path)
        except OSError as e:
            raise ReplicaLoadError(f"{self.llm.path}: the model file is gone: {e}") from None
        if now != self.identity:
            raise ReplicaLoadError(f"{self.llm.path}: the model file changed on disk since "
                                   "this replica loaded it")

    def deployment_view(self) -> dict:
        st = serve.status().applications[self.app_name].deployments[self.deployment_name]
        out = {"deployment_status": str(getattr(st.status, "value", st.status)),
               "replicas": dict(st.replica_states), "message": st.message}
        target = self.config.get("replicas")
        if target is not None:
            out["target"] = target
        return out

    def __del__(self):
        # Serve waited graceful_shutdown_timeout_s for running requests: stop the rest
        # (each generation ends within one token). The LLM stays open: a worker thread
        # may still be inside a kernel, and the process exits next anyway.
        if getattr(self, "server_app", None) is not None:
            self.server_app.state.cancel_all()


# ---------------------------------------------------------------- building it

def _int(name, v, lo):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{name}: expected an integer >= {lo}, got {v!r}")
    return v


def parse_autoscale(spec) -> tuple[int, int]:
    """'MIN:MAX' (or a (min, max) pair) -> (min, max), 0 <= min <= max, max >= 1."""
    if isinstance(spec, str):
        lo, sep, hi = spec.partition(":")
        try:
            pair = (int(lo), int(hi)) if sep else None
        except ValueError:
            pair = None
        if pair is None:
            raise ConfigError(f"autoscale: expected MIN:MAX (two integers), got {spec!r}")
    else:
        try:
            pair = tuple(spec)
        except TypeError:
            pair = ()  # type: ignore[assignment]
        if len(pair) != 2:  # type: ignore[arg-type]
            raise ConfigError(f"autoscale: expected (min, max), got {spec!r}")
    lo, hi = _int("autoscale min", pair[0], 0), _int("autoscale max", pair[1], 1)  # type: ignore[index]
    if lo > hi:
        raise ConfigError(f"autoscale: min {lo} is above max {hi}")
    return lo, hi


def deployment(model=None, *, replicas: int | None = None, autoscale=None,
               threads_per_replica: int = 1, verify: bool = False,
               max_concurrency: int = 2, max_queue: int = 8,
               graceful_timeout: float = 30.0, ray_actor_options: dict | None = None,
               deployment_options: dict | None = None, **options):
    """The Serve application (bind it with `serve.run(app, name=..., route_prefix="/")`).

    `model`: a .cmf path, made absolute here -- every host must have the file at that
    path (its own disk or a shared volume) -- or None for the bundled demo model.
    `replicas` (default 1) or `autoscale=(min, max)` / "MIN:MAX" (Serve autoscaling on
    ongoing requests, `max_concurrency` per replica as the target). Each replica runs
    `threads_per_replica` kernel threads and reserves as many Ray CPUs.
    `verify=True` checks every hash of the file at replica start (reads it whole).
    Other options: cortiq.LLM's seed, skill, task, n_ctx, max_sessions, preload and
    cortiq.serve.create_app's max_body_bytes, max_prompt_tokens, model_name, api_keys,
    metrics_auth, cors_origins, cors_methods, cors_headers.
    `ray_actor_options` is merged over {"num_cpus": threads_per_replica}, and
    `deployment_options` (Serve's, e.g. health_check_period_s, max_queued_requests) over
    what these arguments set.
    """
    unknown = set(options) - set(_LLM_OPTIONS) - set(_APP_OPTIONS)
    if unknown:
        raise ConfigError(f"cortiq.serve.ray.deployment: unknown option(s) {', '.join(sorted(unknown))}")
    if replicas is not None and autoscale is not None:
        raise ConfigError("give either replicas or autoscale, not both")
    threads = _int("threads_per_replica", threads_per_replica, 1)
    running, queued = _int("max_concurrency", max_concurrency, 1), _int("max_queue", max_queue, 0)
    if isinstance(graceful_timeout, bool) or not isinstance(graceful_timeout, (int, float)) \
            or not graceful_timeout >= 0:
        raise ConfigError(f"graceful_timeout: expected seconds >= 0, got {graceful_timeout!r}")
    config = {k: v for k, v in options.items() if v is not None}
    config.update(model=None if model is None else os.path.abspath(os.path.expanduser(
        os.fspath(model))), threads=threads, verify=bool(verify),
        max_concurrency=running, max_queue=queued)
    dep_options = dict(max_ongoing_requests=running + queued,
                       graceful_shutdown_timeout_s=float(graceful_timeout),
                       ray_actor_options={"num_cpus": threads, **(ray_actor_options or {})})
    if autoscale is not None:
        lo, hi = parse_autoscale(autoscale)
        dep_options["autoscaling_config"] = {
            "min_replicas": lo, "initial_replicas": max(lo, 1), "max_replicas": hi,
            "target_ongoing_requests": running}
    else:
        config["replicas"] = _int("replicas", 1 if replicas is None else replicas, 1)
        dep_options["num_replicas"] = config["replicas"]
    dep_options.update(deployment_options or {})
    return CortiqReplica.options(**dep_options).bind(config)  # type: ignore[attr-defined]  # a Ray deployment


def build(args: dict):
    """Serve application builder, for config files and KubeRay:
    `import_path: cortiq.serve.ray:build`, `args: {model: /models/m.cmf, replicas: 2,
    threads_per_replica: 4, ...}` (the keyword arguments of `deployment`)."""
    args = dict(args or {})
    return deployment(args.pop("model", None), **args)


# ---------------------------------------------------------------- running it

def load_error(message: str) -> str:
    """The replica's ReplicaLoadError line out of Serve's deploy-failure message (which
    wraps it in a traceback), else the message itself."""
    found = re.findall(rf"{re.escape(_LOAD_ERROR_PREFIX)}[^\n]*", message)
    return found[-1] if found else message.strip()


def _failure_details(name: str, message: str) -> str:
    """Serve's application message plus its deployments' (which hold the replicas'
    constructor errors)."""
    try:
        app = serve.status().applications[name]
        return "\n".join([message, *(d.message for d in app.deployments.values() if d.message)])
    except Exception:  # noqa: BLE001 -- the application's own message is still worth giving
        return message


def serve_until_stopped(app, *, name: str = DEFAULT_APP_NAME, route_prefix: str = "/",
                        address: str | None = None, host: str = "127.0.0.1", port: int = 8000,
                        log_level: str = "warning", announce: bool = True,
                        ray_init_options: dict | None = None) -> None:
    """Start a local Ray instance (or connect to `address`), deploy `app`, block until
    SIGINT/SIGTERM, then tear it down: the application is deleted (running requests get
    the deployment's graceful timeout), and Serve and Ray are shut down when this call
    started the instance. A deployment that fails (no replica could load the model)
    raises ReplicaLoadError with the replica's error."""
    import logging
    import signal
    import sys
    import time

    level = getattr(logging, log_level.upper(), logging.WARNING)
    logging.getLogger("ray.serve").setLevel(level)        # Serve's driver-side INFO lines
    logging_config = {"log_level": logging.getLevelName(level), "enable_access_log": False}
    connect = not ray.is_initialized()
    own_instance = connect and address is None
    if connect:
        ray.init(address=address, logging_level=level, log_to_driver=level < logging.WARNING,
                 **(ray_init_options or {}))

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    # After ray.init, which installs its own SIGTERM handler (that one dies on the spot).
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    deployed = False
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config=logging_config)
        deployed = True
        try:
            serve.run(app, name=name, route_prefix=route_prefix, logging_config=logging_config)
        except RuntimeError as e:                 # DEPLOY_FAILED
            msg = load_error(_failure_details(name, str(e)))
            raise (ReplicaLoadError(msg) if msg.startswith(_LOAD_ERROR_PREFIX)
                   else CortiqError(f"Ray Serve: {msg}")) from None
        if announce:
            print(f"cortiq: serving on Ray Serve at http://{host}:{port}"
                  f"{route_prefix.rstrip('/')}/v1 (application {name!r})",
                  file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)                      # a signal's KeyboardInterrupt ends it
    except KeyboardInterrupt:
        pass
    finally:
        # A second SIGINT aborts the teardown; further SIGTERMs wait for it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if deployed:
                serve.delete(name)
                if own_instance:
                    serve.shutdown()
        finally:
            if connect and ray.is_initialized():
                ray.shutdown()
            for s, h in previous.items():
                signal.signal(s, h)
