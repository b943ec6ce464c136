"""`backend.cluster`: a backend's handle on its Wafer-Scale Cluster.

Model Zoo's trainer reads and replaces a CSX backend's cluster configuration through it
(`backend.cluster.config = ClusterConfig(...)` when a second trainer reuses the backend)
and asks it about the cluster's workflow. The cluster is emulated here: `config` is the
backend's `cluster_config`; the workflow and storage calls are no-ops that say there is
none (`workflow_id` and `client` are None).
"""


class Cluster:
    """The cluster of `backend` (every backend has one; only a CSX backend's config acts)."""

    workflow_id: str | None = None   # no cluster workflow is ever started here
    client = None                        # no management client to talk to

    def __init__(self, backend):
        self._backend = backend

    @property
    def config(self):
        """The backend's `cluster_config` (None when it was not given)."""
        return self._backend.params.get("cluster_config")

    @config.setter
    def config(self, config):
        """Replace the configuration. The mesh was laid out for the backend's number of
        systems, so a config with another `num_csx` is refused: create a new backend."""
        systems = self._backend.mesh.shape.get("systems", 1)
        wanted = getattr(config, "num_csx", 1) if config is not None else 1
        if self._backend.process_group is None and wanted != systems:
            raise ValueError(
                f"this backend's mesh spans {systems} system(s) and cannot be changed to "
                f"num_csx={wanted}; create a new backend with cstorch.backend(\"CSX\", "
                f"cluster_config=...)")
        self._backend.params["cluster_config"] = config

    def start_workflow(self, *args, **kwargs) -> bool:
        """No-op (no cluster): returns False, no workflow was started."""
        return False

    def stop_workflow(self, *args, **kwargs) -> None:
        """No-op (no cluster)."""

    def check_storage_connectivity(self, *args, **kwargs) -> None:
        """No-op: there is no cluster whose access to storage could be checked."""

    def __repr__(self):
        return f"Cluster(config={self.config!r})"
