"""An external metrics API server (``external.metrics.k8s.io/v1beta1``) over the operator's Prometheus metrics.

The suite's stand-in for prometheus-adapter or KEDA's metrics server, so an HPA runs through the real
HPA controller of the e2e control plane (test_autoscaling.py): kube-apiserver's aggregator proxies
``/apis/external.metrics.k8s.io/v1beta1`` here (an APIService and a Service, see
``Stack.start_external_metrics``), over TLS with its front-proxy client certificate, which this server
requires. Each request reads the operator's ``/metrics`` and answers with the samples of the metric whose
``namespace`` label is the request's namespace and whose other labels match the ``labelSelector``: the
rule docs/autoscaling.md gives prometheus-adapter (``resources: {overrides: {namespace: ...}}``), with
the value of the latest scrape instead of a PromQL query. Authorization is left out (prometheus-adapter
would ask the API server with a SubjectAccessReview); the listener is on 127.0.0.1 only.

    python -m e2e.metrics_api --metrics-url URL --port N --cert C --key K --client-ca CA
"""

from __future__ import annotations

import argparse
import datetime
import logging
import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from e2e.pki import FRONT_PROXY_CLIENT

log = logging.getLogger(__name__)

GROUP_VERSION = "external.metrics.k8s.io/v1beta1"
PREFIX = "pd_operator_"  # the metrics served: the operator's own
NAMESPACE_LABEL = "namespace"


class SelectorError(ValueError):
    """A labelSelector this server does not take (only equality: ``k=v``, ``k==v``, ``k!=v``)."""


def matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy an equality-based label selector (what an HPA's matchLabels become)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, op, value = _term(term)
        if (labels.get(key) == value) != (op == "="):
            return False
    return True


def _term(term: str) -> tuple[str, str, str]:
    for op, kept in (("!=", "!="), ("==", "="), ("=", "=")):
        key, found, value = term.partition(op)
        if found:
            if not key.strip() or any(c in value for c in "=!()"):
                break
            return key.strip(), kept, value.strip()
    raise SelectorError(f"unsupported labelSelector term {term!r}: only k=v, k==v and k!=v")


def samples(exposition: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The operator's gauges by name: each sample's labels and value."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name.startswith(PREFIX):
            for sample in family.samples:
                found.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return found


def quantity(value: float) -> str:
    """A resource.Quantity in milli-units, as the HPA controller reads external metrics (MilliValue)."""
    return f"{round(value * 1000)}m"


def value_list(name: str, series: list[tuple[dict[str, str], float]], namespace: str, selector: str) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    items = [
        {"metricName": name, "metricLabels": labels, "timestamp": now, "value": quantity(value)}
        for labels, value in series
        if labels.get(NAMESPACE_LABEL) == namespace and matches(selector, labels)
    ]
    return {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }
    return web.json_response(body, status=code)


class MetricsApi:
    def __init__(self, metrics_url: str) -> None:
        self.metrics_url = metrics_url
        self.session: aiohttp.ClientSession | None = None

    async def scrape(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """The operator's metrics now; a 503 when they cannot be read."""
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            async with self.session.get(self.metrics_url) as resp:
                resp.raise_for_status()
                return samples(await resp.text())
        except (aiohttp.ClientError, TimeoutError) as err:
            log.warning("cannot read the operator's metrics at %s: %s", self.metrics_url, err)
            raise web.HTTPServiceUnavailable(text=f"cannot read the operator's metrics: {err}") from err

    async def resources(self, request: web.Request) -> web.Response:
        """Discovery: the aggregator's availability check and the API's resources (one per metric)."""
        names = sorted(await self.scrape())
        resources = [
            {"name": n, "singularName": "", "namespaced": True, "kind": "ExternalMetricValueList", "verbs": ["get"]}
            for n in names
        ]
        return web.json_response(
            {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION, "resources": resources}
        )

    async def metric(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["metric"]
        selector = request.query.get("labelSelector", "")
        user = request.headers.get("X-Remote-User", "")
        scraped = await self.scrape()
        if name not in scraped:
            return _status(404, "NotFound", f"external metric {name} not found")
        try:
            body = value_list(name, scraped[name], namespace, selector)
        except SelectorError as err:
            return _status(400, "BadRequest", str(err))
        log.info("%s asked %s/%s{%s}: %s", user, namespace, name, selector, [i["value"] for i in body["items"]])
        return web.json_response(body)

    async def close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()


@web.middleware
async def front_proxy_only(request: web.Request, handler: Any) -> web.StreamResponse:
    """Only the aggregator: its client certificate (verified against the cluster CA by TLS) and its CN."""
    peer = request.transport.get_extra_info("peercert") if request.transport else None
    subject = {k: v for rdn in (peer or {}).get("subject", ()) for k, v in rdn}
    if subject.get("commonName") != FRONT_PROXY_CLIENT:
        return _status(403, "Forbidden", "only the API server's front proxy may call this server")
    response: web.StreamResponse = await handler(request)
    return response


def app(metrics_url: str) -> web.Application:
    api = MetricsApi(metrics_url)
    application = web.Application(middlewares=[front_proxy_only])
    base = f"/apis/{GROUP_VERSION}"
    application.router.add_get(base, api.resources)
    application.router.add_get(base + "/namespaces/{namespace}/{metric}", api.metric)
    application.on_cleanup.append(api.close)
    return application


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics-url", required=True, help="the operator's Prometheus /metrics")
    parser.add_argument("--port", type=int, required=True, help="HTTPS port on 127.0.0.1")
    parser.add_argument("--cert", required=True, help="serving certificate (the APIService's caBundle)")
    parser.add_argument("--key", required=True)
    parser.add_argument("--client-ca", required=True, help="CA of the front proxy's client certificate")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=args.client_ca)
    tls.load_cert_chain(args.cert, args.key)
    tls.verify_mode = ssl.CERT_REQUIRED
    log.info("external metrics API on https://127.0.0.1:%d from %s", args.port, args.metrics_url)
    web.run_app(app(args.metrics_url), host="127.0.0.1", port=args.port, ssl_context=tls, print=None)


if __name__ == "__main__":
    main()
