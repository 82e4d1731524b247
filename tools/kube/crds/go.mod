// The operators' Go API modules, from which controller-gen generates the CRDs the sandbox's API
// server needs. Nothing imports them: go.mod names each at its pinned version and go.sum holds the
// hash of each module archive (and, inside it, the module's own go.sum pins its dependencies).
// ../build.py downloads each module with `go mod download` here (checked against go.sum) and runs
// controller-gen over Go source in the module's own directory, so each module resolves with its own
// go.mod (Rook's API module resolves only with its own replace and exclude lines).
//
// Do not run `go mod tidy` here: with nothing importing them it would drop every line below.
// The versions live in ../versions.toml; build.py checks that this file agrees with it.
module gpufleet.local/tools/kube/crds

go 1.26.0

require (
	github.com/NVIDIA/gpu-operator v0.0.0-20250917190837-d73a0086a6ba
	github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring v0.82.2
	github.com/rook/rook/pkg/apis v0.0.0-20241216163035-3170ac6a0c58
	sigs.k8s.io/kueue v0.12.3
	volcano.sh/apis v1.12.1
)
