"""`pdctl` subcommands of the operator side: operator, crd, render (registered in pd_runtime.cli)."""
