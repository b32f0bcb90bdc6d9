"""End-to-end suite: a real control plane, real kubelet nodes, the operator installed by its chart."""
