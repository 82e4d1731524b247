"""The invariants of a gpufleet platform, as plain functions over a resource's type and inputs.

Each function returns the violations it finds (an empty list when the resource is fine), so it is
tested directly with fake inputs and wrapped into pulumi-policy policies by `__main__.py` for real
`pulumi preview --policy-pack policypack` runs. The same invariants are asserted on the program's
output by tests/unit/infra under Pulumi's mock runtime.

Self-contained: it imports only the standard library (and pulumi-policy in __main__.py), so the
pack installs from its own requirements.txt without the gpufleet package. The two tables it shares
with gpufleet (vendor node labels, RBAC rule matching) are checked against gpufleet's own by the
unit tests.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

RELEASE_TYPES = ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart")
NIC_POLICY_TYPE = "kubernetes:mellanox.com/v1alpha1:NicClusterPolicy"
NODE_PATCH_TYPE = "kubernetes:core/v1:NodePatch"
KARPENTER_POOL_TYPE = "kubernetes:karpenter.sh/v1:NodePool"
CONFIG_MAP_TYPE = "kubernetes:core/v1:ConfigMap"
ROLE_TYPES = (
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",
    "kubernetes:rbac.authorization.k8s.io/v1:Role",
)
STORAGE_CLASS_TYPE = "kubernetes:storage.k8s.io/v1:StorageClass"
GAMEDAY_ROLE = "gpufleet-gameday"

# A version that floats: empty, a wildcard, a range, or a moving tag.
_FLOATING = re.compile(r"^$|[*^~<>=| x]|latest|\.x(\.|$)", re.IGNORECASE)
WORKLOAD_TYPES = (
    "kubernetes:apps/v1:DaemonSet",
    "kubernetes:apps/v1:Deployment",
    "kubernetes:apps/v1:StatefulSet",
    "kubernetes:batch/v1:CronJob",
    "kubernetes:batch/v1:Job",
    "kubernetes:core/v1:PodTemplate",
)

# Key names (lower case, separators dropped) whose values are credentials: JuiceFS Secret keys,
# chart values (grafana adminPassword), S3 (secret_key, secretAccessKey), Alertmanager receivers
# (PagerDuty routing_key/service_key, Slack/webhook URLs, OpsGenie api_key).
_CREDENTIAL_SUFFIXES = (
    "password",
    "passwd",
    "secretkey",
    "secretaccesskey",
    "accesskey",
    "accesskeyid",
    "token",
    "apikey",
    "routingkey",
    "servicekey",
    "integrationkey",
    "clientsecret",
    "privatekey",
    "metaurl",
    "webhookurl",
    "credentials",
)
_CREDENTIAL_EXACT = ("secret",)
# Names that point at a credential rather than hold one (grafana admin.existingSecret, ...Ref).
_REFERENCE_SUFFIXES = ("existingsecret", "secretname", "secretref", "keyref", "file", "path")

# Values that are credentials whatever their key: key-shaped strings and webhook URLs.
_CREDENTIAL_VALUE = re.compile(
    r"(AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key id
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\bgh[pousr]_[A-Za-z0-9]{36}"  # GitHub token
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"  # Slack token
    r"|hooks\.slack\.com/services/|discord(?:app)?\.com/api/webhooks/|\.webhook\.office\.com/"
    r"|\bsk_live_[A-Za-z0-9]{16,}"
)
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"']+")


def credential_name(key: str) -> bool:
    norm = re.sub(r"[^a-z0-9]", "", key.lower())
    if norm.endswith(_REFERENCE_SUFFIXES):
        return False
    return norm in _CREDENTIAL_EXACT or norm.endswith(_CREDENTIAL_SUFFIXES)


def credential_value(value: str) -> str | None:
    """Why a string value is a credential (a password inside a URL, a key-shaped string, a
    webhook URL), or None."""
    for url in _URL.findall(value):
        try:
            if urlsplit(url).password:
                return "a URL with a password"
        except ValueError:
            continue
    m = _CREDENTIAL_VALUE.search(value)
    return f"a credential-shaped value ({m.group(0)[:12]}...)" if m else None


def rules_allow(rules: list[dict[str, Any]], verb: str, resource: str, group: str = "") -> bool:
    """Whether RBAC rules grant `verb` on `resource` (wildcards included), as the API server
    evaluates a PolicyRule (the same decision as gpufleet.infra.gameday.rules_allow)."""
    for r in rules:
        groups, resources, verbs = r.get("apiGroups", []), r.get("resources", []), r.get("verbs", [])
        if (
            (group in groups or "*" in groups)
            and (resource in resources or "*" in resources)
            and (verb in verbs or "*" in verbs)
        ):
            return True
    return False


# GPU vendors as node labels show them: (vendor, labels every node of it carries with these values,
# labels it carries with a model-specific value, the GPU resource). gpufleet.config.accelerators is
# the source; tests/unit/infra checks that every accelerator there satisfies this table.
GPU_VENDORS: tuple[tuple[str, dict[str, str], tuple[str, ...], str], ...] = (
    (
        "nvidia",
        {"nvidia.com/gpu.present": "true", "feature.node.kubernetes.io/pci-10de.present": "true"},
        ("nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.count"),
        "nvidia.com/gpu",
    ),
    ("amd", {"feature.node.kubernetes.io/amd-gpu": "true"}, (), "amd.com/gpu"),
    ("huawei", {"accelerator": "huawei-Ascend910"}, ("accelerator-type",), "huawei.com/Ascend910"),
)


def _dig(props: Mapping[str, Any], *path: str) -> Any:
    cur: Any = props
    for p in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(p)
    return cur


def chart_pinned(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """Every Helm release names an exact chart version."""
    if resource_type not in RELEASE_TYPES:
        return []
    version = str(props.get("version") or "")
    if _FLOATING.search(version):
        return [
            f"chart {props.get('chart')!r} has no exact version ({version or 'none'}): pin it in "
            "gpufleet/infra/charts.py"
        ]
    return []


def nic_policy_not_a_hook(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """The NicClusterPolicy is an ordinary CR: a Helm hook is deleted and recreated on upgrade,
    tearing RDMA down on every node."""
    if resource_type != NIC_POLICY_TYPE:
        return []
    annotations = _dig(props, "metadata", "annotations") or {}
    hooks = [k for k in annotations if str(k).startswith("helm.sh/hook")]
    return (
        [f"NicClusterPolicy carries Helm hook annotations {hooks}: apply it as a plain CR"] if hooks else []
    )


def _gpu_vendor_of(
    labels: Mapping[str, Any],
) -> tuple[str, dict[str, str], tuple[str, ...], str] | None:
    """The GPU_VENDORS entry whose marker label (its first fixed label) the node carries."""
    for entry in GPU_VENDORS:
        if next(iter(entry[1])) in labels:
            return entry
    return None


def gpu_node_tainted_and_labelled(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """A GPU node (a NodePatch, or the template of a Karpenter NodePool) carries its vendor's
    labels and a NoSchedule/NoExecute taint keyed by the GPU resource, so CPU pods stay off it."""
    if resource_type == NODE_PATCH_TYPE:
        labels = _dig(props, "metadata", "labels") or {}
        taints = _dig(props, "spec", "taints") or []
    elif resource_type == KARPENTER_POOL_TYPE:
        labels = _dig(props, "spec", "template", "metadata", "labels") or {}
        taints = _dig(props, "spec", "template", "spec", "taints") or []
    else:
        return []
    if "gpufleet.io/pool" not in labels:
        return []  # not a GPU pool node of ours
    found = _gpu_vendor_of(labels)
    if found is None:
        return [
            "GPU pool node has no vendor GPU labels (nvidia.com/gpu.present, "
            "feature.node.kubernetes.io/amd-gpu or accelerator)"
        ]
    vendor, expected, present, resource = found
    out = [f"{vendor} GPU node lacks label {k}={v}" for k, v in expected.items() if labels.get(k) != v]
    out += [f"{vendor} GPU node lacks label {k}" for k in present if not labels.get(k)]
    if not any(t.get("key") == resource and t.get("effect") in ("NoSchedule", "NoExecute") for t in taints):
        out.append(f"{vendor} GPU node is not tainted {resource}:NoSchedule")
    return out


def _credential_paths(value: Any, path: str = "") -> Iterable[tuple[str, str]]:
    """(path, why) of every credential in a nested value: a credential-named key with a value, an
    env entry `{name: <credential name>, value: ...}`, or a credential-shaped string anywhere."""
    if isinstance(value, Mapping):
        env_name = value.get("name") if set(value) >= {"name", "value"} else None
        if isinstance(env_name, str) and credential_name(env_name) and value.get("value"):
            yield f"{path}.value" if path else "value", f"env {env_name}"
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if credential_name(str(k)) and isinstance(v, str) and v:
                yield sub, f"key {k}"
            else:
                yield from _credential_paths(v, sub)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _credential_paths(v, f"{path}[{i}]")
    elif isinstance(value, str):
        why = credential_value(value)
        if why is not None:
            yield path or "(value)", why


def credentials_only_in_secrets(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """Credentials appear only in Secrets, never in ConfigMaps, StorageClass parameters, Helm
    values or workload environments, where anyone who can read the object (or the Helm release
    Secret's values) reads them. Both names (adminPassword, secret_key, secretAccessKey,
    routing_key, webhook_url, ...) and values (passwords inside URLs, key-shaped strings, webhook
    URLs) are checked."""
    if resource_type in (CONFIG_MAP_TYPE, STORAGE_CLASS_TYPE):
        target: Any = {"data": props.get("data"), "parameters": props.get("parameters")}
    elif resource_type in RELEASE_TYPES:
        target = props.get("values")
    elif resource_type in WORKLOAD_TYPES:
        target = {"spec": props.get("spec"), "template": props.get("template")}
    else:
        return []
    return [
        f"credential in plain text at {p} ({why}): keep it in a Secret (a stack `secure:` value)"
        for p, why in _credential_paths(target)
    ]


def gameday_role_least_privilege(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """The game-day's role can cordon/taint nodes and evict pods, and cannot read Secrets."""
    if resource_type not in ROLE_TYPES or _dig(props, "metadata", "name") != GAMEDAY_ROLE:
        return []
    rules = props.get("rules") or []
    out = [
        f"game-day role can {v} secrets" for v in ("get", "list", "watch") if rules_allow(rules, v, "secrets")
    ]
    out += [
        f"game-day role lacks {v} on {r}"
        for v, r in (("patch", "nodes"), ("create", "pods/eviction"), ("get", "pods"))
        if not rules_allow(rules, v, r)
    ]
    return out


