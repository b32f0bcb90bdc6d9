"""The MoRI-IO prefill/decode proxy (`pdctl proxy`).

Pure core: ``legs`` (client request -> prefill and decode legs), ``routing`` (choosing instances and DP
ranks), ``registry`` (instance liveness as data), ``status`` (the admin JSON). Thin shell: ``listener``
(ZMQ registration and /health probes), ``upstream`` and ``flows`` (HTTP to the engines), ``server``
(the API and admin ports), ``canary`` and ``cli``.
"""
