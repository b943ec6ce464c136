"""`cerebras.pytorch.mesh`: meshes of boxes (CS systems) and tensor layouts over them.

On the CSX backend the boxes are the emulated cluster's systems and a layout is a
sharding of the traced step's program (`cstorch.mesh.layout`); on CPU and GPU backends,
as off a cluster in the real package, the functions return their tensor unchanged.
"""
from cstorch.mesh.boxes import Box, Mesh
from cstorch.mesh.layout import (all_gather, all_slice, d2d_transfer, distribute_tensor,
                                 m2m_transfer)
from cstorch.mesh.placement import Placement, Replicate, Shard, ShardingSpec, sharding_spec

__all__ = ["Box", "Mesh", "Placement", "Shard", "Replicate", "ShardingSpec", "sharding_spec",
           "distribute_tensor", "all_gather", "all_slice", "d2d_transfer", "m2m_transfer"]
