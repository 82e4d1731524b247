# List the Pulumi packages installed in this Python environment, for the language host's
# GetRequiredPackages (main.go runs `python -c <this file>`; ADR 0035).
#
# A Pulumi provider SDK ships a pulumi-plugin.json next to its code, saying which plugin it needs
# ({"resource": true, "name": "kubernetes", "version": "4.25.0", ...}). Prints one JSON list of
# {"package", "package_version", "plugin"}; the host turns each into a package dependency.
from __future__ import annotations

import json
import sys
from importlib import metadata

found = []
for dist in metadata.distributions():
    for file in dist.files or ():
        if file.name != "pulumi-plugin.json":
            continue
        try:
            plugin = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            print(f"{dist.metadata['Name']}: unreadable {file}: {exc}", file=sys.stderr)
            continue
        if isinstance(plugin, dict):
            name = dist.metadata["Name"]
            found.append({"package": name, "package_version": dist.version, "plugin": plugin})
json.dump(found, sys.stdout)
