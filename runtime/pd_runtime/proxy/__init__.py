"""The MoRI-IO prefill/decode proxy (`pdctl proxy`); docs/architecture.md names each module's job.

Pure core: ``legs`` (client request -> prefill and decode legs), ``routing`` (choosing instances and DP
ranks), ``registry`` (instance liveness as data), ``breaker`` (one instance's circuit breaker),
``status`` (the admin JSON). Thin shell: ``listener`` (ZMQ registration and /health probes),
``flows`` (a request's legs in order, over ``placement``, ``relay`` and ``circuits``), ``upstream``
(HTTP to the engines), ``server`` (the API and admin ports), ``canary`` and ``cli``.
"""
