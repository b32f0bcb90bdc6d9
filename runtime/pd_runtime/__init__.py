"""pd-operator runtime: the data plane that ships in the runtime image (proxy, simulated engine, bench, launcher)."""
