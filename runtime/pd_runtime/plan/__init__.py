"""`pdctl plan`: price every layout of one node with the discrete-event simulator and say which to run.

Pure core (catalog, layouts, price, rank, emit, charts, report) and a thin shell (cli).
"""
