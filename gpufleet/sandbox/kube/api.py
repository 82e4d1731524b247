"""A small client of the sandbox's API server: JSON over HTTPS with the run's CA and a client
certificate (or a bearer token), on httpx.

The official `kubernetes` client would do, but it builds a typed model of every object it reads
and sends; creating 1,250 nodes and polling their readiness with plain JSON is what keeps the
bring-up short (docs/kubernetes-sandbox.md has the figures). Objects are applied server-side
(`application/apply-patch+yaml`, field manager `gpufleet-sandbox`), so `up` is safe to repeat on
an object that exists.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

FIELD_MANAGER = "gpufleet-sandbox"
APPLY = "application/apply-patch+yaml"  # JSON is YAML: the body is sent as JSON

_ADMISSION = "/apis/admissionregistration.k8s.io/v1"
# kind -> (API path prefix, plural, namespaced)
_KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Secret": ("/api/v1", "secrets", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "Job": ("/apis/batch/v1", "jobs", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "ResourceFlavor": ("/apis/kueue.x-k8s.io/v1beta1", "resourceflavors", False),
    "ClusterQueue": ("/apis/kueue.x-k8s.io/v1beta1", "clusterqueues", False),
    "LocalQueue": ("/apis/kueue.x-k8s.io/v1beta1", "localqueues", True),
    "Workload": ("/apis/kueue.x-k8s.io/v1beta1", "workloads", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "ClusterPolicy": ("/apis/nvidia.com/v1", "clusterpolicies", False),
    "ValidatingAdmissionPolicy": (_ADMISSION, "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": (_ADMISSION, "validatingadmissionpolicybindings", False),
}


class ApiError(RuntimeError):
    def __init__(self, what: str, status: int, body: str) -> None:
        self.status = status
        super().__init__(f"{what}: HTTP {status}: {body[:400]}")


def collection_path(kind: str, namespace: str | None = None) -> str:
    prefix, plural, namespaced = _KINDS[kind]
    if namespaced and namespace is not None:
        return f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{prefix}/{plural}"


def object_path(kind: str, name: str, namespace: str | None = None) -> str:
    if _KINDS[kind][2] and namespace is None:
        raise ValueError(f"a {kind} is namespaced: give its namespace")
    return f"{collection_path(kind, namespace)}/{name}"


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    """Whether one of the object's ownerReferences is the object with that uid."""
    return any(r.get("uid") == owner_uid for r in obj["metadata"].get("ownerReferences") or [])


def ssl_context(ca_file: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key is not None else None)
    return ctx


class KubeApi:
    """Calls to one API server as one identity; thread-safe (httpx.Client is)."""

    def __init__(
        self,
        url: str,
        ca_file: Path,
        cert: Path | None = None,
        key: Path | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        max_connections: int = 16,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=url,
            verify=ssl_context(ca_file, cert, key),
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KubeApi:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if content is not None else {}
        return self._http.request(method, path, content=content, headers=headers, params=params)

    def _json(self, what: str, resp: httpx.Response, ok: tuple[int, ...] = (200, 201)) -> Any:
        if resp.status_code not in ok:
            raise ApiError(what, resp.status_code, resp.text)
        return resp.json() if resp.content else None

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return self._json(f"GET {path}", self.request("GET", path, params=params))

    def list(self, kind: str, namespace: str | None = None, **params: str) -> list[dict[str, Any]]:
        data = self.get(collection_path(kind, namespace), params=params or None)
        items: list[dict[str, Any]] = data.get("items", [])
        return items

    def create(self, obj: Mapping[str, Any]) -> Any:
        kind, ns = str(obj["kind"]), obj["metadata"].get("namespace")
        path = collection_path(kind, ns)
        return self._json(f"create {kind} {obj['metadata']['name']}", self.request("POST", path, obj))

    def apply(self, obj: Mapping[str, Any]) -> Any:
        """Server-side apply; conflicts with other managers are forced (the sandbox owns these)."""
        kind, meta = str(obj["kind"]), obj["metadata"]
        path = object_path(kind, meta["name"], meta.get("namespace"))
        resp = self.request(
            "PATCH", path, obj, APPLY, params={"fieldManager": FIELD_MANAGER, "force": "true"}
        )
        return self._json(f"apply {kind} {meta['name']}", resp)

    def delete(
        self, kind: str, name: str, namespace: str | None = None, propagation: str | None = None
    ) -> None:
        """`propagation` (Foreground, Background, Orphan) goes in the query: a Job deleted without
        it orphans its pods (batch/v1's default policy is Orphan, kept for compatibility)."""
        params = {"propagationPolicy": propagation} if propagation else None
        resp = self.request("DELETE", object_path(kind, name, namespace), params=params)
        self._json(f"delete {kind} {name}", resp, ok=(200, 202, 404))

    def watch(self, path: str, params: Mapping[str, str], read_timeout_s: float) -> Iterator[dict[str, Any]]:
        """The events of a watch (`?watch=1`), one JSON object per line, until the server ends it
        (`timeoutSeconds` in `params`) or the connection is read-idle for `read_timeout_s`."""
        timeout = httpx.Timeout(10.0, read=read_timeout_s)
        with self._http.stream("GET", path, params={**params, "watch": "1"}, timeout=timeout) as resp:
            if resp.status_code != 200:
                resp.read()
                raise ApiError(f"watch {path}", resp.status_code, resp.text)
            for line in resp.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def token(self, namespace: str, service_account: str, seconds: int,
              bound_to: Mapping[str, Any] | None = None) -> tuple[str, str]:
        """A ServiceAccount token from the TokenRequest API: (token, expirationTimestamp).
        `bound_to`: a Pod, Node or Secret as the API returned it; the token is valid only while that
        object exists, and a Pod's or a Node's carries the node's name (and the Pod's) into the
        requester's extra fields, as the kubelet's projected tokens do."""
        path = f"{object_path('ServiceAccount', service_account, namespace)}/token"
        spec: dict[str, Any] = {"expirationSeconds": seconds}
        if bound_to is not None:
            meta = bound_to["metadata"]
            spec["boundObjectRef"] = {"apiVersion": bound_to.get("apiVersion", "v1"),
                                      "kind": bound_to["kind"], "name": meta["name"], "uid": meta["uid"]}
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        data = self._json(f"TokenRequest for {namespace}/{service_account}", self.request("POST", path, body))
        return str(data["status"]["token"]), str(data["status"]["expirationTimestamp"])
