"""Keys and values of `node.meta["custom"]` that mark where a captured op came from, set
while tracing (`torch.fx.traceback.annotate`) and read by the lowering."""

# (run label, layer index) of the identical-layer call that made the op
# (bridge.repeated_blocks); the ops computing its gradients carry it too.
BLOCK = "bridge_block"
# On every op made while `backward()` runs: GRADIENT_OP for the ops of an autograd node's
# backward, ENGINE for those autograd's engine makes between them (summing the gradients
# of a tensor used twice, writing `.grad`).
IN_BACKWARD = "bridge_in_backward"
GRADIENT_OP, ENGINE = "gradient op", "engine"
