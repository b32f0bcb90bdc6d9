"""A CPU-only stand-in for vLLM + MoRIIOConnector (`pdctl sim-engine`).

Pure core: ``timing`` (step costs), ``scheduler`` (continuous batching), ``system`` (a discrete-event
simulation of a whole deployment, used for calibration), ``config`` (the `vllm serve` command line) and
``openai`` (request/response formats). Thin shell: ``engine`` (the scheduler on a real clock),
``sidechannel`` (ZMQ handshake and notify), ``heartbeat``, ``server`` (aiohttp) and ``cli``.
"""
