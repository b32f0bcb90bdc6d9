"""End-to-end harness: a real Kubernetes control plane built from source, real kubelet nodes, and the suite."""
