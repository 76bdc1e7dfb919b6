"""`cortiq.serve.ray` under its short name: Ray Serve configs and KubeRay specs name
`import_path: cortiq.ray:build`, and Python code `cortiq.ray.deployment(...)`."""
from .serve.ray import (
    REPLICA_HEADER,
    CortiqReplica,
    ReplicaLoadError,
    build,
    deployment,
    load_error,
    open_model,
    parse_autoscale,
    serve_until_stopped,
)

__all__ = ["REPLICA_HEADER", "CortiqReplica", "ReplicaLoadError", "build", "deployment",
           "load_error", "open_model", "parse_autoscale", "serve_until_stopped"]
