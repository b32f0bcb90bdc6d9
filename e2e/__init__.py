"""End-to-end harness: a real Kubernetes control plane built from source, a node agent, and the suite."""
