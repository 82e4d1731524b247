// Command pulumi-resource-kubernetes is the Kubernetes provider of Pulumi, served by the pinned
// module github.com/pulumi/pulumi-kubernetes/provider/v4 (ADR 0035).
//
// Upstream's main package (cmd/pulumi-resource-kubernetes) embeds two files that its own
// `go generate` step writes and that are not in the module archive, so it cannot be built as a
// dependency. This package is the same program: tools/kube/build.py runs that module's generator
// (generate.go, with VERSION set to the release) in a staging folder and hands the two files it
// writes to `go build -overlay`; they are never written into this folder.
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema-embed.json
var pulumiSchema []byte

//go:embed terraform-mapping-embed.json
var terraformMapping []byte

func main() {
	provider.Serve("kubernetes", version.Version, pulumiSchema, terraformMapping)
}