def nccl_env_matches_fabric(resources: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Stack-wide: the collective environment ConfigMaps fit the fabric the stack installs
    (RoCE needs the GID index, InfiniBand/RoCE need the HCA list, EFA needs libfabric's provider or
    NCCL silently falls back to TCP). The fabric is read from the ConfigMap's `gpufleet.io/fabric`
    label and cross-checked with what is installed (NicClusterPolicy, EFA device plugin)."""
    nic = any(t == NIC_POLICY_TYPE for t, _ in resources)
    efa = any(t in RELEASE_TYPES and p.get("name") == "aws-efa-k8s-device-plugin" for t, p in resources)
    out = []
    for t, p in resources:
        name = str(_dig(p, "metadata", "name") or "")
        if t != CONFIG_MAP_TYPE or not name.startswith("collective-env-"):
            continue
        env = p.get("data") or {}
        fabric = (_dig(p, "metadata", "labels") or {}).get("gpufleet.io/fabric")
        if fabric not in ("infiniband", "roce", "efa"):
            out.append(f"{name}: no gpufleet.io/fabric label (infiniband|roce|efa)")
            continue
        if (fabric == "efa") != efa:
            out.append(
                f"{name}: fabric {fabric} but the EFA device plugin is {'' if efa else 'not '}installed"
            )
        if fabric in ("infiniband", "roce") and not nic and name != "collective-env-huawei":
            out.append(f"{name}: fabric {fabric} without a NicClusterPolicy")
        if name == "collective-env-huawei":
            continue  # HCCL: its own variable names
        if fabric == "efa" and env.get("FI_PROVIDER") != "efa":
            out.append(f"{name}: EFA fabric without FI_PROVIDER=efa (NCCL would fall back to TCP)")
        if fabric in ("infiniband", "roce") and not env.get("NCCL_IB_HCA"):
            out.append(f"{name}: RDMA fabric without NCCL_IB_HCA")
        if fabric == "roce" and not env.get("NCCL_IB_GID_INDEX"):
            out.append(f"{name}: RoCE fabric without NCCL_IB_GID_INDEX")
    if not nic and any(t in RELEASE_TYPES and p.get("name") == "network-operator" for t, p in resources):
        out.append("network-operator installed without a NicClusterPolicy (the chart no longer creates it)")
    return out




# --------------------------------------------------------------------------- backups as code
# What gpufleet.infra.backups declares (tests/unit/infra check the names are the program's).
CRONJOB_TYPE = "kubernetes:batch/v1:CronJob"
JOB_TYPE = "kubernetes:batch/v1:Job"
OBJECT_STORE_TYPE = "kubernetes:ceph.rook.io/v1:CephObjectStore"
BACKUP_ROLE_LABEL = "gpufleet.io/backup"
BUCKET_SETTINGS_LABEL = "gpufleet.io/bucket-settings"
BUCKET_SETTINGS_FILE = "buckets.json"
RPO_ANNOTATION = "gpufleet.io/rpo-seconds"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _bucket_settings(resource_type: str, props: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """The bucket settings document of a settings ConfigMap (None when the resource is not one)."""
    labels = _dig(props, "metadata", "labels") or {}
    if resource_type != CONFIG_MAP_TYPE or labels.get(BUCKET_SETTINGS_LABEL) != "true":
        return None, []
    text = (props.get("data") or {}).get(BUCKET_SETTINGS_FILE)
    try:
        doc = json.loads(text) if isinstance(text, str) else None
    except ValueError as e:
        return None, [f"bucket settings: {BUCKET_SETTINGS_FILE} is not JSON ({e})"]
    if not isinstance(doc, dict) or not isinstance(doc.get("buckets"), list):
        return None, [f"bucket settings: {BUCKET_SETTINGS_FILE} has no buckets list"]
    return doc, []


def backup_buckets_versioned(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """The backup bucket and the checkpoint bucket are both declared, versioned (a delete or an
    overwrite keeps the previous version, what drill 2 restores from), and their noncurrent versions
    expire after a declared number of days (at least 1) rather than piling up forever."""
    doc, out = _bucket_settings(resource_type, props)
    if doc is None:
        return out
    roles = {b.get("role") for b in doc["buckets"] if isinstance(b, dict)}
    out += [f"bucket settings declare no {r} bucket" for r in ("backup", "checkpoint") if r not in roles]
    for b in doc["buckets"]:
        name = b.get("name")
        if b.get("versioning") != "Enabled":
            out.append(f"bucket {name} ({b.get('role')}): versioning {b.get('versioning')!r}, not 'Enabled'")
        days = b.get("noncurrentVersionDays")
        if not isinstance(days, int) or isinstance(days, bool) or days < 1:
            out.append(f"bucket {name}: noncurrentVersionDays must be whole days >= 1 (got {days!r})")
    return out


def _public_statement(st: Mapping[str, Any]) -> bool:
    principal = st.get("Principal")
    everyone = principal == "*" or (
        isinstance(principal, Mapping) and any(v == "*" or v == ["*"] for v in principal.values())
    )
    return st.get("Effect") == "Allow" and everyone


def backup_buckets_private(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """No public access to the backup or checkpoint buckets: the canned ACL is `private`, and no
    bucket policy allows the principal `*`."""
    doc, out = _bucket_settings(resource_type, props)
    if doc is None:
        return out
    for b in doc["buckets"]:
        name = b.get("name")
        if b.get("acl") != "private":
            out.append(f"bucket {name}: ACL {b.get('acl')!r} is not 'private'")
        policy = b.get("policy") or {}
        for st in policy.get("Statement") or []:
            if isinstance(st, Mapping) and _public_statement(st):
                out.append(f"bucket {name}: its policy allows everyone ({st.get('Action')})")
        for k in b.get("keysFrom") or []:
            if not isinstance(k, str) or not _ENV_NAME.match(k) or credential_value(k):
                out.append(f"bucket {name}: keysFrom must name environment variables, not hold keys")
    return out


def _kms_configured(store: Mapping[str, Any], which: str) -> bool:
    return bool(_dig(store, "spec", "security", which, "connectionDetails"))


def backup_buckets_encrypted_where_supported(resources: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Stack-wide, honest about radosgw: bucket default encryption (SSE-S3, `AES256`) exists from Ceph
    17 (Quincy) and only with an SSE-S3 key backend, which Rook configures from the CephObjectStore's
    `security.s3` (Vault). Ceph 16 (Pacific) has no SSE-S3 and no bucket default encryption at all
    (only SSE-KMS and SSE-C, chosen per request by the client). So: where the store has such a
    backend, the buckets must be encrypted; where it cannot encrypt, declaring encryption is refused
    (it would be a setting radosgw rejects or ignores, not encryption)."""
    sse_s3 = any(t == OBJECT_STORE_TYPE and _kms_configured(p, "s3") for t, p in resources)
    out = []
    for t, p in resources:
        doc, errs = _bucket_settings(t, p)
        out += errs
        if doc is None:
            continue
        backend = doc.get("backend") or {}
        major = backend.get("cephMajor")
        if backend.get("kind") != "ceph-rgw" or not isinstance(major, int):
            out.append("bucket settings: no ceph-rgw backend with its cephMajor: encryption cannot be judged")
            continue
        for b in doc["buckets"]:
            name, enc = b.get("name"), b.get("encryption")
            if enc not in ("none", "AES256"):
                out.append(f"bucket {name}: encryption {enc!r} is neither 'none' nor 'AES256' (SSE-S3)")
            elif enc == "AES256" and major < 17:
                out.append(f"bucket {name}: Ceph {major} has no SSE-S3 bucket encryption (from Ceph 17)")
            elif enc == "AES256" and not sse_s3:
                out.append(f"bucket {name}: SSE-S3 without an object store security.s3 key backend")
            elif enc == "none" and major >= 17 and sse_s3:
                out.append(f"bucket {name}: the object store has an SSE-S3 key backend: encrypt (AES256)")
    return out


def _env_entries(pod: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers"):
        for c in pod.get(kind) or []:
            for e in c.get("env") or []:
                yield str(c.get("name")), e


def backup_credentials_from_secrets(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """The backup jobs' S3 keys and JuiceFS metadata URL come from Secrets (`secretKeyRef`), never
    a literal value or a ConfigMap, and the pods do not mount an API token they do not use."""
    if resource_type != CRONJOB_TYPE:
        return []
    role = (_dig(props, "metadata", "labels") or {}).get(BACKUP_ROLE_LABEL)
    if role is None:
        return []
    pod = _dig(props, "spec", "jobTemplate", "spec", "template", "spec") or {}
    out = []
    for container, e in _env_entries(pod):
        name = str(e.get("name"))
        if not credential_name(name):
            continue
        if not _dig(e, "valueFrom", "secretKeyRef", "name"):
            out.append(f"backup {role}: {container} env {name} is not from a Secret (secretKeyRef)")
    if pod.get("automountServiceAccountToken") is not False:
        out.append(f"backup {role}: the pod mounts a service account token it never uses")
    return out


def _cron_field(text: str, lo: int, hi: int) -> set[int] | None:
    values: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text.isdigit() else (1 if not step_text else 0)
        if step < 1:
            return None
        if base == "*":
            a, b = lo, hi
        elif re.fullmatch(r"\d+-\d+", base):
            a, b = (int(x) for x in base.split("-"))
        elif base.isdigit():
            a = int(base)
            b = hi if step_text else a
        else:
            return None
        if not lo <= a <= b <= hi:
            return None
        values.update(range(a, b + 1, step))
    return values


def cron_max_gap_seconds(schedule: str) -> float | None:
    """The longest time between two runs of a cron schedule (minute hour * * day-of-week), or None
    when the schedule is not of that form (day-of-month or month restrictions: not judged)."""
    fields = schedule.split()
    if len(fields) != 5 or fields[2] != "*" or fields[3] != "*":
        return None
    minutes, hours = _cron_field(fields[0], 0, 59), _cron_field(fields[1], 0, 23)
    days = _cron_field(fields[4].replace("7", "0"), 0, 6)
    if not minutes or not hours or not days:
        return None
    runs = sorted(d * 1440 + h * 60 + m for d in days for h in hours for m in minutes)
    week = 7 * 1440
    gaps = [b - a for a, b in itertools.pairwise(runs)] + [runs[0] + week - runs[-1]]
    return max(gaps) * 60.0


def backup_interval_within_rpo(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """The metadata dump CronJob declares the stack's RPO, and its schedule never leaves a longer
    gap between two dumps than that RPO (a failure just before a dump loses a whole gap)."""
    if resource_type != CRONJOB_TYPE:
        return []
    if (_dig(props, "metadata", "labels") or {}).get(BACKUP_ROLE_LABEL) != "dump":
        return []
    schedule = str(_dig(props, "spec", "schedule") or "")
    rpo_text = (_dig(props, "metadata", "annotations") or {}).get(RPO_ANNOTATION)
    try:
        rpo = float(rpo_text) if rpo_text is not None else None
    except ValueError:
        rpo = None
    if rpo is None:
        return [f"backup dump CronJob has no numeric {RPO_ANNOTATION} annotation (the stack's dr.rpoSeconds)"]
    gap = cron_max_gap_seconds(schedule)
    if gap is None:
        return [f"backup dump schedule {schedule!r} cannot be judged against the RPO (minute hour * * dow)"]
    if gap > rpo:
        return [
            f"backup dump schedule {schedule!r} leaves up to {gap:g} s between dumps, longer than the "
            f"declared RPO of {rpo:g} s"
        ]
    return []


RESOURCE_POLICIES = {
    "chart-pinned": chart_pinned,
    "nic-cluster-policy-not-a-hook": nic_policy_not_a_hook,
    "gpu-node-tainted-and-labelled": gpu_node_tainted_and_labelled,
    "credentials-only-in-secrets": credentials_only_in_secrets,
    "gameday-role-least-privilege": gameday_role_least_privilege,
    "backup-buckets-versioned": backup_buckets_versioned,
    "backup-buckets-private": backup_buckets_private,
    "backup-credentials-from-secrets": backup_credentials_from_secrets,
    "backup-interval-within-rpo": backup_interval_within_rpo,
}
