"""What a load sends: open-loop arrival times and request bodies of exact lengths. The benchmark sends
them, and the simulator's discrete-event model (`sim/system.py`) draws the same arrivals."""
