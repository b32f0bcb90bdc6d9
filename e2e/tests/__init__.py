"""End-to-end suite: a real control plane, the node agent, the operator installed by its chart."""
