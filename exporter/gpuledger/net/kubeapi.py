"""The parts of the official `kubernetes` client the pod informer uses, loaded lean.

`import kubernetes.client` first runs the `kubernetes` package's ``__init__``, which
imports every optional part: the dynamic client, streams, leader election, and, through
`kubernetes.config`, the OIDC, GCP and exec authenticators (oauthlib, google-auth,
cryptography). The generated `CoreV1Api` then imports ~250 model modules for the one
call we make, whose models we never build (the informer reads raw JSON). On the node
agent that was 47 MB of its 110 MB RSS (docs/performance.md), on every GPU node.

So the client's own REST layer (`ApiClient`, `Configuration`, `ApiException`), its watch
decoder and its in-cluster config loader are imported without those package
initialisers, and `list_pods` issues the request `list_pod_for_all_namespaces` would.
The kubeconfig loader (out of cluster only) is imported whole, when it is used.
If the process already imported `kubernetes` normally, that import is used as is.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "ApiException",
    "ConfigException",
    "api_client",
    "incluster_configuration",
    "kubeconfig_configuration",
    "list_objects",
    "list_pods",
    "new_watch",
]

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _package_without_init(name: str) -> None:
    """Register package `name` so its submodules import without running its __init__."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"package {name!r} is not installed")
    module = importlib.util.module_from_spec(spec)  # created, not executed
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def _import(name: str) -> ModuleType:
    return importlib.import_module(name)


_package_without_init("kubernetes")
_package_without_init("kubernetes.config")
_package_without_init("kubernetes.utils")  # its __init__ imports PyYAML; rest.py needs retry
_client = _import("kubernetes.client")  # lazy by itself (kubernetes>=35): no models
_api_client = _import("kubernetes.client.api_client")
_configuration = _import("kubernetes.client.configuration")
_watch = _import("kubernetes.watch.watch")
_incluster = _import("kubernetes.config.incluster_config")

# Typed imports of the same modules, now that the package initialisers are bypassed.
from kubernetes.client.exceptions import ApiException  # noqa: E402
from kubernetes.config.config_exception import ConfigException  # noqa: E402

# Query parameter names of GET /api/v1/pods, as the generated CoreV1Api spells them.
_QUERY = {
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "_continue": "continue",
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "limit": "limit",
    "resource_version": "resourceVersion",
    "resource_version_match": "resourceVersionMatch",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}


def incluster_configuration(service_account_dir: str = SERVICE_ACCOUNT_DIR) -> Any:
    """The client's own in-cluster loader (service host/port from the environment, the
    token re-read every minute so projected tokens rotate); raises ConfigException."""
    configuration = _configuration.Configuration()
    loader = _incluster.InClusterConfigLoader(
        token_filename=os.path.join(service_account_dir, "token"),
        cert_filename=os.path.join(service_account_dir, "ca.crt"),
    )
    loader.load_and_set(configuration)
    return configuration


def kubeconfig_configuration(path: str, context: str | None = None) -> Any:
    """The client's kubeconfig loader, with every authenticator it supports (imported
    here, on use: only out-of-cluster runs need it). `context` None: the current one."""
    kube_config = _import("kubernetes.config.kube_config")
    configuration = _configuration.Configuration()
    kube_config.load_kube_config(
        config_file=path, context=context, client_configuration=configuration
    )
    return configuration


def api_client(configuration: Any) -> Any:
    return _api_client.ApiClient(configuration)


def list_pods(client: Any, *, _request_timeout: Any = None, **params: Any) -> Any:
    """GET /api/v1/pods: the undecoded urllib3 response (list or watch stream).

    Same request as `CoreV1Api.list_pod_for_all_namespaces(..., _preload_content=False)`:
    the client's serialisation, auth and TLS; non-2xx raises the client's ApiException.
    Only raw responses are supported: the informer decodes JSON itself.
    """
    return list_objects(client, "/api/v1/pods", _request_timeout=_request_timeout, **params)


def list_objects(client: Any, path: str, *, _request_timeout: Any = None, **params: Any) -> Any:
    """GET `path` (a collection, e.g. /apis/resource.k8s.io/v1/resourceslices) as
    `list_pods` does: the same parameters, the raw response."""
    if params.pop("_preload_content", False):  # Watch.stream passes False
        raise ValueError("list_pods returns the raw response only")
    unknown = set(params) - set(_QUERY)
    if unknown:
        raise TypeError(f"unexpected list parameters: {sorted(unknown)}")
    query = [(_QUERY[key], value) for key, value in params.items() if value is not None]
    request = client.param_serialize(
        method="GET",
        resource_path=path,
        query_params=query,
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    response = client.call_api(*request, _request_timeout=_request_timeout)
    if not 200 <= response.status <= 299:
        response.read()
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response.response


def new_watch() -> Any:
    """A `kubernetes.watch.Watch` yielding events as plain dicts (no model decoding)."""
    return _watch.Watch(return_type="object")
